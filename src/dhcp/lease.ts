// The lease one guest NIC receives, computed from the CNI result (pure).
import type { CniDns, CniResult } from '../cni/types.js';
import { ErrorCode, VmpodError } from '../errors.js';
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

export const DEFAULT_LEASE_SECONDS = 86400;
/** Virtlet's fallback when neither the CNI result nor the pod names a DNS server (pkg/dhcp). */
export const DEFAULT_DNS: readonly string[] = ['8.8.8.8'];

/**
 * The lease for CNI interface `ifIndex`:
 * - the first IPv4 entry of result.ips whose `interface` is ifIndex (an entry without `interface`, as old 0.2.0
 *   and some 0.3.x results have, belongs to interface 0, or to ifIndex when the result has one interface);
 * - routes: the IPv4 routes of the result; a route without gw goes via the entry's gateway (CNI spec: "if omitted,
 *   a default gateway is assumed"), else on-link. With several interfaces a route belongs to the interface whose
 *   subnet holds its gateway; routes whose gateway is in no leased subnet go to the first interface with IPv4;
 * - DNS: the pod's DNS config when it names nameservers or search domains, else the CNI result's; IPv6
 *   nameservers dropped; Virtlet's 8.8.8.8 when none is left (DEFAULT_DNS, overridable);
 * - hostname = the pod name; mtu = opts.mtu, else the CNI interface's.
 * Throws VmpodError(Config) when the interface has no IPv4 address.
 */
export function leaseFromCni(opts: {
  result: CniResult;
  ifIndex: number;
  podDns?: CniDns | null;
  podName?: string;
  mtu?: number;
  mac: string;
  defaultDns?: readonly string[];
  leaseSeconds?: number;
}): DhcpLease {
  const { result, ifIndex } = opts;
  const iface = result.interfaces[ifIndex];
  const ifName = iface ? `${ifIndex} (${iface.name})` : `${ifIndex}`;
  const onlyOne = result.interfaces.length <= 1;
  const owner = (ip: { interface?: number }): number | undefined => ip.interface ?? (onlyOne ? ifIndex : 0);
  const v4 = result.ips.filter((ip) => isCidr4(ip.address));
  const mine = v4.find((ip) => owner(ip) === ifIndex);
  if (!mine) {
    const have = result.ips.map((ip) => `${ip.address}@${ip.interface ?? '-'}`).join(', ') || 'none';
    throw new VmpodError(ErrorCode.Config, `CNI result has no IPv4 address for interface ${ifName} (ips: ${have})`, {
      op: 'dhcp lease from CNI result',
    });
  }
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

  const pod = opts.podDns;
  const dnsSrc = pod && ((pod.nameservers?.length ?? 0) > 0 || (pod.search?.length ?? 0) > 0) ? pod : result.dns;
  const ns = (dnsSrc.nameservers ?? []).filter(isIpv4);
  const mtu = opts.mtu ?? iface?.mtu;
  return {
    mac: normaliseMac(opts.mac),
    ip,
    prefixLength,
    ...(gateway !== undefined ? { gateway } : {}),
    routes,
    dns: ns.length > 0 ? ns : [...(opts.defaultDns ?? DEFAULT_DNS)],
    search: [...(dnsSrc.search ?? [])],
    ...(dnsSrc.domain ? { domain: dnsSrc.domain } : {}),
    ...(opts.podName ? { hostname: opts.podName } : {}),
    ...(mtu !== undefined ? { mtu } : {}),
    leaseSeconds: opts.leaseSeconds ?? DEFAULT_LEASE_SECONDS,
  };
}
