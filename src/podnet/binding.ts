// How a CNI interface is joined to the VM's tap (docs/networking.md, "Bindings"): bridge (the interface's MAC moves to
// the VM, a bridge joins interface and tap) or tc-redirect (no bridge, the interface keeps its MAC and shares it with
// the VM, tc redirects frames both ways: tcredirect.ts). Pure.
import { isIpv6 } from '../net/ipv6.js';
import type { ObservedLink } from './types.js';

export const Binding = { Bridge: 'bridge', TcRedirect: 'tc-redirect' } as const;
export type Binding = (typeof Binding)[keyof typeof Binding];

/** What the operator chooses (tapmanager --binding, env VMPOD_BINDING): one binding for every interface, or auto. */
export type BindingMode = Binding | 'auto';
export const BINDING_MODES: readonly BindingMode[] = ['auto', Binding.Bridge, Binding.TcRedirect];

/**
 * Link kinds whose MAC cannot go to the VM: a macvlan (and macvtap) receives only frames for its own MAC; an ipvlan
 * (and ipvtap) has its parent's MAC, which it cannot change.
 */
export const MAC_BOUND_KINDS: ReadonlySet<string> = new Set(['macvlan', 'macvtap', 'ipvlan', 'ipvtap']);

/**
 * The binding of one interface, which the CNI result gives IPv6 (`ipv6`) or not: the mode's, or under auto
 * tc-redirect for a link whose MAC must stay and for a veth without IPv6, bridge otherwise. A veth's VM needs the
 * bridge only for IPv6: the pod netns routes for it there (the bridge's link-local is the router its RAs name), and a
 * bridge CNI sends no RAs of its own. Without a bridge a pod's release is cheaper: the netns's removal waits an RCU
 * grace period under rtnl_lock for each bridge (docs/decisions.md).
 */
export function chooseBinding(mode: BindingMode, link: Pick<ObservedLink, 'kind'>, ipv6: boolean): Binding {
  if (mode !== 'auto') return mode;
  if (link.kind !== undefined && MAC_BOUND_KINDS.has(link.kind)) return Binding.TcRedirect;
  return link.kind === 'veth' && !ipv6 ? Binding.TcRedirect : Binding.Bridge;
}

/** CNI plugins whose pod interface is no veth and may take the VM's MAC: they get the bridge binding. */
const BRIDGED_PLUGINS: ReadonlySet<string> = new Set(['host-device', 'vlan']);

/** The first plugin of a network list, as much as expectedBinding reads of it. */
export interface FirstPlugin {
  type: string;
  ipam?: unknown;
}

/**
 * The binding interface 0 will most likely get, before the plugins ran: what add prepares while they run (plan.ts
 * preparedSteps). Under auto, bridge when the first plugin makes a NIC or VLAN link (host-device, vlan) or its IPAM
 * names an IPv6 subnet or address; tc-redirect otherwise (macvlan, ipvlan, and the veths of bridge, ptp and most
 * CNIs). A wrong guess costs the add the prepared links' deletion (plan.ts dropPreparedStep), never a wrong binding:
 * the plan chooses from the link the plugins made and the result.
 */
export function expectedBinding(mode: BindingMode, first: FirstPlugin | undefined): Binding {
  if (mode !== 'auto') return mode;
  if (first === undefined) return Binding.Bridge;
  if (MAC_BOUND_KINDS.has(first.type)) return Binding.TcRedirect;
  return BRIDGED_PLUGINS.has(first.type) || namesIpv6(first.ipam) ? Binding.Bridge : Binding.TcRedirect;
}

/** Some string in an IPAM config (host-local's `subnet` and `ranges`, static's `addresses`...) is an IPv6 one. */
function namesIpv6(v: unknown): boolean {
  if (typeof v === 'string') return isIpv6(v.replace(/\/\d{1,3}$/, ''));
  if (Array.isArray(v)) return v.some(namesIpv6);
  if (v !== null && typeof v === 'object') return Object.values(v).some(namesIpv6);
  return false;
}
