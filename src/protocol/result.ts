// Virtlet's wire shape of a CNI result (its vendored CNI 0.5 types.current.Result) and the conversions to and
// from the in-memory CniResult: the protocol's side of the CNI result (pure).
import { basicInterface, basicRoute, copyDns, family, normalizeResult } from '../cni/result.js';
import type { CniResult } from '../cni/types.js';
import type { CniResultV031 } from './payloads.js';

/**
 * Virtlet's wire shape (its vendored CNI 0.5 types.current.Result): cniVersion "0.3.1", ips[].version
 * present, and "interface" an int with omitempty, so index 0 is not written. Empty lists are omitted
 * (Go omitempty on slices); dns is a struct and always present.
 */
export function toV031(r: CniResult): CniResultV031 {
  const out: CniResultV031 = { cniVersion: '0.3.1' };
  if (r.interfaces.length > 0) out.interfaces = r.interfaces.map(basicInterface);
  if (r.ips.length > 0) {
    out.ips = r.ips.map((ip) => {
      const o: NonNullable<CniResultV031['ips']>[number] = { version: family(ip.address), address: ip.address };
      if (ip.interface !== undefined && ip.interface !== 0) o.interface = ip.interface;
      if (ip.gateway !== undefined) o.gateway = ip.gateway;
      return o;
    });
  }
  if (r.routes.length > 0) out.routes = r.routes.map(basicRoute);
  out.dns = copyDns(r.dns);
  return out;
}

/**
 * Back from Virtlet's shape. A missing "interface" means index 0 there (Go int, omitempty), so it becomes
 * 0 when the result lists interfaces, and stays absent when it lists none.
 */
export function fromV031(r: CniResultV031): CniResult {
  const n = normalizeResult(r, '0.3.1');
  if (n.interfaces.length > 0) for (const ip of n.ips) ip.interface ??= 0;
  return n;
}
