// DHCP option building (pure): a DhcpLease plus the server id in, validated option list out.
// buildOptions() is called before the server's socket exists, so a bad lease (a search domain label over 63
// bytes, an MTU below 68, a non-IPv4 DNS server...) fails with every problem listed before anything starts
// (KubeVirt's prepareDHCPOptions does the same).
import { ErrorCode, VmpodError } from '../errors.js';
import { inSubnet4, ipToBytes, isIpv4, parseCidr, prefixToMask } from '../net/ip.js';
import { unpooled } from '../buffers.js';
import { domainNameProblems } from '../net/dns.js';
import { clientMaxMessage, type DhcpOption, layoutOptions, normaliseMac, Opt } from './packet.js';
import type { DhcpLease } from './lease.js';

/** 0xffffffff in option 51 means "infinite" (RFC 2132 section 9.2) */
export const INFINITE_LEASE = 0xffffffff;
/** RFC 2132 section 5.1: the minimum legal MTU is 68 */
export const MIN_MTU = 68;
/** bytes kept free for each echoed client id (61: type + MAC is 7, a DUID-based one about 19; 97: 17) */
const ECHO_RESERVE = 32;
const OPTION_HINT: Record<number, string> = {
  [Opt.DomainSearch]: ' (search domains, compressed)',
  [Opt.ClasslessRoutes]: ' (too many routes)',
  [Opt.HostName]: ' (host name)',
};

export interface Route4 {
  /** network address, host bits cleared */
  dst: string;
  prefix: number;
  /** "0.0.0.0" = on-link */
  gw: string;
}

export interface BuiltOptions {
  serverId: string;
  /** the routes that went into option 121, in wire order */
  routes: Route4[];
  /** every option of an OFFER/ACK except 53 and the echoed client ids, in our preferred order (54 first) */
  options: DhcpOption[];
}

/** Options that describe a lease: never in a DHCPACK answering DHCPINFORM (RFC 2131 section 4.3.5). */
export const LEASE_ONLY_OPTIONS: ReadonlySet<number> = new Set([Opt.LeaseTime, Opt.RenewalTime, Opt.RebindingTime]);

// ---- RFC 3442: classless static routes (option 121) ----

/**
 * Order routes for option 121: on-link routes first, then the other specific routes, the default route last,
 * otherwise keeping the given order. A client installs the routes in the order it reads them; a default route
 * whose gateway is reachable only through an on-link host route (a /32 pod address, Calico's 169.254.1.1) fails
 * with "Network is unreachable" when it comes first (KubeVirt's sortRoutes puts the default route last for this).
 */
export function sortRoutes(routes: Route4[]): Route4[] {
  const rank = (r: Route4): number => (r.prefix === 0 ? 2 : r.gw === '0.0.0.0' ? 0 : 1);
  return routes
    .map((r, i) => ({ r, i }))
    .sort((a, b) => rank(a.r) - rank(b.r) || a.i - b.i)
    .map((x) => x.r);
}

/**
 * RFC 3442 section 3: each route is the prefix length, then only the significant octets of the destination
 * (ceil(width / 8) of them), then the 4-byte router. Worked examples (the RFC's own table and ours):
 *   10.17.0.0/16 via 10.229.0.128     -> 16, 10, 17, 10, 229, 0, 128
 *   10.27.129.0/24 via 10.229.0.128   -> 24, 10, 27, 129, 10, 229, 0, 128
 *   169.254.254.2/32 on-link          -> 32, 169, 254, 254, 2, 0, 0, 0, 0
 *   0.0.0.0/0 via 10.1.0.1            -> 0, 10, 1, 0, 1
 * A router of 0.0.0.0 means "on-link, no gateway" (what dhclient, systemd-networkd, busybox and Windows do).
 */
export function encodeClasslessRoutes(routes: Route4[]): Buffer {
  return Buffer.concat(
    routes.map((r) => {
      const sig = Math.ceil(r.prefix / 8);
      return Buffer.concat([Buffer.from([r.prefix]), ipToBytes(r.dst).subarray(0, sig), ipToBytes(r.gw)]);
    }),
  );
}

/** Inverse of encodeClasslessRoutes; throws VmpodError(Protocol) on a truncated or bad width. */
export function decodeClasslessRoutes(b: Buffer): Route4[] {
  const out: Route4[] = [];
  let i = 0;
  while (i < b.length) {
    const prefix = b[i];
    const sig = Math.ceil(prefix / 8);
    if (prefix > 32 || i + 1 + sig + 4 > b.length) {
      throw new VmpodError(ErrorCode.Protocol, `option 121: bad route at offset ${i} (width ${prefix})`);
    }
    const dst = Buffer.alloc(4);
    b.copy(dst, 0, i + 1, i + 1 + sig);
    out.push({ dst: [...dst].join('.'), prefix, gw: [...b.subarray(i + 1 + sig, i + 5 + sig)].join('.') });
    i += 5 + sig;
  }
  return out;
}

// ---- RFC 3397 / RFC 1035: domain search (option 119) ----

/**
 * RFC 3397 section 2: the search list is a sequence of RFC 1035 names, each a sequence of <length><label>
 * terminated by a zero byte, or ending in a compression pointer (two bytes, top bits 11, offset from the start
 * of the option data). "eng.apple.com", "marketing.apple.com" encode as
 *   3 e n g 5 a p p l e 3 c o m 0   9 m a r k e t i n g 0xC0 0x04
 * where 0xC0 0x04 points at "apple.com" at offset 4. Compression keeps Kubernetes' search lists (which repeat
 * "svc.cluster.local") small; lists still over 255 bytes
 * would need RFC 3396 splitting, which busybox udhcpc does not read: buildOptions refuses them.
 * Call domainNameProblems first: this function assumes valid names.
 */
export function encodeDomainSearch(names: string[]): Buffer {
  const parts: Buffer[] = [];
  const seen = new Map<string, number>();
  let off = 0;
  for (const name of names) {
    const labels = (name.endsWith('.') ? name.slice(0, -1) : name).split('.');
    let pointer: number | undefined;
    for (let i = 0; i < labels.length; i++) {
      const suffix = labels.slice(i).join('.').toLowerCase();
      pointer = seen.get(suffix);
      if (pointer !== undefined) break;
      if (off <= 0x3fff) seen.set(suffix, off);
      const l = Buffer.from(labels[i], 'ascii');
      parts.push(Buffer.from([l.length]), l);
      off += 1 + l.length;
    }
    const tail = pointer === undefined ? Buffer.from([0]) : Buffer.from([0xc0 | (pointer >> 8), pointer & 0xff]);
    parts.push(tail);
    off += tail.length;
  }
  return Buffer.concat(parts);
}

/** Inverse of encodeDomainSearch (follows pointers, refuses loops and overruns with VmpodError(Protocol)). */
export function decodeDomainSearch(b: Buffer): string[] {
  const bad = (why: string) => new VmpodError(ErrorCode.Protocol, `option 119: ${why}`);
  const readName = (start: number): { name: string; next: number } => {
    const labels: string[] = [];
    let i = start;
    let next = -1;
    for (let hops = 0; ; hops++) {
      if (hops > 255 || i >= b.length) throw bad(`name at offset ${start} runs past the data or loops`);
      const len = b[i];
      if (len === 0) {
        if (next < 0) next = i + 1;
        break;
      }
      if ((len & 0xc0) === 0xc0) {
        if (i + 1 >= b.length) throw bad(`truncated pointer at offset ${i}`);
        if (next < 0) next = i + 2;
        i = ((len & 0x3f) << 8) | b[i + 1];
        continue;
      }
      if (len > 63 || i + 1 + len > b.length) throw bad(`bad label length ${len} at offset ${i}`);
      labels.push(b.subarray(i + 1, i + 1 + len).toString('ascii'));
      i += 1 + len;
    }
    return { name: labels.join('.'), next };
  };
  const out: string[] = [];
  for (let i = 0; i < b.length; ) {
    const { name, next } = readName(i);
    out.push(name);
    i = next;
  }
  return out;
}

// ---- the option set ----

function u32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n >>> 0, 0);
  return b;
}

function u16(n: number): Buffer {
  const b = Buffer.alloc(2);
  b.writeUInt16BE(n, 0);
  return b;
}

function ips(list: string[]): Buffer {
  return Buffer.concat(list.map(ipToBytes));
}

const HOSTNAME = /^[A-Za-z0-9._-]{1,255}$/;

function intIn(n: number | undefined, lo: number, hi: number): boolean {
  return n !== undefined && Number.isInteger(n) && n >= lo && n <= hi;
}

/** Every problem of a lease, each naming the bad value; empty when it is fine. */
export function leaseProblems(lease: DhcpLease, serverId: string): string[] {
  const p: string[] = [];
  const checkIp = (v: string | undefined, what: string) => {
    if (v !== undefined && !isIpv4(v)) p.push(`${what} ${JSON.stringify(v)} is not an IPv4 address`);
  };
  checkIp(serverId, 'server id');
  try {
    normaliseMac(lease.mac);
  } catch {
    p.push(`MAC ${JSON.stringify(lease.mac)} is not colon-hex`);
  }
  checkIp(lease.ip, 'address');
  if (lease.ip === '0.0.0.0') p.push('address 0.0.0.0 cannot be leased');
  if (!intIn(lease.prefixLength, 1, 32)) p.push(`prefix length ${lease.prefixLength} is not 1..32`);
  checkIp(lease.gateway, 'gateway');
  for (const r of lease.routes) {
    try {
      parseCidr(r.dst);
    } catch {
      p.push(`route destination ${JSON.stringify(r.dst)} is not an IPv4 CIDR`);
    }
    checkIp(r.gw, `route ${r.dst} gateway`);
  }
  for (const d of lease.dns) checkIp(d, 'DNS server');
  if (lease.dns.length > 63) p.push(`${lease.dns.length} DNS servers do not fit in option 6`);
  for (const s of lease.search) p.push(...domainNameProblems(s, 'search domain'));
  if (lease.domain !== undefined) p.push(...domainNameProblems(lease.domain, 'domain name'));
  if (lease.hostname !== undefined && !HOSTNAME.test(lease.hostname)) {
    p.push(`host name ${JSON.stringify(lease.hostname)} is not 1..255 of [A-Za-z0-9._-]`);
  }
  if (lease.mtu !== undefined && !intIn(lease.mtu, MIN_MTU, 65535)) p.push(`MTU ${lease.mtu} is not ${MIN_MTU}..65535`);
  if (!intIn(lease.leaseSeconds, 1, INFINITE_LEASE))
    p.push(`lease time ${lease.leaseSeconds} is not 1..${INFINITE_LEASE} seconds`);
  return p;
}

/**
 * The routes for option 121 and the router for option 3.
 * - The server id gets an on-link /32 so the guest can unicast renewals to the bridge (server.ts explains why).
 * - A gateway outside the leased subnet gets an on-link /32 too, or the route through it cannot be installed.
 * - RFC 3442 section 2: a client that supports 121 ignores option 3, so when there is a router the default route
 *   goes into 121 as well (the RFC asks servers to send both). The router is the gateway of the lease's default
 *   route, else the lease's gateway; when the lease has a gateway but no default route the default route goes via
 *   the gateway, as option 3 tells non-121 clients (and as Virtlet did).
 */
export function planRoutes(lease: DhcpLease, serverId: string): { routes: Route4[]; router?: string } {
  const subnet = parseCidr(`${lease.ip}/${lease.prefixLength}`);
  const given: Route4[] = lease.routes.map((r) => ({ ...parseCidr(r.dst), gw: r.gw ?? '0.0.0.0' }));
  const defaults = given.filter((r) => r.prefix === 0);
  const router = defaults.find((r) => r.gw !== '0.0.0.0')?.gw ?? lease.gateway;
  if (defaults.length === 0 && router !== undefined) given.push({ dst: '0.0.0.0', prefix: 0, gw: router });

  const all: Route4[] = [{ dst: serverId, prefix: 32, gw: '0.0.0.0' }];
  const gws = [...given.map((r) => r.gw), ...(router ? [router] : [])];
  for (const gw of gws) {
    if (gw !== '0.0.0.0' && !inSubnet4(gw, `${subnet.dst}/${subnet.prefix}`))
      all.push({ dst: gw, prefix: 32, gw: '0.0.0.0' });
  }
  all.push(...given);
  const seen = new Set<string>();
  const unique = all.filter((r) => {
    const k = `${r.dst}/${r.prefix}`;
    if (seen.has(k)) return false;
    seen.add(k);
    return true;
  });
  return { routes: sortRoutes(unique), ...(router !== undefined ? { router } : {}) };
}

/**
 * The options of an OFFER/ACK for this lease, validated. Throws VmpodError(Config) listing every problem.
 * Order: 54, 1, 3, 121, 6, 15, 119, 12, 26, 51, 58, 59 (the server re-orders by the client's option 55).
 */
export function buildOptions(lease: DhcpLease, serverId: string): BuiltOptions {
  const problems = leaseProblems(lease, serverId);
  if (problems.length > 0) {
    throw new VmpodError(
      ErrorCode.Config,
      `bad DHCP lease for ${lease.mac} (${lease.ip}/${lease.prefixLength}): ${problems.join('; ')}`,
      {
        op: 'dhcp build options',
      },
    );
  }
  const { routes, router } = planRoutes(lease, serverId);
  const o: DhcpOption[] = [
    { code: Opt.ServerId, data: ipToBytes(serverId) },
    { code: Opt.SubnetMask, data: u32(prefixToMask(lease.prefixLength)) },
  ];
  if (router !== undefined) o.push({ code: Opt.Router, data: ipToBytes(router) });
  o.push({ code: Opt.ClasslessRoutes, data: encodeClasslessRoutes(routes) });
  if (lease.dns.length > 0) o.push({ code: Opt.DnsServers, data: ips(lease.dns) });
  if (lease.domain !== undefined)
    o.push({ code: Opt.DomainName, data: Buffer.from(lease.domain.replace(/\.$/, ''), 'ascii') });
  if (lease.search.length > 0) o.push({ code: Opt.DomainSearch, data: encodeDomainSearch(lease.search) });
  if (lease.hostname !== undefined) o.push({ code: Opt.HostName, data: Buffer.from(lease.hostname, 'ascii') });
  if (lease.mtu !== undefined) o.push({ code: Opt.InterfaceMtu, data: u16(lease.mtu) });
  o.push({ code: Opt.LeaseTime, data: u32(lease.leaseSeconds) });
  if (lease.leaseSeconds !== INFINITE_LEASE) {
    // RFC 2131 section 4.4.5: T1 defaults to 0.5 and T2 to 0.875 of the lease time
    o.push({ code: Opt.RenewalTime, data: u32(Math.floor(lease.leaseSeconds * 0.5)) });
    o.push({ code: Opt.RebindingTime, data: u32(Math.floor(lease.leaseSeconds * 0.875)) });
  }
  // RFC 3396 would allow splitting a longer option, but clients that do not implement it (busybox udhcpc among
  // them) read only the first instance: every option must fit in one, at most 255 bytes.
  const tooLong = o
    .filter((x) => x.data.length > 255)
    .map((x) => `option ${x.code} needs ${x.data.length} bytes, at most 255${OPTION_HINT[x.code] ?? ''}`);
  if (tooLong.length > 0) {
    throw new VmpodError(ErrorCode.Config, `bad DHCP lease for ${lease.mac}: ${tooLong.join('; ')}`, {
      op: 'dhcp build options',
    });
  }
  // Every client accepts a 576-byte datagram (RFC 2131 section 2); with option 53 and room to echo a client id
  // (61) and machine id (97) the reply must fit that, using file and sname (option 52) if need be.
  const reserve: DhcpOption[] = [
    { code: Opt.MessageType, data: Buffer.alloc(1) },
    { code: Opt.ClientId, data: Buffer.alloc(ECHO_RESERVE) },
    { code: Opt.ClientMachineId, data: Buffer.alloc(ECHO_RESERVE) },
  ];
  try {
    layoutOptions([...reserve, ...o], clientMaxMessage(undefined));
  } catch (e) {
    throw new VmpodError(
      ErrorCode.Config,
      `DHCP reply for ${lease.mac} does not fit a 576-byte datagram: too many routes, DNS servers or search domains`,
      {
        op: 'dhcp build options',
        cause: e,
      },
    );
  }
  // a server keeps these for its pod's life: out of the shared pool (buffers.ts)
  const data = unpooled(o.map((x) => x.data));
  return { serverId, routes, options: o.map((x, i) => ({ code: x.code, data: data[i]! })) };
}

/**
 * Loosely honour the client's parameter request list (option 55, RFC 2132 section 9.8): the options it asked
 * for come first in its order, then everything else we have (clients ignore what they do not know).
 * 53 and 54 stay in front.
 */
export function orderByRequest(options: DhcpOption[], prl: Buffer | undefined): DhcpOption[] {
  if (!prl || prl.length === 0) return options;
  const pos = (code: number): number => {
    if (code === Opt.MessageType) return -2;
    if (code === Opt.ServerId) return -1;
    const i = prl.indexOf(code);
    return i < 0 ? 1000 : i;
  };
  return options
    .map((x, i) => ({ x, i }))
    .sort((a, b) => pos(a.x.code) - pos(b.x.code) || a.i - b.i)
    .map((e) => e.x);
}
