// The tc-redirect binding's steps for one CNI interface (Kata's tcfilter, firecracker's tc-redirect-tap): no bridge; an
// ingress qdisc on the interface and on tap<i>, and on each a u32 filter that redirects every frame to the other's
// egress (mirred). The VM uses the interface's MAC, and the interface keeps it: the only way for macvlan and ipvlan,
// and for a veth the way without a bridge, whose removal costs the pod's release an RCU grace period under rtnl_lock.
// Pure. plan.ts strips the interface's addresses and routes first, as for the bridge binding.
//
// Before the redirect, at a lower prio, filters keep in the pod netns what is not the VM's or the network's to see
// (a terminal u32 match with a class id and no action: the frame goes up the pod netns's stack):
//   on the interface: DHCP answers to the pod netns (udp 68: the dhcp IPAM daemon's lease and renewals) and other
//     clients' requests (udp 67); DHCPv6 likewise (546, 547);
//   on the tap: the VM's DHCP, DHCPv6, router solicitations and advertisements (our servers answer them on the tap),
//     and its ARP for the DHCP server's address (169.254.254.2, on the tap), which the pod netns answers.
// u32 offsets count from the network header: IPv4 without options, IPv6 without extension headers (DHCP has neither).
// IPv6: the VM and the interface share the MAC, so they would share its EUI-64 link-local address; the interface gives
// it up and makes none (addrgenmode none), so the pod netns never answers for it (DAD, NS). Routed IPv6 (a veth, whose
// network sends no RAs): the pod netns routes for the VM, from a link-local of its own on the interface, and keeps what
// comes to that address (and the solicitations for it) and what the VM sends to the tap's MAC, the router its RA names.
import { StepName, type Op, type Step } from '../state/record.js';
import type { PodInterface } from '../state/types.js';
import { formatIpv6, linkLocalFromMac, macBytes } from '../net/ipv6.js';
import { Binding } from './binding.js';
import { makeTapOps } from './tapmake.js';
import { BRIDGE_IP, BRIDGE_PREFIX, tapName, type ObservedLink } from './types.js';

const ip = (...args: string[]): Extract<Op, { op: 'ip' }> => ({ op: 'ip', args });
const tc = (...args: string[]): Extract<Op, { op: 'tc' }> => ({ op: 'tc', args });

/** The class id of a kept frame (any: the ingress qdisc has no classes; it only makes the match terminal). */
export const KEEP_CLASSID = 'ffff:1';
/** The redirect's prio: after every keep filter. */
export const REDIRECT_PRIO = 100;

const UDP = 17;
const ICMPV6 = 58;
const NEIGHBOR_SOLICIT = 135;

/** u32 matches of one kind of frame: [protocol, matches]. */
type Match = [protocol: 'ip' | 'ipv6' | 'arp', words: string[]];

const udp4 = (port: number): Match => [
  'ip',
  ['match', 'u8', String(UDP), '0xff', 'at', '9', 'match', 'u16', String(port), '0xffff', 'at', '22'],
];
const udp6 = (port: number): Match => [
  'ipv6',
  ['match', 'u8', String(UDP), '0xff', 'at', '6', 'match', 'u16', String(port), '0xffff', 'at', '42'],
];
const icmp6 = (type: number): Match => [
  'ipv6',
  ['match', 'u8', String(ICMPV6), '0xff', 'at', '6', 'match', 'u8', String(type), '0xff', 'at', '40'],
];
/** ARP whose target protocol address (offset 24) is the DHCP server's */
const arpFor = (ipv4: string): Match => [
  'arp',
  ['match', 'u32', `0x${Buffer.from(ipv4.split('.').map(Number)).toString('hex')}`, '0xffffffff', 'at', '24'],
];

/** What stays in the pod netns, by the device it arrives on. */
export const KEPT_FROM_NETWORK: readonly Match[] = [udp4(68), udp4(67), udp6(546), udp6(547)];
export const KEPT_FROM_VM: readonly Match[] = [
  udp4(67),
  udp4(68),
  arpFor(BRIDGE_IP),
  udp6(547),
  udp6(546),
  icmp6(133),
  icmp6(134),
];

/** The tc lines of one direction: the ingress qdisc of `dev`, its keep filters, then the redirect to `to`. */
export function redirectLines(dev: string, to: string, kept: readonly Match[]): string[][] {
  return [...keepLines(dev, kept), redirectLine(dev, to)];
}

/** The ingress qdisc of `dev` and its keep filters: what needs no other link. */
function keepLines(dev: string, kept: readonly Match[]): string[][] {
  return [['qdisc', 'add', 'dev', dev, 'ingress'], ...kept.map((m, n) => keepLine(dev, n + 1, m))];
}

function keepLine(dev: string, prio: number, [proto, words]: Match): string[] {
  return [...filterHead(dev), String(prio), 'protocol', proto, 'u32', ...words, 'classid', KEEP_CLASSID];
}

/** IPv6 to one address (the destination: offset 24 of the IPv6 header) */
const ip6To = (addr: Uint8Array): Match => ['ipv6', addressWords(addr, 24)];

/**
 * A neighbour solicitation for one address (ICMPv6 type 135, its target at offset 48): multicast to a solicited-node
 * group, which the pod netns's own link-local shares with the VM's (both end in the MAC's last three bytes)
 */
const nsFor = (addr: Uint8Array): Match => ['ipv6', [...icmp6(NEIGHBOR_SOLICIT)[1], ...addressWords(addr, 48)]];

/** u32 matches of a whole IPv6 address at offset `at`, a word at a time */
const addressWords = (addr: Uint8Array, at: number): string[] =>
  [0, 4, 8, 12].flatMap((o) => [
    'match',
    'u32',
    `0x${Buffer.from(addr.subarray(o, o + 4)).toString('hex')}`,
    '0xffffffff',
    'at',
    String(at + o),
  ]);

/** IPv6 in frames to one MAC (the Ethernet destination, 14 bytes before the network header) */
const ip6ToMac = (mac: string): Match => {
  const m = macBytes(mac);
  const hex = (from: number, to: number): string => `0x${m.subarray(from, to).toString('hex')}`;
  return [
    'ipv6',
    ['match', 'u16', hex(0, 2), '0xffff', 'at', '-14', 'match', 'u32', hex(2, 6), '0xffffffff', 'at', '-12'],
  ];
};

/**
 * The pod netns's own link-local address on a routed interface (it needs one to resolve the gateway), made from the
 * MAC it shares with the VM as the VM's EUI-64 one is, with ff:fd in the middle instead of ff:fe: distinct from the
 * VM's, unique on the link as the MAC is, and the same after a restart or a recover.
 */
function netnsLinkLocal(mac: string): Buffer {
  const b = linkLocalFromMac(mac);
  b[12] = 0xfd;
  return b;
}

const filterHead = (dev: string): string[] => ['filter', 'add', 'dev', dev, 'parent', 'ffff:', 'prio'];

/** Every frame that came in on `dev` and no keep filter took, out of `to`. */
function redirectLine(dev: string, to: string): string[] {
  return [
    ...filterHead(dev),
    String(REDIRECT_PRIO),
    'protocol',
    'all',
    'u32',
    ...['match', 'u8', '0', '0', 'at', '0'],
    ...['action', 'mirred', 'egress', 'redirect', 'dev', to],
  ];
}

/**
 * What of the tap's side needs neither the CNI link nor the result, so add makes it while the plugins run (plan.ts
 * preparedSteps), after the tap itself: the DHCP server's address, the tap's ingress qdisc and its keep filters, and
 * the tap up, making no link-local (a request applies the up flag before addrgenmode, hence two). It keeps the MAC
 * the kernel gave it (random, locally administered, as the plan's own) and gets its MTU from the plan when the CNI
 * link's differs.
 */
export function preparedTapOps(tap: string): Op[] {
  return [
    tapAddr(tap),
    ...keepLines(tap, KEPT_FROM_VM).map((l) => tc(...l)),
    ip('link', 'set', 'dev', tap, 'addrgenmode', 'none'),
    ip('link', 'set', 'dev', tap, 'up'),
  ];
}

/** The DHCP server's address, on the tap: the guest's unicast renewals and its ARP for the server end there. */
const tapAddr = (tap: string): Op => ip('addr', 'add', `${BRIDGE_IP}/${BRIDGE_PREFIX}`, 'dev', tap);

export interface TcRedirectInput {
  /** the interface's ordinal among the taps (tap<i>) */
  i: number;
  /** its position in the CNI result */
  index: number;
  link: ObservedLink;
  /** the tap's own MAC (the router and DHCPv6 server the guest sees over IPv6 use it) */
  tapMac: string;
  /** the result gives the interface IPv6 */
  v6: boolean;
  /**
   * the pod netns routes the VM's IPv6 (a veth: its network sends no RAs, so the router our RA names is the pod netns,
   * as under the bridge binding); not for a macvlan or ipvlan, whose network's routers advertise themselves
   */
  routed?: boolean;
  /**
   * the tap as the plan observed it when it exists already, with preparedTapOps done (made while the plugins ran:
   * plan.ts preparedSteps); tapMac is then its MAC
   */
  madeTap?: ObservedLink;
}

/** The steps after strip-routes/strip-addrs, and the interface the record keeps. */
export function planTcRedirect({ i, index, link, tapMac, v6, routed, madeTap }: TcRedirectInput): {
  steps: Step[];
  iface: PodInterface;
} {
  const v = link.name;
  const tap = tapName(i);
  const mac = tapMac.toLowerCase();
  // routed: the pod netns's own link-local on the interface, to reach the gateway from
  const ownAddr = routed === true && v6 ? netnsLinkLocal(link.mac.toLowerCase()) : undefined;
  const steps: Step[] = [
    ...(v6 ? [linkLocalOffStep(link, ownAddr)] : []),
    ...tapSteps(tap, link, mac, v6, madeTap),
    tcRedirectStep(tap, v, mac, ownAddr, madeTap !== undefined),
  ];
  const iface: PodInterface = {
    index,
    cniName: v,
    type: 'tap',
    binding: Binding.TcRedirect,
    vmMac: link.mac.toLowerCase(),
    mtu: link.mtu,
    tapName: tap,
    multiQueue: true,
    bridgeName: '',
    bridgeIp: BRIDGE_IP,
    ...(v6 ? { bridgeMac: mac, bridgeIp6: formatIpv6(linkLocalFromMac(mac)) } : {}),
    ...(ownAddr ? { routed6: true } : {}),
    vlanId: 0,
  };
  return { steps, iface };
}

/**
 * The interface gives up the link-local it shares with the VM and makes none; a routed one gets its own. That is a
 * /128 with the link-local route beside it, not a /64: an address whose prefix is shorter joins its subnet-router
 * anycast address once forwarding is on (ipv6-forwarding), and the link's deletion in the plugin's DEL then waits for
 * an RCU barrier.
 */
function linkLocalOffStep(link: ObservedLink, ownAddr: Uint8Array | undefined): Step {
  const v = link.name;
  const own = ownAddr ? `${formatIpv6(ownAddr)}/128` : undefined;
  return {
    name: StepName.LinkLocalOff,
    target: v,
    do: [
      ip('link', 'set', 'dev', v, 'addrgenmode', 'none'),
      ...(link.linkLocal6 ?? []).map((a) => ip('addr', 'del', `${a.local}/${a.prefixlen}`, 'dev', v)),
      ...(own ? [ip('addr', 'add', own, 'dev', v, 'nodad'), ip('route', 'replace', 'fe80::/64', 'dev', v)] : []),
    ],
    undo: [
      ...(own ? [ip('route', 'del', 'fe80::/64', 'dev', v), ip('addr', 'del', own, 'dev', v)] : []),
      ip('link', 'set', 'dev', v, 'addrgenmode', 'eui64'),
      ip('addr', 'replace', `${formatIpv6(linkLocalFromMac(link.mac.toLowerCase()))}/64`, 'dev', v, 'nodad'),
    ],
  };
}

/**
 * The tap made (or, made already while the plugins ran and up, given the MTU when it differs), and the links still
 * down brought up. IPv6: a new tap comes up once it makes no link-local (a request applies the flags before
 * addrgenmode); without, up in the same request.
 */
function tapSteps(tap: string, link: ObservedLink, mac: string, v6: boolean, madeTap?: ObservedLink): Step[] {
  const steps: Step[] = [];
  const mtu = String(link.mtu);
  if (madeTap === undefined) {
    const tapLink = ip(
      'link',
      'set',
      'dev',
      tap,
      'mtu',
      mtu,
      'address',
      mac,
      ...(v6 ? ['addrgenmode', 'none'] : ['up']),
    );
    steps.push({
      name: StepName.Tap,
      target: tap,
      do: [...makeTapOps(tap), tapLink, tapAddr(tap)],
      undo: [{ ...ip('link', 'del', 'dev', tap), withNetns: true }],
    });
  } else if (madeTap.mtu !== link.mtu) {
    steps.push({ name: StepName.Tap, target: tap, do: [ip('link', 'set', 'dev', tap, 'mtu', mtu)], undo: [] });
  }
  // the CNI link is up as its plugin left it, usually
  const up = [...(link.up ? [] : [link.name]), ...(v6 && madeTap === undefined ? [tap] : [])];
  if (up.length > 0)
    steps.push({ name: StepName.LinksUp, target: tap, do: up.map((n) => ip('link', 'set', 'dev', n, 'up')), undo: [] });
  return steps;
}

/**
 * Both directions' qdiscs, keep filters and redirects (a tap made already has its own qdisc and keep filters). Routed:
 * what the network sends to the pod netns's own address (unicast, and the solicitations for it: a router whose
 * neighbour cache lost the address asks for it by multicast), and what the VM sends to its router (the tap's MAC:
 * off-link IPv6 for the pod netns to forward) stay in the pod netns.
 */
function tcRedirectStep(tap: string, v: string, mac: string, ownAddr: Uint8Array | undefined, tapMade: boolean): Step {
  const fromNetwork = ownAddr ? [...KEPT_FROM_NETWORK, ip6To(ownAddr), nsFor(ownAddr)] : KEPT_FROM_NETWORK;
  const toRouter = ownAddr ? [ip6ToMac(mac)] : [];
  const tapSide = tapMade
    ? [...toRouter.map((m, n) => keepLine(tap, KEPT_FROM_VM.length + n + 1, m)), redirectLine(tap, v)]
    : redirectLines(tap, v, [...KEPT_FROM_VM, ...toRouter]);
  return {
    name: StepName.TcRedirect,
    target: v,
    do: [...redirectLines(v, tap, fromNetwork), ...tapSide].map((l) => tc(...l)),
    // the interface's qdisc goes before its CNI DEL (host-device would take it back to the host);
    // the tap's goes with the netns
    undo: [tc('qdisc', 'del', 'dev', v, 'ingress'), { ...tc('qdisc', 'del', 'dev', tap, 'ingress'), withNetns: true }],
  };
}
