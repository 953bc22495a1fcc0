// How a CNI interface is joined to the VM's tap (docs/networking.md, "Bindings"): bridge (the interface's MAC moves to
// the VM, a bridge joins interface and tap) or tc-redirect (no bridge, the interface keeps its MAC and shares it with
// the VM, tc redirects frames both ways: tcredirect.ts). Pure.
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
 * The binding of one interface: the mode's, or under auto tc-redirect for a link whose MAC must stay and for a veth,
 * bridge otherwise (a NIC moved in, a VLAN). A pod netns without a bridge is released much faster: the netns's removal
 * waits an RCU grace period under rtnl_lock for each bridge (docs/decisions.md).
 */
export function chooseBinding(mode: BindingMode, link: Pick<ObservedLink, 'kind'>): Binding {
  if (mode !== 'auto') return mode;
  return link.kind === 'veth' || (link.kind !== undefined && MAC_BOUND_KINDS.has(link.kind))
    ? Binding.TcRedirect
    : Binding.Bridge;
}

/** CNI plugins whose pod interface is no veth and may take the VM's MAC: they get the bridge binding. */
const BRIDGED_PLUGINS: ReadonlySet<string> = new Set(['host-device', 'vlan']);

/**
 * The binding interface 0 will most likely get, before the plugins ran: what add prepares while they run (plan.ts
 * preparedSteps). Under auto, bridge when the first plugin makes a NIC or VLAN link (host-device, vlan), tc-redirect
 * otherwise (macvlan, ipvlan, and the veths of bridge, ptp and most CNIs). A wrong guess costs the add the prepared
 * links' deletion (plan.ts dropPreparedStep), never a wrong binding: the plan chooses from the link the plugins made.
 */
export function expectedBinding(mode: BindingMode, firstPluginType: string | undefined): Binding {
  if (mode !== 'auto') return mode;
  if (firstPluginType === undefined) return Binding.Bridge;
  return BRIDGED_PLUGINS.has(firstPluginType) ? Binding.Bridge : Binding.TcRedirect;
}
