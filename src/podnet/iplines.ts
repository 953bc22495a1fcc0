// The `ip` command lines the planner records (plan.ts), turned into rtnetlink requests that mean what iproute2
// would send for them: the record keeps the readable line, the addon runs the request (no `ip` process). Only the
// vocabulary the planner writes is known; any other line is an Internal error. Pure.
import { ErrorCode, VmpodError } from '../errors.js';
import { ipToBytes, isIpv4 } from '../net/ip.js';
import { parseIpv6 } from '../net/ipv6.js';
import { macBytes } from '../net/ipv6.js';
import {
  AF_INET,
  AF_INET6,
  IFF_MULTI_QUEUE,
  IFF_NO_PI,
  IFF_TAP,
  IFF_UP,
  IFF_VNET_HDR,
  NLM_F,
  RTM,
  cstr,
  nlMessage,
  u32,
  u8,
  type Attr,
  type NlRequest,
} from '../net/rtnl.js';

const IFLA = { ADDRESS: 1, IFNAME: 3, MTU: 4, MASTER: 10, LINKINFO: 18, AF_SPEC: 26 } as const;
const IFLA_INFO = { KIND: 1, DATA: 2 } as const;
const IFLA_BR_AGEING_TIME = 4;
const IFLA_INET6_ADDR_GEN_MODE = 8;
const ADDR_GEN_MODE: Record<string, number> = { eui64: 0, none: 1, stable_secret: 2, random: 3 };
const IFA = { ADDRESS: 1, LOCAL: 2, BROADCAST: 4 } as const;
const IFA_F_NODAD = 0x02;
const RTA = { DST: 1, OIF: 4, GATEWAY: 5, PRIORITY: 6, PREFSRC: 7 } as const;
const RT_TABLE_MAIN = 254;
const RTN_UNICAST = 1;

/**
 * iproute2's names of route protocols and scopes (/etc/iproute2/rt_protos, rt_scopes); numbers are shown as numbers.
 */
export const RT_PROTOS: Record<number, string> = {
  0: 'unspec',
  1: 'redirect',
  2: 'kernel',
  3: 'boot',
  4: 'static',
  8: 'gated',
  9: 'ra',
  10: 'mrt',
  11: 'zebra',
  12: 'bird',
  13: 'dnrouted',
  14: 'xorp',
  15: 'ntk',
  16: 'dhcp',
  18: 'keepalived',
  42: 'babel',
  99: 'openr',
  186: 'bgp',
  187: 'isis',
  188: 'ospf',
  189: 'rip',
  192: 'eigrp',
};
export const RT_SCOPES: Record<number, string> = { 0: 'global', 200: 'site', 253: 'link', 254: 'host', 255: 'nowhere' };
const byName = (table: Record<number, string>, what: string, s: string): number => {
  for (const [n, name] of Object.entries(table)) if (name === s) return Number(n);
  if (/^\d+$/.test(s) && Number(s) < 256) return Number(s);
  throw bad(`unknown ${what} ${JSON.stringify(s)}`);
};

function bad(why: string, args?: readonly string[]): VmpodError {
  return new VmpodError(ErrorCode.Internal, `ip ${args ? `${args.join(' ')}: ` : ''}${why}`);
}

function addrBytes(s: string): Buffer {
  if (isIpv4(s)) return ipToBytes(s);
  const b = parseIpv6(s);
  if (!b) throw bad(`not an IP address: ${JSON.stringify(s)}`);
  return b;
}

/** "a/p", "a" (a host) or "default" (IPv4 unless the line says otherwise). */
function prefix(s: string, v6Default = false): { family: number; bytes: Buffer; len: number } {
  if (s === 'default')
    return v6Default
      ? { family: AF_INET6, bytes: Buffer.alloc(16), len: 0 }
      : { family: AF_INET, bytes: Buffer.alloc(4), len: 0 };
  const [a, p] = s.split('/');
  const bytes = addrBytes(a ?? '');
  const len = p === undefined ? bytes.length * 8 : Number(p);
  if (!Number.isInteger(len) || len < 0 || len > bytes.length * 8)
    throw bad(`bad prefix length in ${JSON.stringify(s)}`);
  return { family: bytes.length === 4 ? AF_INET : AF_INET6, bytes, len };
}

/** Reads "key value" pairs and bare words of a line from `from` on. */
function options(
  args: readonly string[],
  from: number,
  valued: readonly string[],
  words: readonly string[],
): Map<string, string> {
  const out = new Map<string, string>();
  for (let i = from; i < args.length; i++) {
    const k = args[i]!;
    if (words.includes(k)) out.set(k, '');
    else if (valued.includes(k) && i + 1 < args.length) out.set(k, args[++i]!);
    else throw bad(`unknown or incomplete option ${JSON.stringify(k)}`, args);
  }
  return out;
}

function ifinfo(flags = 0, change = 0): Buffer {
  const b = Buffer.alloc(16);
  b.writeUInt32LE(flags, 8);
  b.writeUInt32LE(change, 12);
  return b;
}

function linkSet(args: readonly string[]): NlRequest {
  const dev = args[3]!;
  const o = options(args, 4, ['address', 'mtu', 'master', 'addrgenmode'], ['up', 'down', 'nomaster']);
  const attrs: Attr[] = [];
  if (o.has('address')) attrs.push([IFLA.ADDRESS, macBytes(o.get('address')!)]);
  if (o.has('mtu')) attrs.push([IFLA.MTU, u32(Number(o.get('mtu')))]);
  if (o.has('master')) attrs.push([IFLA.MASTER, { ifindexOf: o.get('master')! }]);
  if (o.has('nomaster')) attrs.push([IFLA.MASTER, u32(0)]);
  if (o.has('addrgenmode')) {
    const mode = ADDR_GEN_MODE[o.get('addrgenmode')!];
    if (mode === undefined) throw bad('unknown addrgenmode', args);
    attrs.push([IFLA.AF_SPEC, [[AF_INET6, [[IFLA_INET6_ADDR_GEN_MODE, u8(mode)]]]]]);
  }
  const up = o.has('up') || o.has('down');
  return nlMessage(RTM.NEWLINK, 0, ifinfo(o.has('up') ? IFF_UP : 0, up ? IFF_UP : 0), attrs, { at: 4, name: dev });
}

function linkAdd(args: readonly string[]): NlRequest {
  const o = options(args, 2, ['name', 'address', 'mtu', 'type', 'ageing_time'], []);
  if (o.get('type') !== 'bridge' || !o.has('name')) throw bad('only "link add name N ... type bridge" is known', args);
  const attrs: Attr[] = [[IFLA.IFNAME, cstr(o.get('name')!)]];
  if (o.has('address')) attrs.push([IFLA.ADDRESS, macBytes(o.get('address')!)]);
  if (o.has('mtu')) attrs.push([IFLA.MTU, u32(Number(o.get('mtu')))]);
  const data: Attr[] = o.has('ageing_time') ? [[IFLA_BR_AGEING_TIME, u32(Number(o.get('ageing_time')))]] : [];
  attrs.push([
    IFLA.LINKINFO,
    [[IFLA_INFO.KIND, cstr('bridge')], ...(data.length ? [[IFLA_INFO.DATA, data] as Attr] : [])],
  ]);
  return nlMessage(RTM.NEWLINK, NLM_F.CREATE | NLM_F.EXCL, ifinfo(), attrs);
}

function addr(args: readonly string[]): NlRequest {
  const verb = args[1];
  const p = prefix(args[2]!);
  const o = options(args, 3, ['dev', 'broadcast', 'scope'], ['nodad']);
  const dev = o.get('dev');
  if (!dev) throw bad('no dev', args);
  const fixed = Buffer.alloc(8);
  fixed[0] = p.family;
  fixed[1] = p.len;
  fixed[2] = o.has('nodad') ? IFA_F_NODAD : 0;
  // as iproute2: a scope given is sent; on add, 127/8 is host scope, the rest global (the kernel scopes IPv6 itself)
  fixed[3] = o.has('scope')
    ? byName(RT_SCOPES, 'scope', o.get('scope')!)
    : verb !== 'del' && p.family === AF_INET && p.bytes[0] === 127
      ? 254
      : 0;
  const attrs: Attr[] = [
    [IFA.LOCAL, p.bytes],
    [IFA.ADDRESS, p.bytes],
  ];
  if (o.has('broadcast')) attrs.push([IFA.BROADCAST, addrBytes(o.get('broadcast')!)]);
  const type = verb === 'del' ? RTM.DELADDR : RTM.NEWADDR;
  const flags = verb === 'add' ? NLM_F.CREATE | NLM_F.EXCL : verb === 'replace' ? NLM_F.CREATE | NLM_F.REPLACE : 0;
  return nlMessage(type, flags, fixed, attrs, { at: 4, name: dev });
}

function route(args: readonly string[]): NlRequest {
  const del = args[1] === 'del';
  const o = options(args, 3, ['via', 'dev', 'proto', 'scope', 'src', 'metric'], ['onlink']);
  const via = o.get('via');
  const dst = prefix(args[2]!, via !== undefined && !isIpv4(via));
  const fixed = Buffer.alloc(12);
  fixed[0] = dst.family;
  fixed[1] = dst.len;
  fixed[4] = RT_TABLE_MAIN;
  // iproute2's defaults: add/replace is proto boot, unicast, universe scope (link scope when there is no gateway,
  // IPv4); del matches any protocol and type, scope nowhere (any)
  fixed[5] = o.has('proto') ? byName(RT_PROTOS, 'protocol', o.get('proto')!) : del ? 0 : 3;
  fixed[6] = o.has('scope')
    ? byName(RT_SCOPES, 'scope', o.get('scope')!)
    : del
      ? 255
      : dst.family === AF_INET && !via
        ? 253
        : 0;
  fixed[7] = del ? 0 : RTN_UNICAST;
  fixed.writeUInt32LE(o.has('onlink') ? 4 : 0, 8);
  const attrs: Attr[] = [];
  if (dst.len > 0) attrs.push([RTA.DST, dst.bytes]);
  if (via) attrs.push([RTA.GATEWAY, addrBytes(via)]);
  if (o.has('dev')) attrs.push([RTA.OIF, { ifindexOf: o.get('dev')! }]);
  if (o.has('src')) attrs.push([RTA.PREFSRC, addrBytes(o.get('src')!)]);
  if (o.has('metric')) attrs.push([RTA.PRIORITY, u32(Number(o.get('metric')))]);
  return nlMessage(del ? RTM.DELROUTE : RTM.NEWROUTE, del ? 0 : NLM_F.CREATE | NLM_F.REPLACE, fixed, attrs);
}

/** The request for one recorded `ip` line (without the leading "ip"). */
export function ipRequest(args: readonly string[]): NlRequest {
  const [obj, verb] = args;
  if (obj === 'link' && verb === 'set' && args[2] === 'dev' && args.length > 4) return linkSet(args);
  if (obj === 'link' && verb === 'add') return linkAdd(args);
  if (obj === 'link' && verb === 'del' && args[2] === 'dev' && args.length === 4)
    return nlMessage(RTM.DELLINK, 0, ifinfo(), [], { at: 4, name: args[3]! });
  if (
    obj === 'tuntap' &&
    verb === 'add' &&
    args[2] === 'dev' &&
    args[4] === 'mode' &&
    args[5] === 'tap' &&
    args.length <= 8
  ) {
    const opts = args.slice(6);
    const unknown = opts.find((o) => o !== 'vnet_hdr' && o !== 'multi_queue');
    if (unknown !== undefined) throw bad(`unknown option ${JSON.stringify(unknown)}`, args);
    return {
      tap: args[3]!,
      flags:
        IFF_TAP |
        IFF_NO_PI |
        (opts.includes('vnet_hdr') ? IFF_VNET_HDR : 0) |
        (opts.includes('multi_queue') ? IFF_MULTI_QUEUE : 0),
    };
  }
  if (obj === 'addr' && (verb === 'add' || verb === 'del' || verb === 'replace') && args.length > 3) return addr(args);
  if (obj === 'route' && (verb === 'del' || verb === 'replace') && args.length > 3) return route(args);
  throw bad('not a line the planner writes', args);
}
