// The Router Advertisement one guest receives, from its IPv6 lease (pure): RFC 4861 6.2.1's defaults where the
// lease says nothing, M=1 O=1 (the address and DNS come from DHCPv6), the pod prefix on-link with SLAAC off.
import type { Lease6 } from '../dhcp/lease.js';
import type { RouterAdvertisement } from './packet.js';

/** RFC 4861 6.2.1: MaxRtrAdvInterval default 600 s, MinRtrAdvInterval 0.33 of it. */
export const MAX_RTR_ADV_INTERVAL = 600;
export const MIN_RTR_ADV_INTERVAL = 200;
/** RFC 4861 10: the first advertisements come faster. */
export const MAX_INITIAL_RTR_ADVERTISEMENTS = 3;
export const MAX_INITIAL_RTR_ADVERT_INTERVAL = 16;
/** AdvDefaultLifetime: 3 * MaxRtrAdvInterval. */
export const ROUTER_LIFETIME = 3 * MAX_RTR_ADV_INTERVAL;
/** RFC 8106 5.1: RDNSS/DNSSL lifetime between MaxRtrAdvInterval and 2x it. */
export const DNS_LIFETIME = 2 * MAX_RTR_ADV_INTERVAL;
/** AdvValidLifetime, AdvPreferredLifetime defaults (the prefix is on-link only: A=0). */
export const PREFIX_VALID = 2592000;
export const PREFIX_PREFERRED = 604800;

export function raFromLease(lease: Lease6, routerMac: string): RouterAdvertisement {
  return {
    curHopLimit: 64,
    managed: true,
    other: true,
    // a default router only when the CNI result has an IPv6 default route (RFC 4861 4.2: 0 = not a default router)
    routerLifetime: lease.defaultRoute ? ROUTER_LIFETIME : 0,
    reachableTime: 0,
    retransTimer: 0,
    sourceMac: routerMac,
    ...(lease.mtu !== undefined ? { mtu: lease.mtu } : {}),
    prefixes: [
      {
        prefix: lease.prefix,
        length: lease.prefixLength,
        onLink: true,
        autonomous: false,
        valid: PREFIX_VALID,
        preferred: PREFIX_PREFERRED,
      },
    ],
    ...(lease.dns.length > 0 ? { rdnss: { lifetime: DNS_LIFETIME, servers: [...lease.dns] } } : {}),
    ...(lease.search.length > 0 ? { dnssl: { lifetime: DNS_LIFETIME, domains: [...lease.search] } } : {}),
  };
}
