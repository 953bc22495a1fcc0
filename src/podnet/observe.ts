// What the kernel shows of a netns (links with their addresses, the main table's routes), read from rtnetlink dumps
// into the shape `ip -j -d` gives (types.ts): the same names, the same values. Pure.
import {
  AF_INET,
  AF_INET6,
  IFF_UP,
  NLM_F,
  RTM,
  attrString,
  dumpRequest,
  nlMessage,
  parseAttrs,
  parseMessages,
  type NlRequest,
  u32,
} from '../net/rtnl.js';
import { bytesToIp } from '../net/ip.js';
import { formatIpv6 } from '../net/ipv6.js';
import { RT_PROTOS, RT_SCOPES } from './iplines.js';
import type { Observed, ObservedAddr, ObservedLink, ObservedRoute } from './types.js';

const IFLA = {
  ADDRESS: 1,
  IFNAME: 3,
  MTU: 4,
  MASTER: 10,
  LINKINFO: 18,
  PARENT_DEV_NAME: 56,
  PARENT_DEV_BUS_NAME: 57,
} as const;
const IFA = { ADDRESS: 1, LOCAL: 2, BROADCAST: 4 } as const;
const RTA = { DST: 1, OIF: 4, GATEWAY: 5, PRIORITY: 6, PREFSRC: 7, TABLE: 15 } as const;
/** The attributes read, of each kind of message (parseAttrs keeps only these). */
const LINK_ATTRS: ReadonlySet<number> = new Set(Object.values(IFLA));
const ADDR_ATTRS: ReadonlySet<number> = new Set(Object.values(IFA));
const ROUTE_ATTRS: ReadonlySet<number> = new Set(Object.values(RTA));
const INFO_KIND: ReadonlySet<number> = new Set([1]);
const RT_TABLE_MAIN = 254;
const RTN_TYPES = [
  'unspec',
  'unicast',
  'local',
  'broadcast',
  'anycast',
  'multicast',
  'blackhole',
  'unreachable',
  'prohibit',
  'throw',
  'nat',
  'xresolve',
];
/** rtm_flags as iproute2 names them, in its order */
const ROUTE_FLAGS: [number, string][] = [
  [1, 'dead'],
  [4, 'onlink'],
  [2, 'pervasive'],
  [8, 'offload'],
  [64, 'trap'],
  [0x100, 'notify'],
  [16, 'linkdown'],
  [32, 'unresolved'],
];

/** IFLA_EXT_MASK's RTEXT_FILTER_SKIP_STATS: the links without their counters, which observe never reads. */
const IFLA_EXT_MASK = 29;
const RTEXT_FILTER_SKIP_STATS = 1 << 3;

/** The dumps observe asks for, in order: links, addresses, routes (IPv4 and IPv6). */
export const OBSERVE_REQUESTS: NlRequest[] = [
  nlMessage(RTM.GETLINK, NLM_F.DUMP, Buffer.alloc(16), [[IFLA_EXT_MASK, u32(RTEXT_FILTER_SKIP_STATS)]]),
  dumpRequest(RTM.GETADDR, 8),
  dumpRequest(RTM.GETROUTE, 12),
];

const name = (n: number, table: Record<number, string>): string => table[n] ?? String(n);
const routeFlags = (bits: number): string[] => ROUTE_FLAGS.filter(([bit]) => (bits & bit) !== 0).map(([, n]) => n);
const ipOf = (b: Buffer): string => (b.length === 4 ? bytesToIp(b) : formatIpv6(b));
const macOf = (b: Buffer): string => [...b].map((x) => x.toString(16).padStart(2, '0')).join(':');

/** The three dumps' messages (OBSERVE_REQUESTS' answers) as `ip -j -d` would show them. */
export function decodeObserved(links: Buffer, addrs: Buffer, routes: Buffer): Observed {
  const byIndex = new Map<number, ObservedLink>();
  const masters = new Map<ObservedLink, number>();
  for (const m of parseMessages(links)) {
    if (m.type !== RTM.NEWLINK || m.body.length < 16) continue;
    const a = parseAttrs(m.body, 16, LINK_ATTRS);
    const link: ObservedLink = {
      name: attrString(a.get(IFLA.IFNAME)) ?? '',
      index: m.body.readInt32LE(4),
      mac: a.has(IFLA.ADDRESS) ? macOf(a.get(IFLA.ADDRESS)!) : '',
      mtu: a.get(IFLA.MTU)?.readUInt32LE(0) ?? 0,
      up: (m.body.readUInt32LE(8) & IFF_UP) !== 0,
      addrs4: [],
    };
    const info = a.get(IFLA.LINKINFO);
    const kind = info && attrString(parseAttrs(info, 0, INFO_KIND).get(1));
    if (kind) link.kind = kind;
    const master = a.get(IFLA.MASTER)?.readUInt32LE(0);
    if (master) masters.set(link, master);
    const bus = attrString(a.get(IFLA.PARENT_DEV_BUS_NAME));
    const dev = attrString(a.get(IFLA.PARENT_DEV_NAME));
    if (bus) link.parentBus = bus;
    if (dev) link.parentDev = dev;
    byIndex.set(link.index, link);
  }
  for (const [link, idx] of masters) {
    const m = byIndex.get(idx);
    if (m) link.master = m.name;
  }
  for (const m of parseMessages(addrs)) {
    if (m.type !== RTM.NEWADDR || m.body.length < 8) continue;
    const link = byIndex.get(m.body.readUInt32LE(4));
    const a = parseAttrs(m.body, 8, ADDR_ATTRS);
    const local = a.get(IFA.LOCAL) ?? a.get(IFA.ADDRESS);
    if (!link || !local) continue;
    const scope = name(m.body[3]!, RT_SCOPES);
    const addr: ObservedAddr = { local: ipOf(local), prefixlen: m.body[1]! };
    if (m.body[0] === AF_INET) {
      if (a.has(IFA.BROADCAST)) addr.broadcast = ipOf(a.get(IFA.BROADCAST)!);
      link.addrs4.push({ ...addr, scope });
    } else if (m.body[0] === AF_INET6 && (scope === 'global' || scope === 'link')) {
      const list = scope === 'global' ? (link.addrs6 ??= []) : (link.linkLocal6 ??= []);
      list.push({ ...addr, scope });
    }
  }
  const routes4: ObservedRoute[] = [];
  const routes6: ObservedRoute[] = [];
  for (const m of parseMessages(routes)) {
    if (m.type !== RTM.NEWROUTE || m.body.length < 12) continue;
    const b = m.body;
    const a = parseAttrs(b, 12, ROUTE_ATTRS);
    if ((a.get(RTA.TABLE)?.readUInt32LE(0) ?? b[4]) !== RT_TABLE_MAIN) continue;
    const dstLen = b[1]!;
    const dst = a.get(RTA.DST);
    const r: ObservedRoute = {
      type: name(b[7]!, RTN_TYPES),
      dst: dstLen === 0 || !dst ? 'default' : dstLen === dst.length * 8 ? ipOf(dst) : `${ipOf(dst)}/${dstLen}`,
      flags: routeFlags(b.readUInt32LE(8)),
    };
    if (a.has(RTA.GATEWAY)) r.gateway = ipOf(a.get(RTA.GATEWAY)!);
    const oif = a.get(RTA.OIF)?.readUInt32LE(0);
    const dev = oif === undefined ? undefined : byIndex.get(oif)?.name;
    if (dev) r.dev = dev;
    r.protocol = name(b[5]!, RT_PROTOS);
    r.scope = name(b[6]!, RT_SCOPES);
    if (a.has(RTA.PREFSRC)) r.prefsrc = ipOf(a.get(RTA.PREFSRC)!);
    if (a.has(RTA.PRIORITY)) r.metric = a.get(RTA.PRIORITY)!.readUInt32LE(0);
    if (b[0] === AF_INET) routes4.push(r);
    else if (b[0] === AF_INET6) routes6.push(r);
  }
  return { links: [...byIndex.values()], routes4, routes6 };
}
