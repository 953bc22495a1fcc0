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
