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
 * The binding of one interface: the mode's, or under auto tc-redirect for a link whose MAC must stay, bridge otherwise.
 */
export function chooseBinding(mode: BindingMode, link: Pick<ObservedLink, 'kind'>): Binding {
  if (mode !== 'auto') return mode;
  return link.kind !== undefined && MAC_BOUND_KINDS.has(link.kind) ? Binding.TcRedirect : Binding.Bridge;
}

/** CNI plugins that make a link of a MAC_BOUND_KIND for the pod. */
const MAC_BOUND_PLUGINS: ReadonlySet<string> = new Set(['macvlan', 'ipvlan']);

/**
 * The binding interface 0 will most likely get, before the plugins ran: what add prepares while they run (plan.ts
 * preparedSteps). Under auto, tc-redirect when the list's first plugin makes a macvlan or an ipvlan. A wrong guess
 * costs the add the prepared links' deletion (plan.ts dropPreparedStep), never a wrong binding: the plan chooses
 * from the link the plugins made.
 */
export function expectedBinding(mode: BindingMode, firstPluginType: string | undefined): Binding {
  if (mode !== 'auto') return mode;
  return firstPluginType !== undefined && MAC_BOUND_PLUGINS.has(firstPluginType) ? Binding.TcRedirect : Binding.Bridge;
}
