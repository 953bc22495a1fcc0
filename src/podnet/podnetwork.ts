// The pod network's orchestration: netns lifecycle, CNI ADD/DEL, the container-side network (plan.ts), tap fds
// (fds.ts), and the record of every step (src/state). Each step is written to the record BEFORE it is applied
// (steps.ts); teardown, failed-ADD rollback and restart recovery all run the recorded undo ops in reverse.
// SR-IOV VFs (enableSriov): bound to vfio-pci and configured on their PF in the host netns (vf.ts, src/devices).
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { ErrorCode, VmpodError, errorChain, isVmpodError, type ErrorCode as ErrorCodeT } from '../errors.js';
import type { Logger } from '../log.js';
import { validateKey } from '../identity.js';
import type { PodNetworkDesc, ContainerSideNetwork, RecoverPayload } from '../protocol/payloads.js';
import type { CniClient, NetworkConfigList, RuntimeConf } from '../cni/index.js';
import { Sysfs } from '../devices/sysfs.js';
import { toV031 } from '../protocol/result.js';
import type { CniResult } from '../cni/types.js';
import { StateStore } from '../state/store.js';
import { Phase, newRecord, type PodRecord } from '../state/record.js';
import { NetExec } from './exec.js';
import { parseObserved } from './observe.js';
import { completeResult } from './result.js';
import { buildCsn, cniAddStep, planContainerSide, podNetnsSteps, randomLaaMac } from './plan.js';
import type { PodInterface } from '../state/types.js';
import { DEFAULT_IFNAME, type Observed } from './types.js';
import { applySteps, recordSteps, stepError, undoRecord, type StepDeps } from './steps.js';
import { findVfs, ipVfLink, planVfs } from './vf.js';
import { closeFds, isBusy, openFds } from './fds.js';
import { checkRecoverCsn, conventionRecord, recoverRecord } from './recover.js';

export { resultForRecover } from './recover.js';

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

export class PodNetwork {
  private readonly store: StateStore;
  private readonly exec: NetExec;
  private readonly states = new Map<string, PodNetworkState>();
  private readonly netnsDir: string;
  private readonly ifName: string;
  private readonly log: Logger;
  private readonly deps: StepDeps;

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
    this.deps = {
      exec: this.exec,
      store: this.store,
      sysfs: opts.sysfs ?? new Sysfs(opts.sysfsRoot ?? '/sys'),
      vfLink: opts.vfLink ?? ipVfLink(this.exec),
      netnsDir: this.netnsDir,
      vfNetdevTimeoutMs: opts.vfNetdevTimeoutMs ?? 10_000,
      // DEL with the cached ADD result as prevResult (the CNI client reads its cache)
      cniDel: async (rec, ifName) => this.opts.cni.del(await this.opts.loadConfList(), runtimeConf(rec, ifName)),
    };
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
    const rec = newRecord({ key, desc, nsPath, phase: Phase.Adding, steps: [], cniIfNames: [this.ifName] });
    let fds: number[] = [];
    try {
      await applySteps(this.deps, rec, podNetnsSteps(key), signal);

      const cniStep = cniAddStep(this.ifName);
      recordSteps(this.store, rec, [cniStep]);
      let result: CniResult;
      let list: NetworkConfigList | undefined;
      try {
        list = await this.opts.loadConfList();
        result = await this.opts.cni.add(list, runtimeConf(rec, this.ifName), signal);
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
        const vfs = findVfs(this.deps.sysfs, observed, completed);
        const vfSetups = this.opts.enableSriov ? await planVfs(this.deps.sysfs, this.deps.vfLink, observed, vfs, list, log, signal) : undefined;
        plan = planContainerSide({ observed, result: completed, newMac: () => randomLaaMac(), vfs: new Set(vfs.keys()), ...(vfSetups ? { vfSetups } : {}) });
      } catch (e) {
        throw stepError('plan', undefined, e);
      }
      log.debug({ observed, steps: plan.steps.length }, 'container-side network planned');
      await applySteps(this.deps, rec, plan.steps, signal);

      try {
        fds = openFds(nsPath, plan.interfaces, this.log);
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
      closeFds(fds, log);
      const op = isVmpodError(e) && e.op ? e.op : 'add';
      log.error({ err: e, step: op }, 'add failed: rolling back');
      const undoErrors = await undoRecord(this.deps, rec, log);
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
    if (st) closeFds(st.fds, log);
    this.states.delete(key);
    const { rec: found, corrupt } = this.readRecord(key);
    let rec = found;
    if (corrupt) log.error({ err: corrupt }, 'state record unreadable: releasing by convention (CNI DEL, netns removal)');
    if (!rec) {
      if (!existsSync(nsPath)) {
        if (corrupt) throw corrupt;
        throw new VmpodError(ErrorCode.NotFound, `no pod network for key ${key}`, { key, op: 'release' });
      }
      // a netns without a (readable) record: an older daemon's, or a record lost; the container side cannot be
      // restored without it, but CNI DEL frees the IPAM allocation and the netns goes
      rec = conventionRecord(key, nsPath, this.ifName, st?.desc ?? { podId: key, podNs: '', podName: '' });
    }
    rec.phase = Phase.Releasing;
    this.store.write(rec);
    const errors = await undoRecord(this.deps, rec, log);
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
    const { rec, corrupt } = this.readRecord(key);
    if (corrupt) log.warn({ err: corrupt }, 'state record unreadable: rebuilding it from the netns and the csn');
    if (rec && rec.phase === Phase.Ready && rec.csn) return this.attach(rec, true);
    if (rec && rec.phase !== Phase.Ready) {
      throw new VmpodError(ErrorCode.State, `recover ${key}: the pod network was left in phase "${rec.phase}"; release it`, { key, op: 'recover' });
    }
    const csn = payload.csn;
    checkRecoverCsn(key, csn, this.opts.enableSriov === true);
    const live = await this.observe(key);
    const newRec = recoverRecord({ key, nsPath, ifName: this.ifName, desc: payload.podNetworkDesc, csn, live });
    this.store.write(newRec);
    const st = this.attach(newRec, true);
    log.info({ interfaces: newRec.interfaces.map((i) => i.tapName) }, 'pod network recovered');
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
      const { rec, corrupt } = this.readRecord(key);
      if (corrupt) log.error({ err: corrupt }, 'state record unreadable: left as it is (release the key to clean up)');
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
      const errors = await undoRecord(this.deps, rec, log);
      if (errors.length === 0) {
        this.store.remove(key);
        rolledBack.push(key);
      } else log.error({ errors: errors.map((x) => errorChain(x)) }, 'undo incomplete: the record stays');
    }
    return { restored, rolledBack };
  }

  /** Every state record with its phase, for list and the pods-by-state metric; an unreadable one is "corrupt". */
  records(): { key: string; phase: string; rec?: PodRecord }[] {
    return this.store.keys().map((key) => {
      const { rec, corrupt } = this.readRecord(key);
      return rec ? { key, phase: rec.phase, rec } : { key, phase: corrupt ? 'corrupt' : 'missing' };
    });
  }

  /** Keys with a record or in memory, sorted. */
  keys(): string[] {
    return [...new Set([...this.store.keys(), ...this.states.keys()])].sort();
  }

  /** Daemon exit: close our fds; the pod networks stay in place (the taps are persistent). */
  closeAll(): void {
    for (const st of this.states.values()) {
      closeFds(st.fds, this.log.child({ key: st.key, op: 'close' }));
      st.fds = [];
    }
  }

  // ---------------------------------------------------------------- internals

  /** The record (undefined when there is none), or the error that makes it unreadable (corrupt). */
  private readRecord(key: string): { rec?: PodRecord; corrupt?: unknown } {
    try {
      const rec = this.store.read(key);
      return rec ? { rec } : {};
    } catch (e) {
      return { corrupt: e };
    }
  }

  private safeWrite(rec: PodRecord, log: Logger): void {
    try {
      this.store.write(rec);
    } catch (e) {
      log.error({ err: e }, 'writing the state record failed');
    }
  }

  /** The netns's links and IPv4 routes in one spawn. */
  private async observe(key: string, signal?: AbortSignal): Promise<Observed> {
    const { stdout, failures } = await this.exec.ipBatch(key, [['addr', 'show'], ['route', 'show']], { flags: ['-d', '-j'], ...(signal ? { signal } : {}) });
    if (failures.length > 0) throw new VmpodError(ErrorCode.Netlink, `read links and routes of netns ${key}: ${failures.map((f) => f.message).join('; ')}`);
    return parseObserved(stdout);
  }

  /**
   * In-memory state for a ready record, taps reopened (a VF's fd is /dev/null again: the VF is not touched). A
   * single-queue tap takes one open file at a time (TUNSETIFF gives EBUSY while another is attached): when a
   * running VM holds it, the pod is attached without fds if `tolerateBusy` (restore, recover: DHCP and release
   * work, get says the tap is in use).
   */
  private attach(rec: PodRecord, tolerateBusy = false): PodNetworkState {
    let fds: number[] = [];
    try {
      fds = openFds(rec.nsPath, rec.interfaces, this.log);
    } catch (e) {
      if (!(tolerateBusy && isBusy(e))) throw e;
      this.log.warn({ key: rec.key, op: 'attach', err: e }, 'a tap is in use (a running VM holds it): attached without fds');
    }
    const st: PodNetworkState = { key: rec.key, nsPath: rec.nsPath, csn: rec.csn!, interfaces: rec.interfaces, fds, desc: rec.desc };
    this.states.set(rec.key, st);
    return st;
  }
}

/** The CNI attachment of a pod: its key as the container id, the K8S_* args kubelet's CRI runtime would pass. */
function runtimeConf(rec: PodRecord, ifName: string): RuntimeConf {
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

function describeIf(i: PodInterface): string {
  return i.type === 'vf' ? `${i.cniName}->vfio-pci ${i.pciAddress ?? '?'} (VF ${i.vf?.vfIndex ?? '?'} of ${i.vf?.pfIfname ?? '?'})` : `${i.cniName}->${i.bridgeName}/${i.tapName}`;
}
