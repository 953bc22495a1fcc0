// Completing an incomplete CNI result from the live pod netns. Pure.
//
// Weave, Calico and old 0.2.0 results carry one IP and no interfaces (or ips without an interface index),
// often no routes. Virtlet rebuilt such a result from the live link: the only veth in the netns, its only
// IPv4 address, and the routes of the kernel's main table through it. We do the same, and only fill what
// is missing: fields the plugin gave are kept.
//
// Calico fix-up: Calico gives the pod a /32 and a gateway outside it (169.254.1.1), reachable through an
// on-link host route ("169.254.1.1 dev eth0 scope link"). A guest told "10.0.0.5/32, router 169.254.1.1"
// cannot reach its router, so whenever a gateway lies outside its address's subnet and no route names it,
// we add the host route `{dst: "<gw>/32"}` without a gateway (on-link: DHCP option 121 with router 0.0.0.0,
// RFC 3442), before the routes that use it.
import { ErrorCode, VmpodError } from '../errors.js';
import { inSubnet4, isIpv4 } from '../net/ip.js';
import type { CniDns, CniIpConfig, CniResult, CniRoute } from '../cni/types.js';
import type { Observed, ObservedLink, ObservedRoute } from './types.js';

/** iproute2's route dst ("default", "10.1.0.0/16", "169.254.1.1") as a CNI dst ("0.0.0.0/0", .., "169.254.1.1/32"). */
export function routeDstToCidr(dst: string): string {
  if (dst === 'default') return '0.0.0.0/0';
  return dst.includes('/') ? dst : `${dst}/32`;
}

/** The routes of the main table through `dev` that someone added (not the kernel's prefix routes). */
export function nonKernelRoutes(routes: ObservedRoute[], dev: string): ObservedRoute[] {
  // `ip route show` lists IPv4 only; "kernel" marks the prefix routes the kernel derives from addresses
  return routes.filter(
    (r) => r.dev === dev && r.protocol !== 'kernel' && (r.type === undefined || r.type === 'unicast'),
  );
}

export function hasSandbox(i: { sandbox?: string }): boolean {
  return typeof i.sandbox === 'string' && i.sandbox !== '';
}

/** Is anything missing that Virtlet would rebuild (no sandboxed interface, ips without an interface index, no ips)? */
export function isIncomplete(r: CniResult): boolean {
  return !r.interfaces.some(hasSandbox) || r.ips.length === 0 || r.ips.some((ip) => ip.interface === undefined);
}

function fail(msg: string): VmpodError {
  return new VmpodError(ErrorCode.Cni, msg, { op: 'cni-result' });
}

/**
 * The result to serve: the plugin's result where it is complete, completed from the live netns where not,
 * plus the Calico-style gateway fix-up. Throws VmpodError(Cni) when the netns cannot say (several veths, several IPs).
 */
export function completeResult(input: CniResult, observed: Observed, nsPath: string): CniResult {
  const r: CniResult = {
    cniVersion: input.cniVersion,
    interfaces: input.interfaces.map((i) => ({ ...i })),
    ips: input.ips.map((i) => ({ ...i })),
    routes: input.routes.map((x) => ({ ...x })),
    dns: { ...input.dns },
  };
  let sandboxed = r.interfaces.map((i, idx) => (hasSandbox(i) ? idx : -1)).filter((i) => i >= 0);
  let rebuiltLink: ObservedLink | undefined;
  if (sandboxed.length === 0) {
    const veths = observed.links.filter((l) => l.kind === 'veth');
    if (veths.length !== 1) {
      throw fail(
        `the CNI result names no interface in the pod netns, and the netns has ${veths.length} veths ` +
          `(${veths.map((v) => v.name).join(', ') || 'none'}): cannot tell which is the pod's`,
      );
    }
    rebuiltLink = veths[0]!;
    r.interfaces.push({ name: rebuiltLink.name, mac: rebuiltLink.mac, sandbox: nsPath });
    sandboxed = [r.interfaces.length - 1];
  }
  const unindexed = r.ips.filter((ip) => ip.interface === undefined);
  if (unindexed.length > 0) {
    if (sandboxed.length !== 1) {
      throw fail(
        `the CNI result has ${unindexed.length} IPs without an interface index and ${sandboxed.length} interfaces ` +
          `in the pod netns: cannot tell which IP is whose`,
      );
    }
    for (const ip of unindexed) ip.interface = sandboxed[0]!;
  }
  const firstIdx = sandboxed[0]!;
  const first = r.interfaces[firstIdx]!;
  const link = rebuiltLink ?? observed.links.find((l) => l.name === first.name);
  const gatewayOf = (dev: string): string | undefined =>
    observed.routes4.find((x) => x.dev === dev && x.dst === 'default' && x.gateway)?.gateway;
  if (r.ips.length === 0) {
    if (!link) throw fail(`the CNI result has no IPs and the pod netns has no link ${first.name} to take one from`);
    if (link.addrs4.length !== 1) {
      throw fail(
        `the CNI result has no IPs and ${link.name} has ${link.addrs4.length} IPv4 addresses: cannot tell the pod's`,
      );
    }
    const a = link.addrs4[0]!;
    const ip: CniIpConfig = { address: `${a.local}/${a.prefixlen}`, interface: firstIdx };
    const gw = gatewayOf(link.name);
    if (gw) ip.gateway = gw;
    r.ips.push(ip);
  }
  if (r.routes.length === 0 && link) {
    r.routes = nonKernelRoutes(observed.routes4, link.name).map((x) => {
      const route: CniRoute = { dst: routeDstToCidr(x.dst) };
      if (x.gateway) route.gw = x.gateway;
      return route;
    });
  }
  return fixOffSubnetGateways(r);
}

/** The Calico fix-up (see the file comment). */
export function fixOffSubnetGateways(r: CniResult): CniResult {
  const gws = new Set<string>();
  for (const ip of r.ips) if (ip.gateway) gws.add(ip.gateway);
  for (const rt of r.routes) if (rt.gw) gws.add(rt.gw);
  const extra: CniRoute[] = [];
  for (const gw of gws) {
    if (!isIpv4(gw)) continue;
    const reachable = r.ips.some((ip) => inSubnet4(gw, ip.address));
    const named = r.routes.some((rt) => !rt.gw && rt.dst !== '0.0.0.0/0' && inSubnet4(gw, rt.dst));
    if (!reachable && !named) extra.push({ dst: `${gw}/32` });
  }
  return extra.length === 0 ? r : { ...r, routes: [...extra, ...r.routes] };
}

/** Does this DNS config name anything (a nameserver, a search domain, a domain or an option)? */
export function namesDns(d: CniDns | null | undefined): d is CniDns {
  return (
    d != null &&
    ((d.nameservers?.length ?? 0) > 0 ||
      (d.search?.length ?? 0) > 0 ||
      (d.options?.length ?? 0) > 0 ||
      (d.domain ?? '') !== '')
  );
}

/**
 * The result the runtime gets back: Virtlet copies the add request's DNS into it (so that a recover with only
 * the csn still knows the pod's DNS); when the request names none, the plugin's DNS stays.
 */
export function withPodDns(r: CniResult, podDns: CniDns | null | undefined): CniResult {
  if (!namesDns(podDns)) return r;
  const dns: CniDns = {};
  if (podDns.nameservers?.length) dns.nameservers = [...podDns.nameservers];
  if (podDns.domain) dns.domain = podDns.domain;
  if (podDns.search?.length) dns.search = [...podDns.search];
  if (podDns.options?.length) dns.options = [...podDns.options];
  return { ...r, dns };
}
