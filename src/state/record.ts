// The persisted per-pod record (DESIGN.md: "every setup step is recorded before it is applied, with how to
// undo it"). Teardown, failed-ADD rollback and restart recovery read only this record, so they undo exactly
// what was done, even after a crash halfway through an ADD. Pure: types, the step vocabulary and the parser.
import { ErrorCode, VmpodError } from '../errors.js';
import { isObj } from '../guards.js';
import type { PodNetworkDesc, ContainerSideNetwork, CniResultV031 } from '../protocol/payloads.js';
import type { PodInterface } from './types.js';

export const RECORD_KIND = 'vmpodPodV1' as const;

/** Every step of a pod network setup, in the order add applies them. */
export const StepName = {
  Netns: 'netns',
  /** rp_filter off in the pod netns (netnssteps.ts rpFilterStep), before CNI ADD and before our bridges */
  RpFilter: 'rp-filter',
  LoUp: 'lo-up',
  CniAdd: 'cni-add',
  StripRoutes: 'strip-routes',
  StripAddrs: 'strip-addrs',
  VethMac: 'veth-mac',
  Bridge: 'bridge',
  Tap: 'tap',
  Enslave: 'enslave',
  LinksUp: 'links-up',
  DhcpFilter: 'dhcp-filter',
  /**
   * IPv6 off in the pod netns of a pod without IPv6 (netnssteps.ts ipv6OffStep): its links make no link-local
   * address and send no MLD report, router solicitation or DAD probe (which the node's bridge floods to every pod)
   */
  Ipv6Off: 'ipv6-off',
  /** IPv6 forwarding on in the pod netns: the bridge's link-local answers the guest's NS as a router */
  Ipv6Forwarding: 'ipv6-forwarding',
  /** the pod prefix on-link and the CNI result's IPv6 routes via br<i>: where the guest's IPv6 goes */
  Ipv6Routes: 'ipv6-routes',
  /** an SR-IOV VF handed to the VM: vfio-pci binding and the VF's MAC/VLAN on its PF (host side) */
  VfSetup: 'vf-setup',
  /**
   * the bridge, tap and filter made while the CNI plugins ran (plan.ts preparedSteps) deleted, as the result's first
   * interface is not the one they were made for (an SR-IOV VF, or a plugin that names it otherwise)
   */
  DropPrepared: 'drop-prepared',
  /** tc-redirect binding: the CNI interface's IPv6 link-local given up (the VM has the same one: same MAC) */
  LinkLocalOff: 'link-local-off',
  /** tc-redirect binding: ingress qdiscs and u32 filters redirecting the CNI interface and its tap to each other */
  TcRedirect: 'tc-redirect',
} as const;
export type StepName = (typeof StepName)[keyof typeof StepName];

/**
 * One operation. `ip`, `nft` and `ebtables` run inside the pod netns; `ip` args are one line of `ip -batch` (run as
 * rtnetlink requests, src/podnet/iplines.ts).
 * Undo ops must tolerate "already undone" (a batch can fail halfway, a crash can come between record and apply).
 * `withNetns` marks an undo op whose object lives only inside the pod netns (tap, bridge, filter table): when
 * the same undo run deletes the netns, the kernel removes it anyway and the op is skipped (deleting a bridge
 * waits for RCU grace periods under rtnl_lock; the netns cleanup does it off our path).
 */
export type Op =
  | { op: 'netns-add'; name: string }
  | { op: 'netns-del'; name: string }
  | { op: 'ip'; args: string[]; withNetns?: true }
  // one `tc` command line (without "tc"), run as its rtnetlink request in the same batch as the ip lines (tclines.ts)
  | { op: 'tc'; args: string[]; withNetns?: true }
  // records of versions before the nf_tables filter: their rules are deleted with ebtables
  | { op: 'ebtables'; args: string[]; withNetns?: true }
  // the DHCP filter: nf_tables table `table` (bridge family) in the pod netns with these rules, in ebtables' words
  | { op: 'nft'; table: string; rules: string[][] }
  | { op: 'nft-del'; table: string; withNetns?: true }
  // `sysctl -w` of each "name=value" inside the pod netns (/proc/sys/net is the opener's netns)
  | { op: 'sysctl'; settings: string[] }
  | { op: 'cni-add'; ifName: string }
  // `config`: the network config list the ADD ran with (its JSON bytes, base64, as libcni's cache keeps it), so
  // that DEL runs against the network the ADD used whatever the config dir holds by then
  | { op: 'cni-del'; ifName: string; config?: string }
  // SR-IOV (host side, src/devices): bind the VF to vfio-pci (driver/unbind, driver_override, drivers_probe)
  | { op: 'vf-bind'; address: string }
  // undo of vf-bind: clear driver_override and re-probe, so the kernel hands the VF back to `driver`
  | { op: 'vf-restore-driver'; address: string; driver?: string }
  // `ip link set <pf> vf <vf> mac <mac> vlan <vlan>` in the host netns (the PF enforces them on the VF)
  | { op: 'vf-link'; pf: string; vf: number; mac: string; vlan: number }
  // undo only: the netdev the re-bound VF driver creates (host netns, kernel name) goes back into the pod
  // netns (the record's key) under `name`, as the CNI plugin left it, so that its DEL finds it
  | { op: 'vf-netdev-return'; address: string; name: string };

export interface Step {
  name: StepName;
  /** the object the step works on (a link name), for messages */
  target?: string;
  do: Op[];
  undo: Op[];
}

export const Phase = { Adding: 'adding', Ready: 'ready', Releasing: 'releasing' } as const;

/** Why a record is quarantined: the rollback of a failed add (or a release) that could not finish. */
export interface Quarantine {
  /** ISO time of the last attempt */
  at: string;
  /** what could not be undone, one message per failed undo */
  errors: string[];
}
export type Phase = (typeof Phase)[keyof typeof Phase];

export interface PodRecord {
  kind: typeof RECORD_KIND;
  key: string;
  desc: PodNetworkDesc;
  nsPath: string;
  phase: Phase;
  /** each applied-or-about-to-be-applied step, with its undo, in apply order */
  steps: Step[];
  /** CNI_IFNAME of each CNI ADD made (one per network list) */
  cniIfNames: string[];
  result?: CniResultV031;
  csn?: ContainerSideNetwork;
  interfaces: PodInterface[];
  createdAt: string;
  /**
   * Set when undoing the record failed partway (phase releasing): what is left is finished first by the next add
   * or release of the key (or by `tapctl release --force`); the key is not blocked by it.
   */
  quarantine?: Quarantine;
}

/** A new record: what the caller knows, interfaces empty unless given, createdAt now. */
export function newRecord(
  fields: Pick<PodRecord, 'key' | 'desc' | 'nsPath' | 'phase' | 'steps' | 'cniIfNames'> &
    Partial<Pick<PodRecord, 'interfaces' | 'result' | 'csn'>>,
): PodRecord {
  const { interfaces = [], result, csn, ...rest } = fields;
  return {
    kind: RECORD_KIND,
    ...rest,
    ...(result ? { result } : {}),
    ...(csn ? { csn } : {}),
    interfaces,
    createdAt: new Date().toISOString(),
  };
}

const PHASES: readonly string[] = Object.values(Phase);
const STEP_NAMES: readonly string[] = Object.values(StepName);
const OP_NAMES: readonly string[] = [
  'netns-add',
  'netns-del',
  'ip',
  'tc',
  'ebtables',
  'nft',
  'nft-del',
  'sysctl',
  'cni-add',
  'cni-del',
  'vf-bind',
  'vf-restore-driver',
  'vf-link',
  'vf-netdev-return',
];

function opProblems(o: unknown, where: string): string[] {
  if (!isObj(o) || typeof o.op !== 'string' || !OP_NAMES.includes(o.op)) return [`${where}: not an op`];
  if (
    (o.op === 'ip' || o.op === 'tc' || o.op === 'ebtables') &&
    !(Array.isArray(o.args) && o.args.every((a) => typeof a === 'string'))
  ) {
    return [`${where}: ${o.op} op without string args`];
  }
  if (
    o.op === 'sysctl' &&
    !(Array.isArray(o.settings) && o.settings.every((a) => typeof a === 'string' && /^[\w./-]+=\S+$/.test(a)))
  ) {
    return [`${where}: sysctl op without "name=value" settings`];
  }
  const need = (f: string, t: 'string' | 'number') =>
    typeof o[f] === t ? [] : [`${where}: ${o.op} op without ${t} ${f}`];
  switch (o.op) {
    case 'nft':
      return [
        ...need('table', 'string'),
        ...(Array.isArray(o.rules) && o.rules.every((r) => Array.isArray(r) && r.every((a) => typeof a === 'string'))
          ? []
          : [`${where}: nft op without rules`]),
      ];
    case 'nft-del':
      return need('table', 'string');
    case 'vf-bind':
      return need('address', 'string');
    case 'vf-restore-driver':
      return [...need('address', 'string'), ...(o.driver === undefined ? [] : need('driver', 'string'))];
    case 'vf-link':
      return [...need('pf', 'string'), ...need('vf', 'number'), ...need('mac', 'string'), ...need('vlan', 'number')];
    case 'vf-netdev-return':
      return [...need('address', 'string'), ...need('name', 'string')];
    case 'cni-del':
      return [...need('ifName', 'string'), ...(o.config === undefined ? [] : need('config', 'string'))];
  }
  return [];
}

/** Every problem of a parsed record (empty when it is good). */
export function recordProblems(x: unknown, key: string): string[] {
  if (!isObj(x)) return ['not a JSON object'];
  const p: string[] = [];
  if (x.kind !== RECORD_KIND) p.push(`kind is ${JSON.stringify(x.kind)}, expected "${RECORD_KIND}"`);
  if (x.key !== key) p.push(`key is ${JSON.stringify(x.key)}, expected ${JSON.stringify(key)}`);
  if (typeof x.phase !== 'string' || !PHASES.includes(x.phase))
    p.push(`phase ${JSON.stringify(x.phase)} is not one of ${PHASES.join(', ')}`);
  if (typeof x.nsPath !== 'string') p.push('nsPath is not a string');
  if (!isObj(x.desc)) p.push('desc is not an object');
  if (!Array.isArray(x.cniIfNames)) p.push('cniIfNames is not an array');
  if (!Array.isArray(x.interfaces)) p.push('interfaces is not an array');
  if (!Array.isArray(x.steps)) p.push('steps is not an array');
  else
    x.steps.forEach((s, i) => {
      if (!isObj(s) || typeof s.name !== 'string' || !STEP_NAMES.includes(s.name))
        p.push(`steps[${i}]: unknown step ${JSON.stringify(isObj(s) ? s.name : s)}`);
      else if (!Array.isArray(s.do) || !Array.isArray(s.undo))
        p.push(`steps[${i}] (${s.name}): do/undo are not arrays`);
      else {
        s.do.forEach((o, j) => p.push(...opProblems(o, `steps[${i}].do[${j}]`)));
        s.undo.forEach((o, j) => p.push(...opProblems(o, `steps[${i}].undo[${j}]`)));
      }
    });
  return p;
}

/** Parses a record file's text; throws VmpodError(State) naming the file and every problem. */
export function parseRecord(text: string, key: string, path: string): PodRecord {
  let x: unknown;
  try {
    x = JSON.parse(text);
  } catch (e) {
    throw new VmpodError(ErrorCode.State, `state record ${path} for key ${key} is corrupt: not JSON`, {
      cause: e,
      key,
      op: 'state-read',
    });
  }
  const problems = recordProblems(x, key);
  if (problems.length > 0) {
    throw new VmpodError(ErrorCode.State, `state record ${path} for key ${key} is corrupt: ${problems.join('; ')}`, {
      key,
      op: 'state-read',
    });
  }
  return x as PodRecord;
}
