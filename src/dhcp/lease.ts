// What one guest NIC should see, computed once per pod from the CNI result (pure): its IPv4 lease (DhcpLease,
// rendered by the DHCPv4 server) and its IPv6 lease (Lease6, rendered by the DHCPv6 server and the RA sender),
// with the facts both share (DNS, search list, hostname, MTU, lease time) decided here, once.
import type { CniDns, CniResult } from '../cni/types.js';
import { ErrorCode, VmpodError } from '../errors.js';
import { formatIpv6, inSubnet6, isLinkLocal6, networkOf, normaliseIpv6, parseCidr6, parseIpv6 } from '../net/ipv6.js';
import { inSubnet4, isCidr4, isIpv4, parseCidr } from '../net/ip.js';
import { normaliseMac } from './packet.js';

export interface DhcpLease {
  /** the guest NIC's MAC, lower-case colon-hex */
  mac: string;
  ip: string;
  prefixLength: number;
  gateway?: string;
  /** IPv4 routes; gw absent = on-link */
  routes: { dst: string /* CIDR */; gw?: string }[];
  dns: string[];
  search: string[];
  domain?: string;
  hostname?: string;
  mtu?: number;
  /** default 86400 */
  leaseSeconds: number;
}

/** The IPv6 side of a guest NIC: the address by DHCPv6 (IA_NA), the on-link prefix and the router by RA. */
export interface Lease6 {
  /** the guest NIC's MAC, lower-case colon-hex */
  mac: string;
  /** canonical text */
  ip: string;
  /** the on-link prefix length (at most 64) and its network address */
  prefixLength: number;
  prefix: string;
  /** the CNI result's IPv6 gateway (where the pod netns forwards the guest's off-link traffic) */
  gateway?: string;
  /** the result has an IPv6 default route: RAs carry a router lifetime */
  defaultRoute: boolean;
  /** the IPv6 routes of the result for this interface (gw absent = on-link) */
  routes: { dst: string; gw?: string }[];
  /** IPv6 name servers (DHCPv6 option 23, RDNSS) */
  dns: string[];
  /** search list (DHCPv6 option 24, DNSSL) */
  search: string[];
  hostname?: string;
  mtu?: number;
  /** valid and preferred lifetime of the address (T1 = 1/2, T2 = 4/5 of it) */
  leaseSeconds: number;
}

/** Everything one guest NIC is served; at least one of the two families. */
export interface GuestNic {
  v4?: DhcpLease;
  v6?: Lease6;
}

export const DEFAULT_LEASE_SECONDS = 86400;

export interface GuestFromCniOptions {
  result: CniResult;
  ifIndex: number;
  podDns?: CniDns | null;
  podName?: string;
  mtu?: number;
  mac: string;
  defaultDns?: readonly string[];
  leaseSeconds?: number;
}

function configError(msg: string): VmpodError {
  return new VmpodError(ErrorCode.Config, msg, { op: 'lease from CNI result' });
}

/**
 * What CNI interface `ifIndex` serves its guest NIC:
 * - IPv4 (`v4`): the first IPv4 entry of result.ips whose `interface` is ifIndex (an entry without `interface`, as
 *   old 0.2.0 and some 0.3.x results have, belongs to interface 0, or to ifIndex when the result has one
 *   interface); routes: the IPv4 routes of the result; a route without gw goes via the entry's gateway (CNI spec:
 *   "if omitted, a default gateway is assumed"), else on-link. With several interfaces a route belongs to the
 *   interface whose subnet holds its gateway; routes whose gateway is in no leased subnet go to the first interface
 *   with IPv4; DNS: IPv4 name servers, else the operator's `defaultDns` (--default-dns), else no DNS option at all
 *   (Virtlet served a public resolver, 8.8.8.8: wrong in an air-gapped cluster);
 * - IPv6 (`v6`): the interface's IPv6 entry, which must be one, global (not link-local), with a prefix of /64 or
 *   shorter (the on-link prefix RAs announce; a /128 has none), its gateway and the routes' gateways on-link (in
 *   the prefix, or link-local); DNS: the IPv6 name servers (none is none: there is no IPv6 fallback);
 * - both: DNS from the pod's DNS config when it names nameservers or search domains, else the CNI result's;
 *   hostname = the pod name; mtu = opts.mtu, else the CNI interface's.
 * Throws VmpodError(Config) naming the field when the result cannot be served, or has neither family.
 */
export function guestFromCni(opts: GuestFromCniOptions): GuestNic {
  const { result, ifIndex } = opts;
  const iface = result.interfaces[ifIndex];
  const ifName = iface ? `${ifIndex} (${iface.name})` : `${ifIndex}`;
  const onlyOne = result.interfaces.length <= 1;
  const owner = (ip: { interface?: number }): number | undefined => ip.interface ?? (onlyOne ? ifIndex : 0);
  const pod = opts.podDns;
  const dnsSrc = pod && ((pod.nameservers?.length ?? 0) > 0 || (pod.search?.length ?? 0) > 0) ? pod : result.dns;
  const mtu = opts.mtu ?? iface?.mtu;
  const mac = normaliseMac(opts.mac);
  const leaseSeconds = opts.leaseSeconds ?? DEFAULT_LEASE_SECONDS;
  const search = [...(dnsSrc.search ?? [])];
  const v4 = v4Lease(opts, owner, dnsSrc, { mac, mtu, search, leaseSeconds });
  const v6 = v6Lease(opts, owner, dnsSrc, { mac, mtu, search, leaseSeconds }, ifName);
  if (!v4 && !v6) {
    const have = result.ips.map((ip) => `${ip.address}@${ip.interface ?? '-'}`).join(', ') || 'none';
    throw configError(`CNI result has no IPv4 address for interface ${ifName} and no IPv6 one (ips: ${have})`);
  }
  return { ...(v4 ? { v4 } : {}), ...(v6 ? { v6 } : {}) };
}

interface Shared {
  mac: string;
  mtu: number | undefined;
  search: string[];
  leaseSeconds: number;
}

function v4Lease(
  opts: GuestFromCniOptions,
  owner: (ip: { interface?: number }) => number | undefined,
  dnsSrc: CniDns,
  sh: Shared,
): DhcpLease | undefined {
  const { result, ifIndex } = opts;
  const v4 = result.ips.filter((ip) => isCidr4(ip.address));
  const mine = v4.find((ip) => owner(ip) === ifIndex);
  if (!mine) return undefined;
  const [ip, len] = mine.address.split('/');
  const prefixLength = Number(len);
  const gateway = mine.gateway !== undefined && isIpv4(mine.gateway) ? mine.gateway : undefined;

  const subnets = v4.map((e) => ({ owner: owner(e), ...parseCidr(e.address) }));
  const primary = subnets[0]?.owner;
  const routes: DhcpLease['routes'] = [];
  for (const r of result.routes) {
    if (!isCidr4(r.dst) || (r.gw !== undefined && !isIpv4(r.gw))) continue;
    const gw = r.gw ?? gateway;
    const holder = gw === undefined ? undefined : subnets.find((s) => inSubnet4(gw, `${s.dst}/${s.prefix}`))?.owner;
    if ((holder ?? primary) !== ifIndex) continue;
    routes.push(gw === undefined ? { dst: r.dst } : { dst: r.dst, gw });
  }
  const ns = (dnsSrc.nameservers ?? []).filter(isIpv4);
  return {
    mac: sh.mac,
    ip: ip!,
    prefixLength,
    ...(gateway !== undefined ? { gateway } : {}),
    routes,
    dns: ns.length > 0 ? ns : [...(opts.defaultDns ?? [])],
    search: [...sh.search],
    ...(dnsSrc.domain ? { domain: dnsSrc.domain } : {}),
    ...(opts.podName ? { hostname: opts.podName } : {}),
    ...(sh.mtu !== undefined ? { mtu: sh.mtu } : {}),
    leaseSeconds: sh.leaseSeconds,
  };
}

/**
 * The IPv6 routes of one interface: every IPv6 route belongs to it when it has the only IPv6 address, else to the one
 * whose prefix holds its gateway (the first interface with IPv6 for on-link routes). A default route without a gateway
 * of its own takes the address's; the gateway it ends with is returned.
 */
function routes6(
  all: CniResult['routes'],
  holders: { owner: number | undefined; c: { ip: string; prefix: number } }[],
  ifIndex: number,
  addressGateway: string | undefined,
  onLink: (gw: string) => boolean,
  onLinkPrefix: string,
): { routes: Lease6['routes']; defaultRoute: boolean; gateway: string | undefined } {
  const routes: Lease6['routes'] = [];
  let defaultRoute = false;
  let gateway = addressGateway;
  all.forEach((r, j) => {
    const dst = parseCidr6(r.dst);
    if (!dst) return;
    const gw0 = r.gw !== undefined ? normaliseIpv6(r.gw) : gateway;
    if (r.gw !== undefined && gw0 === undefined)
      throw configError(`routes[${j}].gw ${r.gw} is not an IPv6 address (dst ${r.dst})`);
    const holder =
      gw0 === undefined
        ? holders[0]!.owner
        : (holders.find((h) => inSubnet6(gw0, h.c.ip, h.c.prefix))?.owner ?? holders[0]!.owner);
    if (holder !== ifIndex) return;
    if (gw0 !== undefined && !onLink(gw0))
      throw configError(
        `routes[${j}].gw ${r.gw ?? gw0} is not on-link: it is outside ${onLinkPrefix} and not link-local`,
      );
    const d = `${formatIpv6(networkOf(dst.bytes, dst.prefix))}/${dst.prefix}`;
    if (dst.prefix === 0) {
      defaultRoute = true;
      if (gateway === undefined) gateway = gw0;
    }
    routes.push(gw0 === undefined ? { dst: d } : { dst: d, gw: gw0 });
  });
  return { routes, defaultRoute, gateway };
}

function v6Lease(
  opts: GuestFromCniOptions,
  owner: (ip: { interface?: number }) => number | undefined,
  dnsSrc: CniDns,
  sh: Shared,
  ifName: string,
): Lease6 | undefined {
  const { result, ifIndex } = opts;
  const entries = result.ips.map((e, i) => ({ e, i, c: parseCidr6(e.address) })).filter((x) => x.c !== undefined);
  for (const { e, i, c } of entries) {
    if (isLinkLocal6(c!.bytes))
      throw configError(
        `ips[${i}].address ${e.address} is link-local: a pod's IPv6 address must be global (the guest makes its own ` +
          `link-local)`,
      );
  }
  const mine = entries.filter((x) => owner(x.e) === ifIndex);
  if (mine.length === 0) return undefined;
  if (mine.length > 1) {
    throw configError(
      `CNI result has ${mine.length} IPv6 addresses for interface ${ifName} ` +
        `(${mine.map((m) => `ips[${m.i}].address ${m.e.address}`).join(', ')}): one IPv6 address per interface is ` +
        `served`,
    );
  }
  const { e, i, c } = mine[0]!;
  const cidr = c!;
  if (cidr.prefix > 64) {
    throw configError(
      `ips[${i}].address ${e.address}: prefix /${cidr.prefix} is longer than /64; the guest learns its on-link ` +
        `prefix from router advertisements, which need /64 or ` +
        `shorter${cidr.prefix === 128 ? ' (a /128 has no on-link prefix)' : ''}`,
    );
  }
  const prefix = formatIpv6(networkOf(cidr.bytes, cidr.prefix));
  const onLink = (gw: string): boolean => {
    const b = parseIpv6(gw);
    return b !== undefined && (isLinkLocal6(b) || inSubnet6(gw, prefix, cidr.prefix));
  };
  let gateway: string | undefined;
  if (e.gateway !== undefined) {
    const g = normaliseIpv6(e.gateway);
    if (g === undefined)
      throw configError(`ips[${i}].gateway ${e.gateway} is not an IPv6 address (the address is ${e.address})`);
    if (!onLink(g))
      throw configError(
        `ips[${i}].gateway ${e.gateway} is not on-link: it is outside ${prefix}/${cidr.prefix} and not link-local`,
      );
    gateway = g;
  }
  const holders = entries.map((x) => ({ owner: owner(x.e), c: x.c! }));
  const found = routes6(result.routes, holders, ifIndex, gateway, onLink, `${prefix}/${cidr.prefix}`);
  const { routes, defaultRoute } = found;
  gateway = found.gateway;
  if (defaultRoute && gateway === undefined)
    throw configError(
      `the IPv6 default route of interface ${ifName} has no gateway (routes[].gw and ips[${i}].gateway are both ` +
        `absent)`,
    );
  const dns = (dnsSrc.nameservers ?? []).map((n) => normaliseIpv6(n)).filter((n): n is string => n !== undefined);
  return {
    mac: sh.mac,
    ip: cidr.ip,
    prefixLength: cidr.prefix,
    prefix,
    ...(gateway !== undefined ? { gateway } : {}),
    defaultRoute,
    routes,
    dns,
    search: [...sh.search],
    ...(opts.podName ? { hostname: opts.podName } : {}),
    ...(sh.mtu !== undefined ? { mtu: sh.mtu } : {}),
    leaseSeconds: sh.leaseSeconds,
  };
}

/**
 * The IPv4 lease of CNI interface `ifIndex` (guestFromCni's `v4`).
 * Throws VmpodError(Config) when the interface has no IPv4 address.
 */
export function leaseFromCni(opts: GuestFromCniOptions): DhcpLease {
  const g = guestFromCni(opts);
  if (!g.v4) {
    const iface = opts.result.interfaces[opts.ifIndex];
    const ifName = iface ? `${opts.ifIndex} (${iface.name})` : `${opts.ifIndex}`;
    const have = opts.result.ips.map((ip) => `${ip.address}@${ip.interface ?? '-'}`).join(', ') || 'none';
    throw new VmpodError(ErrorCode.Config, `CNI result has no IPv4 address for interface ${ifName} (ips: ${have})`, {
      op: 'dhcp lease from CNI result',
    });
  }
  return g.v4;
}
