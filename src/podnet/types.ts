// Data of the pod network: what the kernel showed us (Observed*) and the
// names and addresses fixed by convention (Virtlet's: br<i>, tap<i>, 169.254.254.2/24 on every bridge).

/** Names and addresses by convention (docs/networking.md). */
export const BRIDGE_IP = '169.254.254.2';
export const BRIDGE_PREFIX = 24;
export const tapName = (i: number): string => `tap${i}`;
export const bridgeName = (i: number): string => `br${i}`;
/** CNI_IFNAME of the pod's (first) interface, as Virtlet. */
export const DEFAULT_IFNAME = 'virtlet-eth0';

/** An address on a link, as `ip -j addr` shows it. */
export interface ObservedAddr {
  local: string;
  prefixlen: number;
  broadcast?: string;
  scope?: string;
}

/** A link in the pod netns, as `ip -j -d addr show` shows it (src/podnet/observe.ts reads it from rtnetlink). */
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
  /** its link-local IPv6 addresses (made from its MAC: a veth that gives its MAC to the VM gives them up) */
  linkLocal6?: ObservedAddr[];
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
