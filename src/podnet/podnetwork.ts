// The pod network's effectful shell: netns lifecycle, CNI ADD/DEL, the container-side network (plan.ts),
// tap fds, and the record of every step (src/state). Each step is written to the record BEFORE it is
// applied; teardown, failed-ADD rollback and restart recovery all run the recorded undo ops in reverse.
// SR-IOV VFs (enableSriov): bound to vfio-pci and configured on their PF in the host netns (vf-* ops, src/devices).
import { existsSync, openSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { ErrorCode, VmpodError, errorChain, isVmpodError, type ErrorCode as ErrorCodeT } from '../errors.js';
import type { Logger } from '../log.js';
import { native } from '../native.js';
import { validateKey } from '../protocol/key.js';
import type { PodNetworkDesc, ContainerSideNetwork, RecoverPayload } from '../protocol/payloads.js';
import { InterfaceType } from '../protocol/payloads.js';
import type { CniClient, NetworkConfigList, RuntimeConf } from '../cni/index.js';
import { Sysfs } from '../devices/sysfs.js';
import { bindToVfio, restoreDriver } from '../devices/bind.js';
import { isPciAddress } from '../devices/pci.js';
import { describeVfAt, parseVfState, planVfSetup, vfLinkArgv, type VfLinkState, type VfSetupRecord } from '../devices/vf.js';
import { fromV031, toV031 } from '../cni/result.js';
import type { CniResult } from '../cni/types.js';
import { StateStore } from '../state/store.js';
import { Phase, RECORD_KIND, StepName, type Op, type PodRecord, type Step } from '../state/record.js';
import { NetExec, isAlreadyUndone } from './exec.js';
import { parseObserved } from './observe.js';
import { completeResult, hasSandbox } from './result.js';
import { SRIOV_DISABLED_HINT, buildCsn, cniAddStep, netnsStep, observedBeforeFromCsn, planContainerSide, randomLaaMac, vlanFromConf } from './plan.js';
import { DEFAULT_IFNAME, bridgeName, tapName, type Observed, type PodInterface } from './types.js';

/** iproute2's `ip netns` keeps named netns here (NETNS_RUN_DIR, fixed at build time). */
export const IP_NETNS_DIR = '/var/run/netns';

export interface PodNetworkOptions {
  stateDir: string;
  cni: CniClient;
  loadConfList: () => Promise<NetworkConfigList>;
  log: Logger;
  /** default /var/run/netns; must be where `ip netns` keeps them (/var/run/netns or /run/netns) */
  netnsDir?: string;
  /** CNI_IFNAME, default 'virtlet-eth0' */
  ifNamePrefix?: string;
  /**
   * SR-IOV VFs: a CNI interface that is a VF is bound to vfio-pci and passed to the VM (type 1, its PCI
   * address). Off: a VF in the pod netns is a clear error (and the add is rolled back).
   */
  enableSriov?: boolean;
  /** default /sys; only used to build the default `sysfs` */
  sysfsRoot?: string;
  /** the sysfs model VFs are read and bound through (tests pass a FakeSysfs over a fake tree) */
  sysfs?: Sysfs;
  /**
   * Runs an `ip` argv (argv[0] = "ip") in the host netns and resolves with its stdout, rejecting on failure:
   * the VF's PF commands (`ip link set <pf> vf <n> mac .. vlan ..`, `ip -d -j link show dev <pf>`) and moving a
   * VF's netdev back into the pod netns. Default: NetExec. Tests inject a recorder (a dummy PF takes no `vf N`).
   */
  vfLink?: (argv: string[]) => Promise<string>;
  /** how long release waits for a re-bound VF driver to create its netdev again, default 10 s */
  vfNetdevTimeoutMs?: number;
  /** per ip/ebtables spawn, default 15 s */
  cmdTimeoutMs?: number;
}

export interface PodNetworkState {
  key: string;
  nsPath: string;
  csn: ContainerSideNetwork;
  interfaces: PodInterface[];
  /** one fd per interface, in order: the tap; for a VF /dev/null (see openFds) */
  fds: number[];
  desc: PodNetworkDesc;
}

/** A failure of one recorded step (or of a stage that is not a step, such as open-tap). */
function stepError(step: string, target: string | undefined, cause: unknown): VmpodError {
  const code: ErrorCodeT = isVmpodError(cause) ? cause.code : ErrorCode.Internal;
  return new VmpodError(code, `step "${step}"${target ? ` on ${target}` : ''} failed: ${errorChain(cause)}`, { cause, op: step });
}

const isIpOp = (o: Op): o is { op: 'ip'; args: string[] } => o.op === 'ip';
const isEbOp = (o: Op): o is { op: 'ebtables'; args: string[] } => o.op === 'ebtables';

export class PodNetwork {
  private readonly store: StateStore;
  private readonly exec: NetExec;
  private readonly states = new Map<string, PodNetworkState>();
  private readonly netnsDir: string;
  private readonly ifName: string;
  private readonly log: Logger;
  private readonly sysfs: Sysfs;
  private readonly vfLink: (argv: string[]) => Promise<string>;

  constructor(private readonly opts: PodNetworkOptions) {
    this.netnsDir = opts.netnsDir ?? IP_NETNS_DIR;
    if (![IP_NETNS_DIR, '/run/netns'].includes(resolve(this.netnsDir))) {
      // `ip netns add` and `ip -n NAME` only know NETNS_RUN_DIR; another dir would need our own bind mounts
      throw new VmpodError(ErrorCode.Config, `netnsDir ${JSON.stringify(this.netnsDir)}: only ${IP_NETNS_DIR} (or /run/netns) is supported, as iproute2's "ip netns" uses it`);
    }
    this.ifName = opts.ifNamePrefix ?? DEFAULT_IFNAME;
    this.store = new StateStore(opts.stateDir);
    this.exec = new NetExec(opts.cmdTimeoutMs);
    this.log = opts.log;
    this.sysfs = opts.sysfs ?? new Sysfs(opts.sysfsRoot ?? '/sys');
    this.vfLink =
      opts.vfLink ??
      (async (argv) => {
        if (argv[0] !== 'ip') throw new VmpodError(ErrorCode.Internal, `vfLink runs ip only, not ${JSON.stringify(argv[0])}`);
        return this.exec.ip(argv.slice(1));
      });
  }

  nsPathOf(key: string): string {
    return join(this.netnsDir, key);
  }

  // ---------------------------------------------------------------- add

  async add(key: string, desc: PodNetworkDesc, signal?: AbortSignal): Promise<PodNetworkState> {
    validateKey(key);
    const log = this.log.child({ key, op: 'add' });
    const t0 = performance.now();
    const nsPath = this.nsPathOf(key);
    if (this.states.has(key) || this.store.read(key)) {
      throw new VmpodError(ErrorCode.Conflict, `add ${key}: a pod network for this key exists; release it first`, { key, op: 'add' });
    }
    if (existsSync(nsPath)) {
      // never adopt (or, on rollback, delete) a netns we did not make
      throw new VmpodError(ErrorCode.Conflict, `add ${key}: netns ${nsPath} exists already`, { key, op: 'add' });
    }
    const rec: PodRecord = {
      kind: RECORD_KIND,
      key,
      desc,
      nsPath,
      phase: Phase.Adding,
      steps: [],
      cniIfNames: [this.ifName],
      interfaces: [],
      createdAt: new Date().toISOString(),
    };
    let fds: number[] = [];
    try {
      await this.applySteps(rec, [netnsStep(key)], signal);

      const cniStep = cniAddStep(this.ifName);
      this.record(rec, [cniStep]);
      let result: CniResult;
      let list: NetworkConfigList | undefined;
      try {
        list = await this.opts.loadConfList();
        result = await this.opts.cni.add(list, this.runtimeConf(rec, this.ifName), signal);
      } catch (e) {
        throw stepError(cniStep.name, undefined, e);
      }
      log.debug({ result, ms: Math.round(performance.now() - t0) }, 'CNI ADD done');

      let observed: Observed;
      let plan: ReturnType<typeof planContainerSide>;
      let completed: CniResult;
      try {
        observed = await this.observe(key, signal);
        completed = completeResult(result, observed, nsPath);
        const vfs = this.findVfs(observed, completed);
        const vfSetups = this.opts.enableSriov ? await this.planVfs(observed, vfs, list, log, signal) : undefined;
        plan = planContainerSide({ observed, result: completed, newMac: () => randomLaaMac(), vfs: new Set(vfs.keys()), ...(vfSetups ? { vfSetups } : {}) });
      } catch (e) {
        throw stepError('plan', undefined, e);
      }
      log.debug({ observed, steps: plan.steps.length }, 'container-side network planned');
      await this.applySteps(rec, plan.steps, signal);

      try {
        fds = this.openFds(nsPath, plan.interfaces);
      } catch (e) {
        throw stepError('open-tap', undefined, e);
      }
      const v031 = toV031(completed);
      const csn = buildCsn(v031, nsPath, plan.interfaces);
      rec.phase = Phase.Ready;
      rec.result = v031;
      rec.csn = csn;
      rec.interfaces = plan.interfaces;
      this.store.write(rec);
      const st: PodNetworkState = { key, nsPath, csn, interfaces: plan.interfaces, fds, desc };
      this.states.set(key, st);
      log.info({ durationMs: Math.round(performance.now() - t0), interfaces: plan.interfaces.map(describeIf) }, 'pod network added');
      return st;
    } catch (e) {
      this.closeFds(fds, log);
      const op = isVmpodError(e) && e.op ? e.op : 'add';
      log.error({ err: e, step: op }, 'add failed: rolling back');
      const undoErrors = await this.undoRecord(rec, log);
      let tail = '';
      if (undoErrors.length === 0) {
        try {
          this.store.remove(key);
        } catch (re) {
          log.error({ err: re }, 'removing the state record after the rollback failed');
        }
      } else {
        rec.phase = Phase.Releasing;
        this.safeWrite(rec, log);
        tail = ` (rollback incomplete, the record stays for release/restart: ${undoErrors.map((u) => errorChain(u)).join('; ')})`;
      }
      const what = e instanceof Error && e.message.startsWith('step "') ? e.message : `step "${op}" failed: ${errorChain(e)}`;
      const code: ErrorCodeT = isVmpodError(e) ? e.code : ErrorCode.Internal;
      throw new VmpodError(code, `add ${key}: ${what}${tail}`, { cause: e, key, op });
    }
  }

  // ---------------------------------------------------------------- release

  async release(key: string): Promise<void> {
    validateKey(key);
    const log = this.log.child({ key, op: 'release' });
    const t0 = performance.now();
    const nsPath = this.nsPathOf(key);
    const st = this.states.get(key);
    if (st) this.closeFds(st.fds, log);
    this.states.delete(key);
    let rec: PodRecord | undefined;
    let corrupt: unknown;
    try {
      rec = this.store.read(key);
    } catch (e) {
      corrupt = e;
      log.error({ err: e }, 'state record unreadable: releasing by convention (CNI DEL, netns removal)');
    }
    if (!rec) {
      if (!existsSync(nsPath)) {
        if (corrupt) throw corrupt;
        throw new VmpodError(ErrorCode.NotFound, `no pod network for key ${key}`, { key, op: 'release' });
      }
      // a netns without a (readable) record: an older daemon's, or a record lost; the container side cannot be
      // restored without it, but CNI DEL frees the IPAM allocation and the netns goes
      rec = this.conventionRecord(key, st?.desc ?? { podId: key, podNs: '', podName: '' });
    }
    rec.phase = Phase.Releasing;
    this.store.write(rec);
    const errors = await this.undoRecord(rec, log);
    if (errors.length > 0) {
      const first = errors[0]!;
      throw new VmpodError(isVmpodError(first) ? first.code : ErrorCode.Internal, `release ${key}: ${errors.length} undo step(s) failed, the record stays for a retry: ${errors.map((x) => errorChain(x)).join('; ')}`, {
        cause: new AggregateError(errors, `release ${key}`),
        key,
        op: 'release',
      });
    }
    this.store.remove(key);
    log.info({ durationMs: Math.round(performance.now() - t0) }, 'pod network released');
  }

  // ---------------------------------------------------------------- recover / ensureFds / restore

  /** Re-attach to an existing pod network (after a restart), without CNI ADD. */
  async recover(key: string, payload: RecoverPayload): Promise<PodNetworkState> {
    validateKey(key);
    const log = this.log.child({ key, op: 'recover' });
    const nsPath = this.nsPathOf(key);
    const have = this.states.get(key);
    if (have && have.fds.length === have.interfaces.length) return have;
    if (!existsSync(nsPath)) throw new VmpodError(ErrorCode.NotFound, `recover ${key}: netns ${nsPath} does not exist: nothing to recover`, { key, op: 'recover' });
    let rec: PodRecord | undefined;
    try {
      rec = this.store.read(key);
    } catch (e) {
      log.warn({ err: e }, 'state record unreadable: rebuilding it from the netns and the csn');
    }
    if (rec && rec.phase === Phase.Ready && rec.csn) return this.attach(rec, true);
    if (rec && rec.phase !== Phase.Ready) {
      throw new VmpodError(ErrorCode.State, `recover ${key}: the pod network was left in phase "${rec.phase}"; release it`, { key, op: 'recover' });
    }

    const csn = payload.csn;
    const vf = csn.Interfaces.find((i) => i.Type === InterfaceType.VF);
    if (vf) {
      // what release must restore (the VF's original driver, MAC and VLAN on the PF) is in the record only
      const why = this.opts.enableSriov ? 'its original driver, MAC and VLAN are in the state record only, and there is none' : SRIOV_DISABLED_HINT;
      throw new VmpodError(ErrorCode.Device, `recover ${key}: interface ${vf.Name} is an SR-IOV VF (${vf.PCIAddress}); ${why}`, { key, op: 'recover' });
    }
    if (csn.Interfaces.length === 0) throw new VmpodError(ErrorCode.BadRequest, `recover ${key}: the csn has no interfaces`, { key, op: 'recover' });
    const live = await this.observe(key);
    const names = new Set(live.links.map((l) => l.name));
    const reserved = new Set<string>();
    csn.Interfaces.forEach((ni, i) => {
      for (const n of [ni.Name, tapName(i), bridgeName(i)]) {
        if (!names.has(n)) throw new VmpodError(ErrorCode.State, `recover ${key}: netns ${nsPath} has no link ${n}: the container-side network is not there to recover`, { key, op: 'recover' });
      }
      reserved.add(tapName(i)).add(bridgeName(i));
    });
    const result = resultForRecover(csn, nsPath);
    const withoutOurs: Observed = { links: live.links.filter((l) => !reserved.has(l.name)), routes4: live.routes4 };
    const before = observedBeforeFromCsn(withoutOurs, result, csn);
    const liveMac = new Map(live.links.map((l) => [l.name, l.mac]));
    const plan = planContainerSide({ observed: before, result, newMac: (_i, link) => liveMac.get(link.name) ?? link.mac });
    const newRec: PodRecord = {
      kind: RECORD_KIND,
      key,
      desc: payload.podNetworkDesc,
      nsPath,
      phase: Phase.Ready,
      steps: [netnsStep(key), cniAddStep(this.ifName), ...plan.steps],
      cniIfNames: [this.ifName],
      ...(csn.Result ? { result: csn.Result } : {}),
      csn: { ...csn, NsPath: nsPath },
      interfaces: plan.interfaces,
      createdAt: new Date().toISOString(),
    };
    this.store.write(newRec);
    const st = this.attach(newRec, true);
    log.info({ interfaces: plan.interfaces.map((i) => i.tapName) }, 'pod network recovered');
    return st;
  }

  state(key: string): PodNetworkState | undefined {
    return this.states.get(key);
  }

  /** For get: the state with its fds (one per interface), reopening them from the record if they were lost (a restart). */
  async ensureFds(key: string): Promise<PodNetworkState> {
    validateKey(key);
    const st = this.states.get(key);
    if (st && st.fds.length === st.interfaces.length) return st;
    const rec = this.store.read(key);
    if (!rec) throw new VmpodError(ErrorCode.NotFound, `no pod network for key ${key}`, { key, op: 'get' });
    if (rec.phase !== Phase.Ready || !rec.csn) {
      throw new VmpodError(ErrorCode.State, `pod network ${key} is in phase "${rec.phase}", not ready`, { key, op: 'get' });
    }
    try {
      return this.attach(rec);
    } catch (e) {
      if (isBusy(e)) throw new VmpodError(ErrorCode.Conflict, `get ${key}: a tap of the pod is in use (EBUSY): the VM holds it already`, { cause: e, key, op: 'get' });
      throw e;
    }
  }

  /** Daemon start: ready records get their taps reopened; records left adding/releasing are undone. */
  async restore(): Promise<{ restored: string[]; rolledBack: string[] }> {
    const restored: string[] = [];
    const rolledBack: string[] = [];
    for (const key of this.store.keys()) {
      const log = this.log.child({ key, op: 'restore' });
      if (this.states.has(key)) continue;
      let rec: PodRecord | undefined;
      try {
        rec = this.store.read(key);
      } catch (e) {
        log.error({ err: e }, 'state record unreadable: left as it is (release the key to clean up)');
        continue;
      }
      if (!rec) continue;
      if (rec.phase === Phase.Ready && existsSync(rec.nsPath)) {
        try {
          this.attach(rec, true);
          restored.push(key);
        } catch (e) {
          log.error({ err: e }, 'reopening the taps failed: the record stays');
        }
        continue;
      }
      log.warn({ phase: rec.phase, netnsExists: existsSync(rec.nsPath) }, 'undoing a pod network left halfway');
      rec.phase = Phase.Releasing;
      this.safeWrite(rec, log);
      const errors = await this.undoRecord(rec, log);
      if (errors.length === 0) {
        this.store.remove(key);
        rolledBack.push(key);
      } else log.error({ errors: errors.map((x) => errorChain(x)) }, 'undo incomplete: the record stays');
    }
    return { restored, rolledBack };
  }

  /** Keys with a record or in memory, sorted. */
  keys(): string[] {
    return [...new Set([...this.store.keys(), ...this.states.keys()])].sort();
  }

  /** Daemon exit: close our fds; the pod networks stay in place (the taps are persistent). */
  closeAll(): void {
    for (const st of this.states.values()) {
      this.closeFds(st.fds, this.log.child({ key: st.key, op: 'close' }));
      st.fds = [];
    }
  }

  // ---------------------------------------------------------------- internals

  private runtimeConf(rec: PodRecord, ifName: string): RuntimeConf {
    return {
      containerId: rec.key,
      netns: rec.nsPath,
      ifName,
      args: [
        ['IgnoreUnknown', '1'],
        ['K8S_POD_NAMESPACE', rec.desc.podNs],
        ['K8S_POD_NAME', rec.desc.podName],
        ['K8S_POD_INFRA_CONTAINER_ID', rec.key],
      ],
    };
  }

  private record(rec: PodRecord, steps: Step[]): void {
    rec.steps.push(...steps);
    this.store.write(rec);
  }

  private safeWrite(rec: PodRecord, log: Logger): void {
    try {
      this.store.write(rec);
    } catch (e) {
      log.error({ err: e }, 'writing the state record failed');
    }
  }

  /**
   * Records the steps (one write), then runs their do-ops: consecutive ip ops as one `ip -batch` in the pod
   * netns (it stops at the first failing line, which names the step), ebtables rules as one atomic
   * ebtables-restore. Throws a step error naming the failed step.
   */
  private async applySteps(rec: PodRecord, steps: Step[], signal?: AbortSignal): Promise<void> {
    this.record(rec, steps);
    const items = steps.flatMap((step) => step.do.map((op) => ({ step, op })));
    let i = 0;
    while (i < items.length) {
      const { step, op } = items[i]!;
      if (isIpOp(op)) {
        const group: { step: Step; args: string[] }[] = [];
        while (i < items.length && isIpOp(items[i]!.op)) {
          group.push({ step: items[i]!.step, args: (items[i]!.op as { args: string[] }).args });
          i++;
        }
        let failures;
        try {
          ({ failures } = await this.exec.ipBatch(rec.key, group.map((g) => g.args), signal ? { signal } : {}));
        } catch (e) {
          throw stepError(group[0]!.step.name, group[0]!.step.target, e);
        }
        if (failures.length > 0) {
          const f = failures[0]!;
          const g = group[f.line - 1] ?? group[0]!;
          throw stepError(g.step.name, g.step.target, new VmpodError(ErrorCode.Netlink, `ip ${g.args.join(' ')}: ${f.message}`));
        }
      } else if (isEbOp(op)) {
        const group: string[][] = [];
        while (i < items.length && isEbOp(items[i]!.op) && items[i]!.step === step) {
          group.push((items[i]!.op as { args: string[] }).args);
          i++;
        }
        // ebtables-restore applies the whole table in one transaction: all rules or none
        const input = ['*filter', ...group.map((a) => a.join(' ')), 'COMMIT', ''].join('\n');
        try {
          const r = await this.exec.inNetns(rec.nsPath, ['ebtables-restore', '--noflush'], { input, ...(signal ? { signal } : {}) });
          if (r.exitCode !== 0) throw new VmpodError(ErrorCode.Netlink, `ebtables-restore in ${rec.nsPath}: ${r.stderr.trim() || `exit code ${r.exitCode}`}`);
        } catch (e) {
          throw stepError(step.name, step.target, e);
        }
      } else if (op.op === 'vf-bind') {
        // host side, synchronous sysfs writes; the VF's netdev leaves the pod netns as its driver lets go
        try {
          bindToVfio(this.sysfs, op.address);
        } catch (e) {
          throw stepError(step.name, step.target, e);
        }
        i++;
      } else if (op.op === 'vf-link') {
        try {
          await this.vfLink(vfLinkArgv(op.pf, op.vf, op.mac, op.vlan));
        } catch (e) {
          throw stepError(step.name, step.target, new VmpodError(ErrorCode.Device, `set MAC ${op.mac} VLAN ${op.vlan} on VF ${op.vf} of ${op.pf}`, { cause: e }));
        }
        i++;
      } else if (op.op === 'netns-add') {
        try {
          await this.exec.ip(['netns', 'add', op.name], signal ? { signal } : {});
        } catch (e) {
          // `ip netns add` cleans up after itself when it fails: nothing of ours to undo, and the netns (if it
          // exists now) is someone else's: drop the step so rollback does not delete it
          rec.steps = rec.steps.filter((s) => s !== step);
          this.store.write(rec);
          throw stepError(step.name, step.target, e);
        }
        i++;
      } else {
        throw new VmpodError(ErrorCode.Internal, `step ${step.name}: op ${op.op} cannot be applied here`);
      }
    }
  }

  /**
   * Runs every recorded undo op, steps in reverse, ops of a step in order; keeps going past failures and
   * returns them. Ops marked withNetns are left to the netns removal that ends the same run. Ops inside the
   * pod netns are skipped when the netns is gone (nothing left to undo there).
   * "Already undone" (no such device, address, route, rule) is not a failure: a batch or a crash can have
   * stopped anywhere between record and apply.
   */
  private async undoRecord(rec: PodRecord, log: Logger): Promise<Error[]> {
    const errors: Error[] = [];
    const netnsGoes = rec.steps.some((s) => s.undo.some((o) => o.op === 'netns-del'));
    const items = [...rec.steps]
      .reverse()
      .flatMap((step) => step.undo.map((op) => ({ step, op })))
      .filter(({ op }) => !(netnsGoes && (op.op === 'ip' || op.op === 'ebtables') && op.withNetns));
    let i = 0;
    let t = performance.now();
    const lap = (what: string) => {
      const now = performance.now();
      log.debug({ ms: Math.round((now - t) * 10) / 10 }, `undo ${what}`);
      t = now;
    };
    while (i < items.length) {
      if (i > 0) lap(items[i - 1]!.step.name);
      const { step, op } = items[i]!;
      const nsThere = existsSync(rec.nsPath);
      if (isIpOp(op)) {
        const group: { step: Step; args: string[] }[] = [];
        while (i < items.length && isIpOp(items[i]!.op)) {
          group.push({ step: items[i]!.step, args: (items[i]!.op as { args: string[] }).args });
          i++;
        }
        if (!nsThere) continue;
        try {
          const { failures } = await this.exec.ipBatch(rec.key, group.map((g) => g.args), { force: true });
          for (const f of failures) {
            if (isAlreadyUndone(f.message)) continue;
            const g = group[f.line - 1];
            errors.push(new VmpodError(ErrorCode.Netlink, `undo "${g?.step.name ?? '?'}"${g?.step.target ? ` on ${g.step.target}` : ''}: ip ${g?.args.join(' ') ?? ''}: ${f.message}`, { key: rec.key, op: g?.step.name ?? 'undo' }));
          }
        } catch (e) {
          errors.push(stepError(`undo ${step.name}`, step.target, e));
        }
        continue;
      }
      if (isEbOp(op)) {
        const group: string[][] = [];
        while (i < items.length && isEbOp(items[i]!.op) && items[i]!.step === step) {
          group.push((items[i]!.op as { args: string[] }).args);
          i++;
        }
        if (!nsThere) continue;
        try {
          await this.undoEbtables(rec.nsPath, group);
        } catch (e) {
          errors.push(stepError(`undo ${step.name}`, step.target, e));
        }
        continue;
      }
      i++;
      try {
        switch (op.op) {
          case 'cni-del': {
            // DEL with the cached ADD result as prevResult (the CNI client reads its cache); it must succeed
            // when called again and after a failed ADD, and a missing netns is the plugins' to tolerate
            const list = await this.opts.loadConfList();
            await this.opts.cni.del(list, this.runtimeConf(rec, op.ifName));
            break;
          }
          case 'netns-del': {
            if (!existsSync(join(this.netnsDir, op.name))) break;
            await this.exec.ip(['netns', 'del', op.name]);
            break;
          }
          case 'vf-restore-driver':
            // a VF that is gone (its PF's sriov_numvfs lowered, the PF removed) has nothing left to restore
            if (this.sysfs.pciDevice(op.address) === undefined) {
              log.warn({ address: op.address }, 'the VF is gone: no driver to restore');
              break;
            }
            restoreDriver(this.sysfs, op.address, op.driver);
            break;
          case 'vf-link':
            try {
              await this.vfLink(vfLinkArgv(op.pf, op.vf, op.mac, op.vlan));
            } catch (e) {
              // the PF is gone ("Cannot find device"), and its VFs with it
              if (isAlreadyUndone(errorChain(e))) {
                log.warn({ err: e, pf: op.pf }, 'the PF is gone: no VF MAC/VLAN to restore');
                break;
              }
              throw new VmpodError(ErrorCode.Device, `restore MAC ${op.mac} VLAN ${op.vlan} on VF ${op.vf} of ${op.pf}`, { cause: e });
            }
            break;
          case 'vf-netdev-return':
            await this.returnVfNetdev(rec, op, log);
            break;
          case 'netns-add':
          case 'cni-add':
          case 'vf-bind':
            throw new VmpodError(ErrorCode.Internal, `op ${op.op} is not an undo op`);
          default: {
            const never: never = op;
            throw new VmpodError(ErrorCode.Internal, `unknown op ${JSON.stringify(never)}`);
          }
        }
      } catch (e) {
        errors.push(stepError(`undo ${step.name}`, step.target, e));
      }
    }
    if (items.length > 0) lap(items[items.length - 1]!.step.name);
    for (const e of errors) log.error({ err: e }, 'undo step failed');
    return errors;
  }

  /**
   * Deletes ebtables rules: all in one ebtables-restore transaction (one spawn); when that fails (a rule is
   * missing: a crash came between record and apply), one by one, "no such rule" being fine.
   */
  private async undoEbtables(nsPath: string, rules: string[][]): Promise<void> {
    const input = ['*filter', ...rules.map((a) => a.join(' ')), 'COMMIT', ''].join('\n');
    const all = await this.exec.inNetns(nsPath, ['ebtables-restore', '--noflush'], { input });
    if (all.exitCode === 0) return;
    for (const args of rules) {
      const r = await this.exec.inNetns(nsPath, ['ebtables', ...args]);
      if (r.exitCode !== 0 && !isAlreadyUndone(r.stderr)) throw new VmpodError(ErrorCode.Netlink, `ebtables ${args.join(' ')} in ${nsPath}: ${r.stderr.trim()}`);
    }
  }

  /** The netns's links and IPv4 routes in one spawn. */
  private async observe(key: string, signal?: AbortSignal): Promise<Observed> {
    const { stdout, failures } = await this.exec.ipBatch(key, [['addr', 'show'], ['route', 'show']], { flags: ['-d', '-j'], ...(signal ? { signal } : {}) });
    if (failures.length > 0) throw new VmpodError(ErrorCode.Netlink, `read links and routes of netns ${key}: ${failures.map((f) => f.message).join('; ')}`);
    return parseObserved(stdout);
  }

  /**
   * SR-IOV detection: name -> PCI address of every CNI interface in the pod netns that is a VF. The address is
   * `ip -d`'s parentbus "pci" / parentdev (IFLA_PARENT_DEV_NAME, Linux 5.14+); a VF is a PCI function with a
   * `physfn` link (bus/pci does not depend on the netns). Fallback without a parent device: the sysfs root's
   * class/net/<if>/device, but only on a tree that is not the live /sys, whose class/net shows our netns, where a
   * link of the same name would be another device (fake trees in tests map a dummy netdev to a PCI device there).
   */
  private findVfs(observed: Observed, result: CniResult): Map<string, string> {
    const vfs = new Map<string, string>();
    const liveSysfs = resolve(this.sysfs.root) === '/sys';
    for (const ci of result.interfaces) {
      if (!hasSandbox(ci)) continue;
      const link = observed.links.find((l) => l.name === ci.name);
      if (!link) continue;
      let addr: string | undefined;
      if (link.parentBus === 'pci' && link.parentDev !== undefined && isPciAddress(link.parentDev)) addr = link.parentDev.toLowerCase();
      else if (link.parentBus === undefined && !liveSysfs) addr = this.sysfs.netDevicePci(link.name);
      if (addr !== undefined && this.sysfs.exists(`bus/pci/devices/${addr}/physfn`)) vfs.set(link.name, addr);
    }
    return vfs;
  }

  /**
   * The record of each VF (planVfSetup), read before anything is touched: PF and index (sysfs), driver, the
   * VM's MAC = the netdev's MAC, the VF's current MAC and VLAN as its PF reports them (`ip -d -j link show dev
   * <pf>`, vfinfo_list; when unreadable: the netdev's MAC and VLAN 0). VLAN wanted: sriov-cni's `vlan` in the
   * conflist, else the one the PF already has for the VF (a CNI plugin set it), else 0.
   */
  private async planVfs(observed: Observed, vfs: Map<string, string>, list: NetworkConfigList | undefined, log: Logger, signal?: AbortSignal): Promise<Map<string, VfSetupRecord>> {
    const out = new Map<string, VfSetupRecord>();
    const confVlan = list ? vlanFromConf(list.plugins) : undefined;
    for (const [name, address] of vfs) {
      signal?.throwIfAborted();
      const link = observed.links.find((l) => l.name === name)!;
      const desc = describeVfAt(this.sysfs, name, address, link.mac);
      let current: VfLinkState | undefined;
      try {
        current = parseVfState(await this.vfLink(['ip', '-d', '-j', 'link', 'show', 'dev', desc.pfIfname]), desc.vfIndex);
      } catch (e) {
        log.warn({ err: e, pf: desc.pfIfname, vf: desc.vfIndex }, "the PF does not report the VF's MAC and VLAN: taking the netdev's MAC and VLAN 0 as the ones to restore");
      }
      const original = current ?? { mac: link.mac, vlan: 0 };
      out.set(name, planVfSetup(desc, original, { mac: link.mac, vlan: confVlan ?? current?.vlan ?? 0 }));
    }
    return out;
  }

  /**
   * Undo of a VF's bind: when its driver is back, the kernel creates a new netdev in the initial (host) netns
   * under a kernel name (bus/pci/devices/<addr>/net/<name>; some drivers, iavf, do it from a workqueue, so we
   * poll). It goes back into the pod netns under the CNI plugin's name, so that the plugin's DEL finds it.
   * Nothing to do when the netns is gone, or when the netdev never left (the bind was recorded, not applied).
   */
  private async returnVfNetdev(rec: PodRecord, op: { address: string; name: string }, log: Logger): Promise<void> {
    if (!existsSync(rec.nsPath)) {
      log.warn({ address: op.address }, "the pod netns is gone: the VF's netdev stays in the host netns");
      return;
    }
    if (this.sysfs.pciDevice(op.address) === undefined) {
      log.warn({ address: op.address }, 'the VF is gone: no netdev to return');
      return;
    }
    const inPod = await this.exec.ip(['-n', rec.key, '-d', '-j', 'link', 'show']);
    const links = inPod.trim() === '' ? [] : (JSON.parse(inPod) as { ifname?: string; parentbus?: string; parentdev?: string }[]);
    if (links.some((l) => l.parentbus === 'pci' && l.parentdev?.toLowerCase() === op.address)) return;
    const timeoutMs = this.opts.vfNetdevTimeoutMs ?? 10_000;
    const deadline = performance.now() + timeoutMs;
    let names = this.sysfs.pciNetInterfaces(op.address);
    while (names.length === 0 && performance.now() < deadline) {
      await new Promise((r) => setTimeout(r, 50));
      names = this.sysfs.pciNetInterfaces(op.address);
    }
    const dev = names[0];
    if (dev === undefined) {
      throw new VmpodError(ErrorCode.Device, `VF ${op.address}: no netdev under ${this.sysfs.path(`bus/pci/devices/${op.address}/net`)} ${timeoutMs} ms after its driver was restored: cannot return it to the pod netns as ${op.name}`);
    }
    // one RTM_NEWLINK: the kernel moves the link, then renames it in the target netns
    await this.vfLink(['ip', 'link', 'set', 'dev', dev, 'netns', rec.key, 'name', op.name]);
  }

  /**
   * One fd per interface, in interface order (get's fdIndex). A tap: opened in the pod netns. A VF: /dev/null,
   * read-only and close-on-exec (libuv opens every file with O_CLOEXEC), only so that get hands one fd per
   * interface, as Virtlet did; vmwrapper passes the VF by its PCI address and never gives that fd to qemu.
   */
  private openFds(nsPath: string, interfaces: PodInterface[]): number[] {
    const fds: number[] = [];
    try {
      for (const i of interfaces) {
        if (i.type === 'vf') {
          try {
            fds.push(openSync('/dev/null', 'r'));
          } catch (e) {
            throw new VmpodError(ErrorCode.Syscall, `open /dev/null for VF ${i.cniName}`, { cause: e, op: 'open-tap' });
          }
          continue;
        }
        try {
          // IFF_VNET_HDR must match the persistent tap's flags; single queue
          fds.push(native().openTap(nsPath, i.tapName, { vnetHdr: true }));
        } catch (e) {
          throw new VmpodError(ErrorCode.Syscall, `open tap ${i.tapName} in ${nsPath}`, { cause: e, op: 'open-tap' });
        }
      }
    } catch (e) {
      this.closeFds(fds, this.log);
      throw e;
    }
    return fds;
  }

  private closeFds(fds: number[], log: Logger): void {
    for (const fd of fds.splice(0)) {
      try {
        native().close(fd);
      } catch (e) {
        log.error({ err: e, fd }, 'closing a tap fd failed');
      }
    }
  }

  /**
   * In-memory state for a ready record, taps reopened (a VF's fd is /dev/null again: the VF is not touched). A single-queue tap takes one open file at a time
   * (TUNSETIFF gives EBUSY while another is attached): when a running VM holds it, the pod is attached
   * without fds if `tolerateBusy` (restore, recover: DHCP and release work, get says the tap is in use).
   */
  private attach(rec: PodRecord, tolerateBusy = false): PodNetworkState {
    let fds: number[] = [];
    try {
      fds = this.openFds(rec.nsPath, rec.interfaces);
    } catch (e) {
      if (!(tolerateBusy && isBusy(e))) throw e;
      this.log.warn({ key: rec.key, op: 'attach', err: e }, 'a tap is in use (a running VM holds it): attached without fds');
    }
    const st: PodNetworkState = { key: rec.key, nsPath: rec.nsPath, csn: rec.csn!, interfaces: rec.interfaces, fds, desc: rec.desc };
    this.states.set(rec.key, st);
    return st;
  }

  /** What can be undone without a record: CNI DEL and the netns. */
  private conventionRecord(key: string, desc: PodNetworkDesc): PodRecord {
    return {
      kind: RECORD_KIND,
      key,
      desc,
      nsPath: this.nsPathOf(key),
      phase: Phase.Releasing,
      steps: [netnsStep(key), cniAddStep(this.ifName)],
      cniIfNames: [this.ifName],
      interfaces: [],
      createdAt: new Date().toISOString(),
    };
  }
}

function describeIf(i: PodInterface): string {
  return i.type === 'vf' ? `${i.cniName}->vfio-pci ${i.pciAddress ?? '?'} (VF ${i.vf?.vfIndex ?? '?'} of ${i.vf?.pfIfname ?? '?'})` : `${i.cniName}->${i.bridgeName}/${i.tapName}`;
}

/** EBUSY from TUNSETIFF (native errors carry the errno name as code), anywhere in the cause chain. */
function isBusy(e: unknown): boolean {
  for (let c: unknown = e, d = 0; c instanceof Error && d < 5; c = c.cause, d++) {
    if ((c as NodeJS.ErrnoException).code === 'EBUSY') return true;
  }
  return false;
}

/** The CNI result recover plans with: the csn's, with its interfaces made sandboxed and ips indexed. */
export function resultForRecover(csn: ContainerSideNetwork, nsPath: string): CniResult {
  const r: CniResult = csn.Result ? fromV031(csn.Result) : { cniVersion: '0.3.1', interfaces: [], ips: [], routes: [], dns: {} };
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
