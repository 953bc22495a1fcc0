// The pod netns's own steps, each with its undo (pure): the netns made, its sysctls, the CNI ADD (add.ts records them
// before anything runs), lo up and IPv6 off for a pod without IPv6 (the planner, plan.ts, puts those in its plan).
import { StepName, type Step } from '../state/record.js';

export function netnsStep(name: string): Step {
  return { name: StepName.Netns, target: name, do: [{ op: 'netns-add', name }], undo: [{ op: 'netns-del', name }] };
}

/**
 * rp_filter off in the pod netns. A new netns copies its IPv4 conf `all` and `default` from the host's init netns
 * (net.core.devconf_inherit_init_net = 0, the default), and hosts often have 1 or 2 there (systemd's
 * 50-default.conf sets 2, as Ubuntu does). The guest's ARP for 169.254.254.2, its unicast renewal and its
 * rebinding broadcast all come from the leased address, which the pod netns has no route to (the veth is
 * stripped), so strict (1) and loose (2) mode both drop them, and renewals fail. The kernel checks
 * max(conf/all, conf/<dev>), so `all` is set, and `default`, which links made later take: the CNI plugin's veth and
 * our bridges (this step comes before both). No undo: the values go with the netns.
 */
export const RP_FILTER_OFF = ['net.ipv4.conf.all.rp_filter=0', 'net.ipv4.conf.default.rp_filter=0'] as const;

/**
 * IPv6 in the pod netns, set with rp_filter: no router advertisement (a rogue one from the VM) configures anything
 * there (accept_ra 0), and no address waits a second in DAD (accept_dad 0: the bridge's link-local is usable when add
 * replies, and the CNI plugin's addresses are not tentative).
 */
export const IPV6_POD_SYSCTLS = [
  'net.ipv6.conf.all.accept_ra=0',
  'net.ipv6.conf.default.accept_ra=0',
  'net.ipv6.conf.all.accept_dad=0',
  'net.ipv6.conf.default.accept_dad=0',
] as const;

/**
 * A pod whose CNI result has no IPv6: IPv6 off on every link of its netns (`all`) and on those made later (`default`:
 * the bridge and the tap), before the container side changes the veth's MAC. The VM's frames are bridged whatever
 * the netns's own IPv6 (the DHCP filter still drops its DHCPv6 and router solicitations). No undo: it lives and goes
 * with the netns.
 */
export function ipv6OffStep(): Step {
  return { name: StepName.Ipv6Off, target: 'netns', do: [{ op: 'sysctl', settings: [...IPV6_OFF] }], undo: [] };
}

export const IPV6_OFF = ['net.ipv6.conf.all.disable_ipv6=1', 'net.ipv6.conf.default.disable_ipv6=1'] as const;

/** The sysctls of every pod netns, as its rp-filter step sets them (and a spare netns is made with). */
export const POD_NETNS_SYSCTLS: readonly string[] = [...RP_FILTER_OFF, ...IPV6_POD_SYSCTLS];

export function rpFilterStep(netns: string): Step {
  return { name: StepName.RpFilter, target: netns, do: [{ op: 'sysctl', settings: [...POD_NETNS_SYSCTLS] }], undo: [] };
}

/** The pod netns, in apply order: made, then its sysctls set, before CNI ADD puts anything in it. */
export function podNetnsSteps(name: string): Step[] {
  return [netnsStep(name), rpFilterStep(name)];
}

/**
 * CNI ADD of `ifName`; `config` (the list's bytes, base64) is what its DEL runs with (see Op cni-del). CNI DEL must
 * also follow a failed ADD (CNI spec), so the undo is recorded before ADD runs.
 */
export function cniAddStep(ifName: string, config?: string): Step {
  return {
    name: StepName.CniAdd,
    target: ifName,
    do: [{ op: 'cni-add', ifName }],
    undo: [{ op: 'cni-del', ifName, ...(config === undefined ? {} : { config }) }],
  };
}

export function loUpStep(): Step {
  return { name: StepName.LoUp, target: 'lo', do: [{ op: 'ip', args: ['link', 'set', 'dev', 'lo', 'up'] }], undo: [] };
}
