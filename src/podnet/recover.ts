// Records rebuilt without the one add wrote (pure): recover's, from the runtime's csn and the live netns (Virtlet's
// recover did the same), and release's by convention when the record is lost or unreadable.
import { ErrorCode, VmpodError } from '../errors.js';
import type { ContainerSideNetwork, PodNetworkDesc } from '../protocol/payloads.js';
import { InterfaceType } from '../protocol/payloads.js';
import { fromV031 } from '../protocol/result.js';
import type { CniResult } from '../cni/types.js';
import { Phase, newRecord, type PodRecord } from '../state/record.js';
import { SRIOV_DISABLED_HINT, planContainerSide } from './plan.js';
import { cniAddStep, podNetnsSteps } from './netnssteps.js';
import { observedBeforeFromCsn } from './csn.js';
import { hasSandbox } from './result.js';
import { bridgeName, tapName, type Observed } from './types.js';
import { Binding } from './binding.js';

/** The steps every pod network starts with: its netns (and sysctls), then the CNI ADD of `ifName`. */
export function baseSteps(key: string, ifName: string): PodRecord['steps'] {
  return [...podNetnsSteps(key), cniAddStep(ifName)];
}

/** What can be undone without a record: CNI DEL and the netns. */
export function conventionRecord(key: string, nsPath: string, ifName: string, desc: PodNetworkDesc): PodRecord {
  return newRecord({ key, desc, nsPath, phase: Phase.Releasing, steps: baseSteps(key, ifName), cniIfNames: [ifName] });
}

/** The CNI result recover plans with: the csn's, with its interfaces made sandboxed and ips indexed. */
export function resultForRecover(csn: ContainerSideNetwork, nsPath: string): CniResult {
  const r: CniResult = csn.Result
    ? fromV031(csn.Result)
    : { cniVersion: '0.3.1', interfaces: [], ips: [], routes: [], dns: {} };
  for (const ni of csn.Interfaces) {
    const ci = r.interfaces.find((c) => c.name === ni.Name);
    if (ci) {
      if (!hasSandbox(ci)) ci.sandbox = nsPath;
    } else r.interfaces.push({ name: ni.Name, sandbox: nsPath });
  }
  const firstIdx = r.interfaces.findIndex((c) => c.name === csn.Interfaces[0]?.Name);
  for (const ip of r.ips) if (ip.interface === undefined) ip.interface = firstIdx;
  // only the csn's interfaces become taps again
  const names = new Set(csn.Interfaces.map((i) => i.Name));
  r.interfaces = r.interfaces.map((c) => (names.has(c.name) ? c : { ...c, sandbox: '' }));
  return r;
}

/** What recover refuses before it looks at the netns: a VF (no record, nothing to restore it from), no interfaces. */
export function checkRecoverCsn(key: string, csn: ContainerSideNetwork, enableSriov: boolean): void {
  const vf = csn.Interfaces.find((i) => i.Type === InterfaceType.VF);
  if (vf) {
    // what release must restore (the VF's original driver, MAC and VLAN on the PF) is in the record only
    const why = enableSriov
      ? 'its original driver, MAC and VLAN are in the state record only, and there is none'
      : SRIOV_DISABLED_HINT;
    throw new VmpodError(
      ErrorCode.Device,
      `recover ${key}: interface ${vf.Name} is an SR-IOV VF (${vf.PCIAddress}); ${why}`,
      { key, op: 'recover' },
    );
  }
  if (csn.Interfaces.length === 0)
    throw new VmpodError(ErrorCode.BadRequest, `recover ${key}: the csn has no interfaces`, { key, op: 'recover' });
}

export interface RecoverInput {
  key: string;
  nsPath: string;
  ifName: string;
  desc: PodNetworkDesc;
  csn: ContainerSideNetwork;
  /** the pod netns as it is now */
  live: Observed;
}

/**
 * The ready record of a pod network recovered from its csn: every csn interface must have its link and tap<i> in the
 * netns, and br<i> unless it has the tc-redirect binding (which makes none: its binding is told by the missing bridge);
 * the planner, given the netns as it was before add (observedBeforeFromCsn, our links left out) and the live MACs
 * (the veth's new one; under tc-redirect the tap's), yields the steps add recorded.
 */
export function recoverRecord({ key, nsPath, ifName, desc, csn, live }: RecoverInput): PodRecord {
  const names = new Set(live.links.map((l) => l.name));
  const reserved = new Set<string>();
  const redirected = new Set<number>();
  csn.Interfaces.forEach((ni, i) => {
    if (!names.has(bridgeName(i))) redirected.add(i);
    for (const n of [ni.Name, tapName(i)]) {
      if (!names.has(n))
        throw new VmpodError(
          ErrorCode.State,
          `recover ${key}: netns ${nsPath} has no link ${n}: the container-side network is not there to recover`,
          { key, op: 'recover' },
        );
    }
    reserved.add(tapName(i)).add(bridgeName(i));
  });
  const result = resultForRecover(csn, nsPath);
  const withoutOurs: Observed = { links: live.links.filter((l) => !reserved.has(l.name)), routes4: live.routes4 };
  const before = observedBeforeFromCsn(withoutOurs, result, csn);
  const liveMac = new Map(live.links.map((l) => [l.name, l.mac]));
  const plan = planContainerSide({
    observed: before,
    result,
    newMac: (i, link) => (redirected.has(i) ? liveMac.get(tapName(i)) : liveMac.get(link.name)) ?? link.mac,
    bindingOf: (i) => (redirected.has(i) ? Binding.TcRedirect : Binding.Bridge),
  });
  return newRecord({
    key,
    desc,
    nsPath,
    phase: Phase.Ready,
    steps: [...baseSteps(key, ifName), ...plan.steps],
    cniIfNames: [ifName],
    ...(csn.Result ? { result: csn.Result } : {}),
    csn: { ...csn, NsPath: nsPath },
    interfaces: plan.interfaces,
  });
}

/** What identifies a csn: its interfaces (name, type, MAC, PCI address) and the result's addresses. */
function csnIdentity(csn: ContainerSideNetwork): string {
  return JSON.stringify({
    interfaces: csn.Interfaces.map((i) => [i.Name, i.Type, i.HardwareAddr, i.PCIAddress ?? '']),
    ips: (csn.Result?.ips ?? []).map((ip) => ip.address).sort(),
  });
}

/**
 * recover of a live key: the csn the pod network was made with again is fine (the runtime retried; nothing
 * changes), another csn is an error: recover re-attaches, it never rebuilds a live pod network.
 */
export function checkSameCsn(key: string, have: ContainerSideNetwork, asked: ContainerSideNetwork): void {
  if (csnIdentity(have) === csnIdentity(asked)) return;
  throw new VmpodError(
    ErrorCode.Conflict,
    `recover ${key}: the pod network is live with another container-side network (interfaces or addresses differ ` +
      `from the csn given); release it first`,
    {
      key,
      op: 'recover',
    },
  );
}
