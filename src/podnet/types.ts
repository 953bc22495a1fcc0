// Data of the pod network: what the kernel showed us (Observed*), what we made (PodInterface), and the
// names and addresses fixed by convention (Virtlet's: br<i>, tap<i>, 169.254.254.2/24 on every bridge).
import type { VfSetupRecord } from '../devices/vf.js';

/** One network interface the VM gets. */
export interface PodInterface {
  /** position of this interface in the CNI result's interfaces[] (what ips[].interface points at) */
  index: number;
  /** the link the CNI plugin left in the pod netns (e.g. "virtlet-eth0") */
  cniName: string;
  type: 'tap' | 'vf';
  /**
   * colon-hex, the ORIGINAL veth MAC: the VM's NIC takes it so the outside sees the pod's MAC unchanged.
   * For a VF: the MAC its netdev had in the pod netns, set on the PF for the VF (the guest's VF driver gets it).
   */
  vmMac: string;
  /** the random locally administered MAC the veth got instead */
  vethMacNew?: string;
  mtu: number;
  /** '' for a VF (no tap, no bridge) */
  tapName: string;
  bridgeName: string;
  /** the bridge's link-local address, where the DHCP server answers from ('' for a VF) */
  bridgeIp: string;
  /** IPv6: the bridge's MAC and link-local address, the router and DHCPv6 server the guest sees (absent: no IPv6) */
  bridgeMac?: string;
  bridgeIp6?: string;
  /** a VF's full PCI address (0000:bb:dd.f), as Virtlet's csn PCIAddress */
  pciAddress?: string;
  /** 802.1Q VLAN the PF tags the VF's traffic with (0 = none); always 0 for a tap */
  vlanId: number;
  /** a VF: its PF, index, original driver, MAC and VLAN (what release restores) */
  vf?: VfSetupRecord;
}

/** Names and addresses by convention (pod-network.md step 3 and 4). */
export const BRIDGE_IP = '169.254.254.2';
export const BRIDGE_PREFIX = 24;
export const tapName = (i: number): string => `tap${i}`;
export const bridgeName = (i: number): string => `br${i}`;
/** CNI_IFNAME of the pod's (first) interface, as Virtlet. */
export const DEFAULT_IFNAME = 'virtlet-eth0';

/** An IPv4 address on a link, as `ip -j addr` shows it. */
export interface ObservedAddr {
  local: string;
  prefixlen: number;
  broadcast?: string;
  scope?: string;
}

/** A link in the pod netns, as `ip -j -d addr show` shows it. */
export interface ObservedLink {
  name: string;
  index: number;
  /** linkinfo.info_kind: "veth", "bridge", "tun", ... absent for physical devices */
  kind?: string;
  mac: string;
  mtu: number;
  up: boolean;
  master?: string;
  /** "pci" for a PCI network device (a VF moved into the netns) */
  parentBus?: string;
  parentDev?: string;
  addrs4: ObservedAddr[];
  /** its global IPv6 addresses (link-local ones are the link's own and stay) */
  addrs6?: ObservedAddr[];
}

/** An IPv4 route of the main table, as `ip -j route show` shows it. */
export interface ObservedRoute {
  /** "default" or a prefix ("10.1.0.0/16", "169.254.1.1" for a host route) */
  dst: string;
  gateway?: string;
  dev?: string;
  /** absent means "boot" in iproute2's JSON for some outputs; "kernel" marks the prefix routes the kernel adds */
  protocol?: string;
  scope?: string;
  prefsrc?: string;
  metric?: number;
  type?: string;
  /** absent for the main table */
  table?: string;
  flags: string[];
}

/** The pod netns as seen after CNI ADD. */
export interface Observed {
  links: ObservedLink[];
  routes4: ObservedRoute[];
  /** IPv6 routes of the main table */
  routes6?: ObservedRoute[];
}
