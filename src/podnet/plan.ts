// The pure planner (KubeVirt netpod's composeDesiredSpec): observed netns + CNI result -> the steps that turn
// each CNI interface into veth + bridge + tap, each step with its undo. No I/O here; add.ts records
// the steps and applies them.
//
// Per CNI interface i with a sandbox (docs/networking.md, Virtlet's container-side network):
//   strip-routes  delete its non-kernel IPv4 routes   undo: put them back (`route replace`)
//   strip-addrs   delete its IPv4 addresses           undo: put them back (`addr replace`)
//                 (routes first: removing the last address makes the kernel flush the link's routes,
//                  and undo runs in reverse, so addresses are back before the routes that need them)
//   veth-mac      a random locally administered MAC   undo: the original MAC (the VM's NIC takes it)
//   bridge        br<i>, same MTU, ageing_time 0 (learning off: Flannel), 169.254.254.2/24   undo: delete it
//   tap           tap<i>, persistent, vnet_hdr, down                                          undo: delete it
//   enslave       veth (up) and tap into br<i>        undo: veth nomaster
//   links-up      tap, bridge: same MTU, up           (a link's attributes and flags in one request each)
//   dhcp-filter   nf_tables table vmpod-<veth> (bridge family) in the pod netns: no DHCP, DHCPv6, RS or RA across
//                 the veth (the rules in ebtables' words, filter.ts)                         undo: delete the table
// and when the CNI result gives the interface an IPv6 address (guestFromCni validates it first):
//   strip-routes/strip-addrs also take its global IPv6 addresses and non-kernel IPv6 routes
//   veth-mac      also: no link-local on the veth (the one made from the VM's MAC is the VM's), none made again
//   bridge        also: MAC = the veth's new MAC, no automatic link-local, fe80::<EUI-64 of that MAC>/64 nodad
//   ipv6-forwarding  net.ipv6.conf.all.forwarding=1: the bridge answers NS as a router (R=1) and forwards
//                 undo: forwarding 0, before the veth's addresses come back for the DEL
//   ipv6-routes   <prefix> dev br<i>, each IPv6 route of the result via its gateway dev br<i>   undo: with the netns
//
// add makes lo up and interface 0's bridge, tap (its port) and filter while the plugins run (preparedSteps; for
// tc-redirect the tap alone, up, with its side of the binding); the plan given `prepared` then only finishes them (the
// bridge step only for IPv6; the MTUs come with links-up; a tc-redirect tap gets its MTU when it differs), or deletes
// them first (drop-prepared) when interface 0 is another link.
//
// A CNI interface that is an SR-IOV VF (SR-IOV enabled) gets one step instead, host side, nothing moved:
//   vf-setup      bind the VF to vfio-pci; `ip link set <pf> vf <n> mac <mac> vlan <v>`
//                 undo, in this order: the original driver back, the PF's original MAC/VLAN for the VF,
//                 the re-created netdev back into the pod netns under its CNI name (for the plugin's DEL)
import { randomBytes } from 'node:crypto';
import { ErrorCode, VmpodError } from '../errors.js';
import type { CniResult } from '../cni/types.js';
import { StepName, type Op, type Step } from '../state/record.js';
import { ipv6OffStep, loUpStep } from './netnssteps.js';
import type { VfSetupRecord } from '../devices/vf.js';
import {
  BRIDGE_IP,
  BRIDGE_PREFIX,
  bridgeName,
  tapName,
  type Observed,
  type ObservedAddr,
  type ObservedLink,
  type ObservedRoute,
} from './types.js';
import type { PodInterface } from '../state/types.js';
import { hasSandbox, nonKernelRoutes } from './result.js';
import { guestFromCni, type Lease6 } from '../dhcp/lease.js';
import { formatIpv6, linkLocalFromMac } from '../net/ipv6.js';
import { filterTable } from './filter.js';
import { Binding, chooseBinding, MAC_BOUND_KINDS } from './binding.js';
import { planTcRedirect, preparedTapOps } from './tcredirect.js';
import { makeTapOps } from './tapmake.js';

/** Linux IFNAMSIZ is 16 including the NUL. */
export const MAX_IFNAME = 15;

const ip = (...args: string[]): Extract<Op, { op: 'ip' }> => ({ op: 'ip', args });

/** A random unicast, locally administered MAC (first octet 0x02: U/L bit set, I/G bit clear; IEEE 802). */
export function randomLaaMac(bytes: Buffer = randomBytes(5)): string {
  return ['02', ...[...bytes.subarray(0, 5)].map((b) => b.toString(16).padStart(2, '0'))].join(':');
}

/** iproute2 shows an IPv6 default route as "default", which `ip route del/replace` would read as IPv4. */
function dstArg(r: ObservedRoute, v6: boolean): string {
  return v6 && r.dst === 'default' ? '::/0' : r.dst;
}

function routeDel(r: ObservedRoute, dev: string, v6 = false): string[] {
  return [
    'route',
    'del',
    dstArg(r, v6),
    ...(r.gateway ? ['via', r.gateway] : []),
    'dev',
    dev,
    ...(r.metric !== undefined ? ['metric', String(r.metric)] : []),
  ];
}

function routeRestore(r: ObservedRoute, dev: string, v6 = false): string[] {
  return [
    'route',
    'replace',
    dstArg(r, v6),
    ...(r.gateway ? ['via', r.gateway] : []),
    'dev',
    dev,
    ...(r.protocol ? ['proto', r.protocol] : []),
    ...(r.scope ? ['scope', r.scope] : []),
    ...(r.prefsrc ? ['src', r.prefsrc] : []),
    ...(r.metric !== undefined ? ['metric', String(r.metric)] : []),
    ...(r.flags.includes('onlink') ? ['onlink'] : []),
  ];
}

function addrRestore(a: ObservedAddr, dev: string, v6 = false): string[] {
  return [
    'addr',
    'replace',
    `${a.local}/${a.prefixlen}`,
    ...(a.broadcast ? ['broadcast', a.broadcast] : []),
    ...(a.scope && a.scope !== 'global' ? ['scope', a.scope] : []),
    'dev',
    dev,
    ...(v6 ? ['nodad'] : []),
  ];
}

/**
 * ebtables rules (bridge family, in the pod netns) that keep DHCP off the CNI link (docs/networking.md, Virtlet's step
 * 4; Virtlet used ebtables too). Egress: nothing to udp/67 or udp/68 leaves through the veth, neither forwarded from
 * the tap (FORWARD) nor sent by our server on the bridge (OUTPUT). Ingress: no udp/67 from the CNI network reaches our
 * server (INPUT) or the guest (FORWARD). Unicast renewals from the guest to 169.254.254.2 enter from the tap and are
 * not touched. (tc clsact + flower/u32 + gact was the first choice; this kernel has no cls_flower and no act_gact.)
 */
export function dhcpFilterRules(veth: string): string[][] {
  const udp = (port: number) => ['-p', 'IPv4', '--ip-proto', 'udp', '--ip-dport', String(port), '-j', 'DROP'];
  return [
    ['FORWARD', '-o', veth, ...udp(67)],
    ['FORWARD', '-o', veth, ...udp(68)],
    ['OUTPUT', '-o', veth, ...udp(67)],
    ['OUTPUT', '-o', veth, ...udp(68)],
    ['INPUT', '-i', veth, ...udp(67)],
    ['FORWARD', '-i', veth, ...udp(67)],
  ];
}

/**
 * The IPv6 rules beside dhcpFilterRules, on every tap interface (IPv4-only ones too): no DHCPv6 (udp 546/547) and no
 * router solicitation or advertisement crosses the veth either way (the guest sees exactly our RA and DHCPv6, the CNI
 * network never sees the guest's), and the kernel's copy of a DHCPv6 message from the tap to the bridge is dropped (our
 * server reads the tap's packet socket; the pod netns, which has no DHCPv6 socket, would answer a unicast one with
 * "port unreachable").
 */
export function dhcp6FilterRules(veth: string, tap: string): string[][] {
  const udp = (port: number) => ['-p', 'IPv6', '--ip6-proto', 'udp', '--ip6-dport', String(port), '-j', 'DROP'];
  const icmp = (type: string) => ['-p', 'IPv6', '--ip6-proto', 'ipv6-icmp', '--ip6-icmp-type', type, '-j', 'DROP'];
  return [
    ['FORWARD', '-o', veth, ...udp(547)],
    ['FORWARD', '-o', veth, ...udp(546)],
    ['FORWARD', '-i', veth, ...udp(546)],
    ['FORWARD', '-i', veth, ...udp(547)],
    ['FORWARD', '-o', veth, ...icmp('router-advertisement')],
    ['FORWARD', '-o', veth, ...icmp('router-solicitation')],
    ['FORWARD', '-i', veth, ...icmp('router-advertisement')],
    ['INPUT', '-i', tap, ...udp(547)],
  ];
}

/** The IPv6 lease a tap interface serves, undefined when the result gives it no IPv6 (validated: throws Config). */
export function lease6Of(result: CniResult, index: number, mac: string): Lease6 | undefined {
  const one = result.interfaces.length <= 1;
  if (!result.ips.some((e) => e.address.includes(':') && (e.interface ?? (one ? index : 0)) === index))
    return undefined;
  return guestFromCni({ result, ifIndex: index, mac }).v6;
}

export interface ContainerSidePlanInput {
  observed: Observed;
  /** the completed CNI result (result.ts completeResult) */
  result: CniResult;
  /** the veth's new MAC for interface ordinal i (random in add; the current one in recover) */
  newMac: (i: number, link: ObservedLink) => string;
  /** names of links found to be SR-IOV VFs (the effectful shell looks in sysfs) */
  vfs?: ReadonlySet<string>;
  /** SR-IOV enabled: the planned setup of each VF (by link name); a VF without one is refused */
  vfSetups?: ReadonlyMap<string, VfSetupRecord>;
  /** the CNI_IFNAME that preparedSteps made interface 0's links for (add; lo is up then), absent when none were */
  prepared?: string;
  /** the binding those links were prepared for (preparedSteps): default bridge */
  preparedFor?: Binding;
  /** the binding of tap interface i (binding.ts); default: auto's choice */
  bindingOf?: (i: number, link: ObservedLink) => Binding;
}

/** What to tell when a VF shows up and SR-IOV support is off. */
export const SRIOV_DISABLED_HINT =
  'SR-IOV support is not enabled (tapmanager --enable-sriov, env VIRTLET_SRIOV_SUPPORT=true)';

/** The one step of a VF: the record (planVfSetup) turned into ops. Undo ops run in the order listed. */
export function vfSetupStep(rec: VfSetupRecord): Step {
  const undo: Op[] = [
    {
      op: 'vf-restore-driver',
      address: rec.address,
      ...(rec.originalDriver !== undefined ? { driver: rec.originalDriver } : {}),
    },
    { op: 'vf-link', pf: rec.pfIfname, vf: rec.vfIndex, mac: rec.originalMac, vlan: rec.originalVlan },
  ];
  // a VF that was on vfio-pci (or on no driver) had no netdev, and none comes back
  if (rec.originalDriver !== undefined && rec.originalDriver !== 'vfio-pci')
    undo.push({ op: 'vf-netdev-return', address: rec.address, name: rec.ifname });
  return {
    name: StepName.VfSetup,
    target: rec.ifname,
    do: [
      { op: 'vf-bind', address: rec.address },
      { op: 'vf-link', pf: rec.pfIfname, vf: rec.vfIndex, mac: rec.mac, vlan: rec.vlan },
    ],
    undo,
  };
}

/**
 * The VLAN a VF gets from the CNI config: sriov-cni's `vlan` (an integer) in a plugin of type "sriov".
 * undefined when no such plugin says.
 */
export function vlanFromConf(plugins: readonly { type: string; [k: string]: unknown }[]): number | undefined {
  for (const p of plugins) {
    if (p.type === 'sriov' && typeof p['vlan'] === 'number' && Number.isInteger(p['vlan'])) return p['vlan'];
  }
  return undefined;
}

/**
 * Interface i's bridge: its MTU, ageing_time 0 (learning off: Flannel), 169.254.254.2/24; with `v6`, a fixed MAC (a
 * bridge's own follows its ports) and a link-local made from it, usable at once (nodad). Without `mtu` it is the
 * kernel's default until the plan sets it (preparedSteps).
 */
function bridgeStep(br: string, mtu?: string, v6?: { mac: string; ip6: string }): Step {
  const mtuArgs = mtu === undefined ? [] : ['mtu', mtu];
  return {
    name: StepName.Bridge,
    target: br,
    do: v6
      ? [
          ip('link', 'add', 'name', br, 'address', v6.mac, ...mtuArgs, 'type', 'bridge', 'ageing_time', '0'),
          ip('link', 'set', 'dev', br, 'addrgenmode', 'none'),
          ip('addr', 'add', `${BRIDGE_IP}/${BRIDGE_PREFIX}`, 'dev', br),
          ip('addr', 'add', `${v6.ip6}/64`, 'dev', br, 'nodad'),
        ]
      : [
          ip('link', 'add', 'name', br, ...mtuArgs, 'type', 'bridge', 'ageing_time', '0'),
          ip('addr', 'add', `${BRIDGE_IP}/${BRIDGE_PREFIX}`, 'dev', br),
        ],
    undo: [{ ...ip('link', 'del', 'dev', br), withNetns: true }],
  };
}

/** Interface i's tap (tapmake.ts), down; its MTU comes with its link-up (linksUpStep). */
function tapStep(tap: string): Step {
  return {
    name: StepName.Tap,
    target: tap,
    do: makeTapOps(tap),
    undo: [{ ...ip('link', 'del', 'dev', tap), withNetns: true }],
  };
}

/**
 * The DHCP filter of CNI link `veth` and its tap. The IPv6 rules go on an IPv4-only interface too: a guest that
 * solicits DHCPv6 or routers anyway (many do) must not reach the CNI network's, nor take its answers: it gets exactly
 * the CNI result, which has no IPv6. The rules match links by name, so the table can be made before the links exist.
 */
function dhcpFilterStep(veth: string, tap: string): Step {
  const table = filterTable(veth);
  return {
    name: StepName.DhcpFilter,
    target: veth,
    do: [{ op: 'nft', table, rules: [...dhcpFilterRules(veth), ...dhcp6FilterRules(veth, tap)] }],
    undo: [{ op: 'nft-del', table, withNetns: true }],
  };
}

/**
 * What add makes in the new pod netns while the CNI plugins run, as none of it depends on their result: lo up and
 * interface 0's tap (without MTU; down, but for tc-redirect, which also makes the tap's side of it and brings it up:
 * tcredirect.ts preparedTapOps);
 * for the bridge binding its bridge (down, without MTU, the tap its port) and the DHCP filter of the link the plugins
 * make as CNI_IFNAME `veth`.
 * The plan (input `prepared`, `preparedFor`) finishes them when its first interface is that link and gets that
 * binding, and deletes them first otherwise (dropPreparedStep).
 */
export function preparedSteps(veth: string, binding: Binding = Binding.Bridge): Step[] {
  const tap = tapStep(tapName(0));
  if (binding === Binding.TcRedirect) {
    tap.do.push(...preparedTapOps(tapName(0)));
    return [loUpStep(), tap];
  }
  // the tap is a port of the bridge from the start (the veth joins it once the plugins made it)
  tap.do.push(ip('link', 'set', 'dev', tapName(0), 'master', bridgeName(0)));
  return [loUpStep(), bridgeStep(bridgeName(0)), tap, dhcpFilterStep(veth, tapName(0))];
}

/**
 * The prepared links deleted: the result's first interface is not the one they were made for, or gets the other
 * binding. Each link deletion waits for RCU grace periods (tens of ms), which is why add prepares for the binding it
 * expects (binding.ts expectedBinding).
 */
export function dropPreparedStep(veth: string, preparedFor: Binding = Binding.Bridge): Step {
  const tcRedirect = preparedFor === Binding.TcRedirect;
  return {
    name: StepName.DropPrepared,
    target: tcRedirect ? tapName(0) : bridgeName(0),
    do: tcRedirect
      ? [ip('link', 'del', 'dev', tapName(0))]
      : [
          ip('link', 'del', 'dev', bridgeName(0)),
          ip('link', 'del', 'dev', tapName(0)),
          { op: 'nft-del', table: filterTable(veth) },
        ],
    undo: [],
  };
}

export interface ContainerSidePlan {
  interfaces: PodInterface[];
  steps: Step[];
  /**
   * The DHCP servers can start while the steps are applied (add's whileApplying): every bridge and tap they bind to
   * exists before it runs (made while the plugins ran), and every tap that RA and DHCPv6 servers read is up (they read
   * it through a packet socket, which a link still down fails: ENETDOWN): a prepared tc-redirect tap is, a prepared
   * bridge binding's is not.
   */
  dhcpEarly: boolean;
}

/** How interface 0's links come to be: finished (made while the plugins ran: preparedSteps) or made by the plan. */
type LinksMade = 'prepared' | 'new';

/** Steps for every CNI interface with a sandbox, in apply order (lo up first). */
export function planContainerSide(input: ContainerSidePlanInput): ContainerSidePlan {
  const { observed, result } = input;
  const first = result.interfaces.find(hasSandbox);
  const firstLink = observed.links.find((l) => l.name === first?.name);
  const bindingOf = input.bindingOf ?? ((_i: number, link: ObservedLink) => chooseBinding('auto', link));
  // the prepared links fit interface 0 when it is the link they were made for and gets the binding they were made for
  const firstLinks: LinksMade =
    input.prepared !== undefined &&
    first?.name === input.prepared &&
    !input.vfs?.has(first.name) &&
    firstLink !== undefined &&
    bindingOf(0, firstLink) === (input.preparedFor ?? Binding.Bridge)
      ? 'prepared'
      : 'new';
  const steps = planStart(input, firstLinks);
  const interfaces: PodInterface[] = [];
  const names = new Set(observed.links.map((l) => l.name));
  // ours: not a conflict (when they do not fit, planStart deletes them before anything is made in their names)
  if (input.prepared !== undefined) for (const n of [bridgeName(0), tapName(0)]) names.delete(n);
  let ordinal = 0;
  result.interfaces.forEach((ci, index) => {
    if (!hasSandbox(ci)) return;
    const i = ordinal++;
    const link = observed.links.find((l) => l.name === ci.name);
    if (!link) {
      throw new VmpodError(
        ErrorCode.Netlink,
        `the CNI result names interface ${ci.name} in the pod netns, but the netns has no such link (links: ` +
          `${[...names].join(', ')})`,
        { op: 'plan' },
      );
    }
    const one = input.vfs?.has(link.name)
      ? planVf(input, link, index)
      : planTap(input, link, index, i, i === 0 ? firstLinks : 'new', names, bindingOf(i, link));
    steps.push(...one.steps);
    interfaces.push(one.iface);
  });
  if (interfaces.length === 0) {
    throw new VmpodError(ErrorCode.Cni, 'the CNI result has no interface in the pod netns', { op: 'plan' });
  }
  const taps = interfaces.filter((i) => i.type === 'tap');
  // a tc-redirect interface's DHCP server binds to its tap, the bridge binding's to its bridge
  const dhcpEarly =
    firstLinks === 'prepared' &&
    taps.every((i) =>
      i.binding === Binding.TcRedirect
        ? i.tapName === tapName(0)
        : i.bridgeName === bridgeName(0) && i.bridgeIp6 === undefined,
    );
  return { interfaces, steps, dhcpEarly };
}

/**
 * The steps before any interface's: IPv6 off when the result has none (before the veths' MACs change), lo up unless it
 * was prepared, and the prepared links deleted when interface 0 is not the link they were made for. First, so that
 * the links' rtnetlink lines that follow stay one batch.
 */
function planStart(input: ContainerSidePlanInput, firstLinks: LinksMade): Step[] {
  const steps: Step[] = [];
  if (input.result.ips.every((a) => !a.address.includes(':'))) steps.push(ipv6OffStep());
  if (input.prepared === undefined) steps.push(loUpStep());
  else if (firstLinks === 'new') steps.push(dropPreparedStep(input.prepared, input.preparedFor));
  return steps;
}

/** The tap made while the plugins ran, as observed: the plan takes its MAC and MTU. */
function preparedTap(observed: Observed, tap: string): ObservedLink {
  const link = observed.links.find((l) => l.name === tap);
  if (!link)
    throw new VmpodError(ErrorCode.Netlink, `the tap ${tap} made while the plugins ran is not in the pod netns`, {
      op: 'plan',
    });
  return link;
}

/** A VF gets no bridge or tap: it is bound to vfio-pci and passed through to the VM by its PCI address. */
function planVf(
  input: ContainerSidePlanInput,
  link: ObservedLink,
  index: number,
): { steps: Step[]; iface: PodInterface } {
  const vf = input.vfSetups?.get(link.name);
  if (!vf)
    throw new VmpodError(ErrorCode.Device, `interface ${link.name} is an SR-IOV VF; ${SRIOV_DISABLED_HINT}`, {
      op: 'plan',
    });
  const iface: PodInterface = {
    index,
    cniName: link.name,
    type: 'vf',
    vmMac: vf.mac,
    mtu: link.mtu,
    tapName: '',
    bridgeName: '',
    bridgeIp: '',
    pciAddress: vf.address,
    vlanId: vf.vlan,
    vf,
  };
  return { steps: [vfSetupStep(vf)], iface };
}

/** Interface ordinal i (result index `index`) becomes veth + br<i> + tap<i>. */
function planTap(
  input: ContainerSidePlanInput,
  link: ObservedLink,
  index: number,
  i: number,
  made: LinksMade,
  names: ReadonlySet<string>,
  binding: Binding,
): { steps: Step[]; iface: PodInterface } {
  const tap = tapName(i);
  const br = bridgeName(i);
  for (const n of [tap, br]) {
    if (names.has(n))
      throw new VmpodError(
        ErrorCode.Conflict,
        `the pod netns already has a link named ${n}; it is reserved for the VM's interface ${i}`,
        { op: 'plan' },
      );
  }
  if (Buffer.byteLength(link.name) > MAX_IFNAME)
    throw new VmpodError(ErrorCode.Netlink, `link name ${link.name} is longer than ${MAX_IFNAME} bytes`, {
      op: 'plan',
    });
  const v = link.name;
  const mtu = String(link.mtu);
  const mac = input.newMac(i, link);
  const v6 = lease6Of(input.result, index, link.mac);
  const bridgeMac = mac.toLowerCase();
  const bridgeIp6 = v6 ? formatIpv6(linkLocalFromMac(bridgeMac)) : undefined;
  const strip = stripSteps(input.observed, link, v6 !== undefined);
  if (binding === Binding.TcRedirect) {
    // a veth's network (a bridge CNI, ptp) sends no RAs: the pod netns routes the VM's IPv6, as the bridge binding's
    // does; a macvlan's or ipvlan's VM is on a LAN whose routers advertise themselves
    const routed = v6 !== undefined && !MAC_BOUND_KINDS.has(link.kind ?? '');
    // the tap made while the plugins ran keeps the MAC the kernel gave it
    const madeTap = made === 'prepared' ? preparedTap(input.observed, tap) : undefined;
    const tc = planTcRedirect({
      i,
      index,
      link,
      tapMac: madeTap?.mac ?? mac,
      v6: v6 !== undefined,
      routed,
      ...(madeTap ? { madeTap } : {}),
    });
    return { steps: [...strip, ...tc.steps, ...(routed ? ipv6Steps(v, v6) : [])], iface: tc.iface };
  }
  const steps = [...strip, ...vethMacSteps(link, mac, v6 !== undefined)];
  const ip6 = bridgeIp6 === undefined ? undefined : { mac: bridgeMac, ip6: bridgeIp6 };
  steps.push(...(made === 'prepared' ? finishPreparedSteps(v, br, tap, mtu, ip6) : newLinkSteps(v, br, tap, mtu, ip6)));
  if (v6) steps.push(...ipv6Steps(br, v6));
  const iface: PodInterface = {
    index,
    cniName: v,
    type: 'tap',
    binding: Binding.Bridge,
    vmMac: link.mac.toLowerCase(),
    vethMacNew: mac.toLowerCase(),
    mtu: link.mtu,
    tapName: tap,
    multiQueue: true,
    bridgeName: br,
    bridgeIp: BRIDGE_IP,
    ...(bridgeIp6 ? { bridgeMac, bridgeIp6 } : {}),
    vlanId: 0,
  };
  return { steps, iface };
}

/** The veth's non-kernel routes, then its addresses (IPv6 ones too when `v6`), each put back by its undo. */
function stripSteps(observed: Observed, link: ObservedLink, v6: boolean): Step[] {
  const v = link.name;
  const steps: Step[] = [];
  const routes = nonKernelRoutes(observed.routes4, v);
  const routes6 = v6 ? nonKernelRoutes(observed.routes6 ?? [], v) : [];
  if (routes.length + routes6.length > 0) {
    steps.push({
      name: StepName.StripRoutes,
      target: v,
      do: [...routes.map((r) => ip(...routeDel(r, v))), ...routes6.map((r) => ip(...routeDel(r, v, true)))],
      undo: [...routes.map((r) => ip(...routeRestore(r, v))), ...routes6.map((r) => ip(...routeRestore(r, v, true)))],
    });
  }
  const addrs6 = v6 ? (link.addrs6 ?? []) : [];
  if (link.addrs4.length + addrs6.length > 0) {
    steps.push({
      name: StepName.StripAddrs,
      target: v,
      do: [...link.addrs4, ...addrs6].map((a) => ip('addr', 'del', `${a.local}/${a.prefixlen}`, 'dev', v)),
      undo: [...link.addrs4.map((a) => ip(...addrRestore(a, v))), ...addrs6.map((a) => ip(...addrRestore(a, v, true)))],
    });
  }
  return steps;
}

/**
 * The veth's new MAC (the VM's NIC takes its original one). IPv6: a MAC change keeps the link-local made from the old
 * MAC, which is the VM's own link-local now: the veth gives it up and makes none (its undo puts the kernel's default,
 * EUI-64 of the original MAC, back).
 */
function vethMacSteps(link: ObservedLink, mac: string, v6: boolean): Step[] {
  if (mac.toLowerCase() === link.mac.toLowerCase() && !v6) return [];
  const v = link.name;
  const do6 = v6
    ? [
        ip('link', 'set', 'dev', v, 'addrgenmode', 'none'),
        ...(link.linkLocal6 ?? []).map((a) => ip('addr', 'del', `${a.local}/${a.prefixlen}`, 'dev', v)),
      ]
    : [];
  const undo6 = v6
    ? [
        ip('link', 'set', 'dev', v, 'addrgenmode', 'eui64'),
        ip('addr', 'replace', `${formatIpv6(linkLocalFromMac(link.mac.toLowerCase()))}/64`, 'dev', v, 'nodad'),
      ]
    : [];
  return [
    {
      name: StepName.VethMac,
      target: v,
      do: [ip('link', 'set', 'dev', v, 'address', mac), ...do6],
      undo: [ip('link', 'set', 'dev', v, 'address', link.mac), ...undo6],
    },
  ];
}

/**
 * The veth joins the bridge, up (one request: the kernel sets the flags, then the master), and the tap too when it is
 * new. The veth leaves the bridge when either goes (a bridge port's removal waits for an RCU grace period under
 * rtnl_lock, and the netns removal takes the bridge with all its ports at once): its undo is left to the netns removal.
 */
function enslaveStep(v: string, br: string, tap?: string): Step {
  return {
    name: StepName.Enslave,
    target: v,
    do: [
      ip('link', 'set', 'dev', v, 'master', br, 'up'),
      ...(tap === undefined ? [] : [ip('link', 'set', 'dev', tap, 'master', br)]),
    ],
    undo: [{ ...ip('link', 'set', 'dev', v, 'nomaster'), withNetns: true }],
  };
}

/** The tap, then the bridge, up, each with the CNI link's MTU in the same request. */
function linksUpStep(br: string, tap: string, mtu: string): Step {
  return {
    name: StepName.LinksUp,
    target: br,
    do: [tap, br].map((n) => ip('link', 'set', 'dev', n, 'mtu', mtu, 'up')),
    undo: [],
  };
}

/** br<i> and tap<i> made now, the veth and the tap its ports, all up, and the veth's DHCP filter. */
function newLinkSteps(v: string, br: string, tap: string, mtu: string, v6?: { mac: string; ip6: string }): Step[] {
  return [
    bridgeStep(br, mtu, v6),
    tapStep(tap),
    enslaveStep(v, br, tap),
    linksUpStep(br, tap, mtu),
    dhcpFilterStep(v, tap),
  ];
}

/**
 * Interface 0's bridge, tap and filter, made while the plugins ran (preparedSteps) down, without MTU or IPv6: finished.
 */
function finishPreparedSteps(
  v: string,
  br: string,
  tap: string,
  mtu: string,
  v6?: { mac: string; ip6: string },
): Step[] {
  const bridge6 = v6
    ? [
        ip('link', 'set', 'dev', br, 'address', v6.mac),
        ip('link', 'set', 'dev', br, 'addrgenmode', 'none'),
        ip('addr', 'add', `${v6.ip6}/64`, 'dev', br, 'nodad'),
      ]
    : [];
  return [
    ...(v6 ? [{ name: StepName.Bridge, target: br, do: bridge6, undo: [] }] : []),
    enslaveStep(v, br),
    linksUpStep(br, tap, mtu),
  ];
}

/**
 * IPv6 forwarding on (the bridge answers NS as a router; under tc-redirect the RA server does), the result's prefix
 * and routes through `dev` (the bridge, or under tc-redirect the interface itself).
 */
function ipv6Steps(dev: string, v6: Lease6): Step[] {
  const routeOps = [
    ip('route', 'replace', `${v6.prefix}/${v6.prefixLength}`, 'dev', dev),
    ...v6.routes
      .filter((r) => r.dst !== `${v6.prefix}/${v6.prefixLength}`)
      .map((r) => ip('route', 'replace', r.dst, ...(r.gw ? ['via', r.gw] : []), 'dev', dev)),
  ];
  return [
    {
      name: StepName.Ipv6Forwarding,
      target: dev,
      do: [{ op: 'sysctl', settings: ['net.ipv6.conf.all.forwarding=1'] }],
      // off again before the interface's addresses are put back for the DEL: a global address added while forwarding
      // is on joins its subnet-router anycast address, and the link's deletion in the DEL then waits an RCU barrier
      undo: [{ op: 'sysctl', settings: ['net.ipv6.conf.all.forwarding=0'] }],
    },
    {
      name: StepName.Ipv6Routes,
      target: dev,
      do: routeOps,
      undo: routeOps.map((o) => ({ ...ip('route', 'del', ...o.args.slice(2)), withNetns: true as const })),
    },
  ];
}
