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
import { parseConfList, type CniClient, type NetworkConfigList, type RuntimeConf } from '../cni/index.js';
import { Sysfs } from '../devices/sysfs.js';
import { toV031 } from '../protocol/result.js';
import type { CniResult } from '../cni/types.js';
import { StateStore } from '../state/store.js';
import type { Spares } from '../files.js';
import { Phase, StepName, newRecord, type PodRecord } from '../state/record.js';
import { NetExec, observeNetns } from './exec.js';
import { completeResult, withPodDns } from './result.js';
import { IPV6_OFF, POD_NETNS_SYSCTLS, buildCsn, cniAddStep, planContainerSide, podNetnsSteps, preparedSteps, randomLaaMac } from './plan.js';
import type { PodInterface } from '../state/types.js';
import { DEFAULT_IFNAME, bridgeName, type Observed } from './types.js';
import { bindNetns, recordSteps, recordStepsThenSync, runSteps, stepError, undoRecord, type StepDeps } from './steps.js';
import { SpareNetns } from './sparens.js';
import { native } from '../native.js';
import { findVfs, ipVfLink, planVfs } from './vf.js';
import { closeFds, closeFdsOffLoop, isBusy, openFds, openNewFds } from './fds.js';
import { checkRecoverCsn, checkSameCsn, conventionRecord, recoverRecord } from './recover.js';
import { chooseBinding, type BindingMode } from './binding.js';

export { resultForRecover } from './recover.js';

/** iproute2's `ip netns` keeps named netns here (NETNS_RUN_DIR, fixed at build time). */
export const IP_NETNS_DIR = '/var/run/netns';

export interface PodNetworkOptions {
  stateDir: string;
  /** the state records' spare files, shared with the CNI client's cache (default: the state dir's own) */
  spares?: Spares;
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
  /**
   * Pod netns to keep made ahead of time, while no add or release is in flight (sparens.ts); an add that finds one
   * skips making its netns and its prepared links. Default 0 (tapmanager's --spare-netns sets 1).
   */
  spareNetns?: number;
  /** how CNI interfaces are joined to their taps (binding.ts): default auto (tc-redirect for macvlan and ipvlan) */
  binding?: BindingMode;
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
  private readonly spares: SpareNetns;

  constructor(private readonly opts: PodNetworkOptions) {
    this.netnsDir = opts.netnsDir ?? IP_NETNS_DIR;
    if (![IP_NETNS_DIR, '/run/netns'].includes(resolve(this.netnsDir))) {
      // `ip netns add` and `ip -n NAME` only know NETNS_RUN_DIR; another dir would need our own bind mounts
      throw new VmpodError(ErrorCode.Config, `netnsDir ${JSON.stringify(this.netnsDir)}: only ${IP_NETNS_DIR} (or /run/netns) is supported, as iproute2's "ip netns" uses it`);
    }
    this.ifName = opts.ifNamePrefix ?? DEFAULT_IFNAME;
    this.store = new StateStore(opts.stateDir, opts.spares);
    this.exec = new NetExec(opts.cmdTimeoutMs);
    this.log = opts.log;
    this.deps = {
      exec: this.exec,
      store: this.store,
      sysfs: opts.sysfs ?? new Sysfs(opts.sysfsRoot ?? '/sys'),
      vfLink: opts.vfLink ?? ipVfLink(this.exec),
      netnsDir: this.netnsDir,
      vfNetdevTimeoutMs: opts.vfNetdevTimeoutMs ?? 10_000,
      // DEL with the cached ADD result as prevResult (the CNI client reads its cache), against the network the
      // ADD used (networksForDel)
      cniDel: async (rec, ifName, config) => {
        for (const list of await this.networksForDel(rec, ifName, config)) await this.opts.cni.del(list, runtimeConf(rec, ifName));
      },
    };
    this.spares = new SpareNetns(opts.spareNetns ?? 0, () => this.makeSpare(), this.log);
  }

  /** A pod netns as an add makes it before its plugins return (podNetnsSteps, preparedSteps), held by an fd. */
  private async makeSpare(): Promise<number> {
    const fd = await native().netnsMake(POD_NETNS_SYSCTLS);
    try {
      const rec = newRecord({ key: 'spare', desc: { podId: '', podNs: '', podName: '' }, nsPath: `/proc/self/fd/${fd}`, phase: Phase.Adding, steps: [], cniIfNames: [this.ifName] });
      await runSteps(this.deps, rec, preparedSteps(this.ifName));
    } catch (e) {
      native().close(fd);
      throw e;
    }
    return fd;
  }

  /** How many spare pod netns are ready to be taken (made and prepared; one being made is not counted). */
  get sparesReady(): number {
    return this.spares.count;
  }

  nsPathOf(key: string): string {
    return join(this.netnsDir, key);
  }

  // ---------------------------------------------------------------- add

  /**
   * opts.whileApplying: called with the pod network as it will be (no fds yet) while a pool thread applies its
   * container side, when every bridge and tap it names exists already (the ones made while the plugins ran; they may
   * still be down), so that the caller's work (the DHCP servers) overlaps it; a throw fails the add (rolled back). Not
   * called otherwise: the caller does that work after add.
   */
  async add(key: string, desc: PodNetworkDesc, signal?: AbortSignal, opts: { whileApplying?: (st: PodNetworkState) => void } = {}): Promise<PodNetworkState> {
    validateKey(key);
    this.spares.begin();
    try {
      return await this.addBusy(key, desc, signal, opts);
    } finally {
      this.spares.end();
    }
  }

  private async addBusy(key: string, desc: PodNetworkDesc, signal: AbortSignal | undefined, opts: { whileApplying?: (st: PodNetworkState) => void }): Promise<PodNetworkState> {
    const log = this.log.child({ key, op: 'add' });
    const t0 = performance.now();
    const nsPath = this.nsPathOf(key);
    if (this.states.has(key)) {
      throw new VmpodError(ErrorCode.Conflict, `add ${key}: a pod network for this key exists; release it first`, { key, op: 'add' });
    }
    const old = this.store.read(key);
    if (old?.phase === Phase.Ready) {
      throw new VmpodError(ErrorCode.Conflict, `add ${key}: a pod network for this key exists; release it first`, { key, op: 'add' });
    }
    // what a failed add (or release, or a crash) left: finished first, so that it never blocks the retry
    if (old) await this.finishLeftover(old, log, 'add');
    if (existsSync(nsPath)) {
      // never adopt (or, on rollback, delete) a netns we did not make
      throw new VmpodError(ErrorCode.Conflict, `add ${key}: netns ${nsPath} exists already`, { key, op: 'add' });
    }
    const rec = newRecord({ key, desc, nsPath, phase: Phase.Adding, steps: [], cniIfNames: [this.ifName] });
    let fds: number[] = [];
    // the CNI ADD's cache file and plugin bookkeeping, written while the container side is made
    let cniSettled: (() => Promise<void>) | undefined;
    try {
      // the network is read and its plugins located before anything is made: a missing plugin or a broken config
      // dir has run nothing, and leaves nothing for a DEL to do
      let list: NetworkConfigList;
      try {
        list = await this.opts.loadConfList();
        await this.opts.cni.locate(list);
      } catch (e) {
        throw stepError(StepName.CniAdd, undefined, e);
      }
      // one durable write covers the netns, what is prepared in it and the CNI ADD (its DEL must follow even a
      // failed ADD): the record is on disk before any of them runs; the container side is recorded once more before
      // it is applied, and the ready record once at the end (three atomic writes per add, the first one durable:
      // decisions.md). The exact config goes with the pod: its DEL runs against this network, whatever the config
      // dir holds then.
      const nsSteps = podNetnsSteps(key);
      const prepSteps = preparedSteps(this.ifName);
      const cniStep = cniAddStep(this.ifName, list.bytes.toString('base64'));
      const lap = (what: string) => log.debug({ ms: Math.round((performance.now() - t0) * 10) / 10 }, what);
      lap('config read');
      // prepared before the CNI ADD in the record: a rollback's DEL comes first, and the netns's removal takes them.
      // The netns is made while the record's fsyncs run (a reboot takes it anyway); the CNI ADD waits for both.
      const durable = recordStepsThenSync(this.store, rec, [...nsSteps, ...prepSteps, cniStep]);
      lap('recorded');
      // a netns made while tapmanager was idle has the prepared links in it already: it is bound under the key
      const spare = await this.spares.take();
      try {
        if (spare !== undefined) await bindNetns(this.deps, rec, nsSteps[0]!, key, spare);
        else await runSteps(this.deps, rec, nsSteps, signal);
      } finally {
        await durable.catch(() => {});
      }
      await durable;
      lap(spare !== undefined ? 'spare netns bound' : 'netns made');
      // the bridge, tap and filter that need nothing from the result are made on a pool thread while the plugins
      // run (they take most of an add, waiting); both are over before anything goes on, or back
      const prepared = (spare !== undefined ? Promise.resolve() : runSteps(this.deps, rec, prepSteps, signal)).then(
        () => undefined,
        (e: unknown) => e,
      );
      let result: CniResult;
      try {
        const added = await this.opts.cni.addDeferred(list, runtimeConf(rec, this.ifName), signal);
        result = added.result;
        cniSettled = added.settled;
      } catch (e) {
        await prepared;
        throw stepError(cniStep.name, undefined, e);
      }
      const prepError = await prepared;
      if (prepError !== undefined) throw prepError;
      log.debug({ result, ms: Math.round(performance.now() - t0) }, 'CNI ADD done');

      let observed: Observed;
      let plan: ReturnType<typeof planContainerSide>;
      let completed: CniResult;
      // a result with addresses, none of them IPv6: the plan's first step turns IPv6 off (plan.ts ipv6OffStep), which
      // is done here already, in the call that observes the netns (before the veth's MAC changes, as the plan has it)
      const ipv6OffNow = result.ips.length > 0 && result.ips.every((a) => !a.address.includes(':'));
      try {
        observed = await observeNetns(nsPath, signal, ipv6OffNow ? IPV6_OFF : []);
        // the request's DNS goes into the result the runtime keeps (Virtlet's), and so to DHCP after a recover
        completed = withPodDns(completeResult(result, observed, nsPath), desc.DNS);
        const vfs = findVfs(this.deps.sysfs, observed, completed);
        const vfSetups = this.opts.enableSriov ? await planVfs(this.deps.sysfs, this.deps.vfLink, observed, vfs, list, log, signal) : undefined;
        const binding = this.opts.binding ?? 'auto';
        plan = planContainerSide({ observed, result: completed, newMac: () => randomLaaMac(), vfs: new Set(vfs.keys()), prepared: this.ifName, bindingOf: (_i, link) => chooseBinding(binding, link), ...(vfSetups ? { vfSetups } : {}) });
      } catch (e) {
        throw stepError(ipv6OffNow && isVmpodError(e) && e.op === 'sysctl' ? StepName.Ipv6Off : 'plan', undefined, e);
      }
      log.debug({ observed, steps: plan.steps.length, ms: Math.round((performance.now() - t0) * 10) / 10 }, 'container-side network planned');
      recordSteps(this.store, rec, plan.steps);
      const applying = runSteps(this.deps, rec, ipv6OffNow ? plan.steps.filter((st) => st.name !== StepName.Ipv6Off) : plan.steps, signal);
      // the reply's csn is built while a pool thread applies the steps, and the caller's work runs (should either
      // throw, the steps end first)
      let v031: ReturnType<typeof toV031>;
      let csn: ContainerSideNetwork;
      try {
        v031 = toV031(completed);
        csn = buildCsn(v031, nsPath, plan.interfaces);
        if (opts.whileApplying && plan.steps.every((st) => st.name !== StepName.DropPrepared) && plan.interfaces.every((i) => i.type !== 'tap' || i.bridgeName === bridgeName(0))) {
          try {
            opts.whileApplying({ key, nsPath, csn, interfaces: plan.interfaces, fds: [], desc });
          } catch (e) {
            throw stepError('dhcp', undefined, e);
          }
        }
      } catch (e) {
        await applying.catch(() => {});
        throw e;
      }
      await applying;
      lap('container side applied');

      try {
        // on the event loop when this add is alone (0.1 ms); on a pool thread when other adds or releases run, whose
        // plugins and link changes hold rtnl_lock, which TUNSETIFF waits for (0.65 ms on average in a burst, 17 at worst)
        fds = await openNewFds(nsPath, plan.interfaces, this.log, this.spares.inFlight > 1);
      } catch (e) {
        throw stepError('open-tap', undefined, e);
      }
      try {
        await cniSettled();
      } catch (e) {
        throw stepError(cniStep.name, undefined, e);
      } finally {
        cniSettled = undefined;
      }
      rec.phase = Phase.Ready;
      rec.result = v031;
      rec.csn = csn;
      rec.interfaces = plan.interfaces;
      // atomic, not durable: after a crash of the machine the netns is gone and the adding record's undo (CNI DEL)
      // is what is left to do; the durable record of the CNI ADD covers it
      this.store.write(rec, false);
      const st: PodNetworkState = { key, nsPath, csn, interfaces: plan.interfaces, fds, desc };
      this.states.set(key, st);
      // the request's line (tapmanager's "add done") says so at info, with describeInterfaces
      log.debug({ durationMs: Math.round(performance.now() - t0), interfaces: describeInterfaces(st) }, 'pod network added');
      return st;
    } catch (e) {
      closeFds(fds, log);
      const op = isVmpodError(e) && e.op ? e.op : 'add';
      log.error({ err: e, step: op }, 'add failed: rolling back');
      // the DEL reads the cache the ADD wrote (prevResult): the write is over first, whatever it gave
      await cniSettled?.().catch(() => {});
      const undoErrors = await undoRecord(this.deps, rec, log);
      let tail = '';
      if (undoErrors.length === 0) {
        try {
          this.store.remove(key);
        } catch (re) {
          log.error({ err: re }, 'removing the state record after the rollback failed');
        }
      } else {
        this.quarantine(rec, undoErrors, log);
        tail = ` (rollback incomplete: ${undoErrors.map((u) => errorChain(u)).join('; ')}; what is left is quarantined: the next add or release of ${key} finishes it first, or run "tapctl release --force ${key}")`;
      }
      const what = e instanceof Error && e.message.startsWith('step "') ? e.message : `step "${op}" failed: ${errorChain(e)}`;
      const code: ErrorCodeT = isVmpodError(e) ? e.code : ErrorCode.Internal;
      throw new VmpodError(code, `add ${key}: ${what}${tail}`, { cause: e, key, op });
    }
  }

  // ---------------------------------------------------------------- release

  /**
   * Undoes the pod network and forgets it. `force` (tapctl release --force): the record goes even when undo
   * steps fail; what could not be undone is returned (and logged) instead of thrown.
   */
  async release(key: string, opts: { force?: boolean } = {}): Promise<{ leftovers: string[] }> {
    validateKey(key);
    this.spares.begin();
    try {
      return await this.releaseBusy(key, opts);
    } finally {
      this.spares.end();
    }
  }

  private async releaseBusy(key: string, opts: { force?: boolean }): Promise<{ leftovers: string[] }> {
    const log = this.log.child({ key, op: 'release' });
    const t0 = performance.now();
    const nsPath = this.nsPathOf(key);
    const st = this.states.get(key);
    // the taps close on the pool while the undo runs: each waits for a grace period (closeFdsOffLoop)
    const closing = st ? closeFdsOffLoop(st.fds, log) : undefined;
    this.states.delete(key);
    try {
      return await this.releaseRecorded(key, nsPath, st, log, opts, t0);
    } finally {
      await closing;
    }
  }

  private async releaseRecorded(key: string, nsPath: string, st: PodNetworkState | undefined, log: Logger, opts: { force?: boolean }, t0: number): Promise<{ leftovers: string[] }> {
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
    this.store.write(rec, false);
    const errors = await undoRecord(this.deps, rec, log);
    if (errors.length > 0 && opts.force === true) {
      const leftovers = errors.map((x) => errorChain(x));
      log.error({ leftovers }, 'release --force: undo steps failed, the record is removed anyway: what they held may remain on the node');
      this.store.remove(key);
      return { leftovers };
    }
    if (errors.length > 0) {
      this.quarantine(rec, errors, log);
      const first = errors[0]!;
      throw new VmpodError(isVmpodError(first) ? first.code : ErrorCode.Internal, `release ${key}: ${errors.length} undo step(s) failed, the record stays quarantined for a retry (or "tapctl release --force ${key}"): ${errors.map((x) => errorChain(x)).join('; ')}`, {
        cause: new AggregateError(errors, `release ${key}`),
        key,
        op: 'release',
      });
    }
    // not durable: a record that comes back after a crash of the machine is undone again, and every undo op
    // tolerates "already undone"
    await this.store.removeAsync(key);
    // the request's line says so at info; a quarantine finished here is worth one of its own
    log[rec.quarantine ? 'info' : 'debug']({ durationMs: Math.round(performance.now() - t0), ...(rec.quarantine ? { quarantineFinished: true } : {}) }, 'pod network released');
    return { leftovers: [] };
  }

  // ---------------------------------------------------------------- recover / ensureFds / restore

  /** Re-attach to an existing pod network (after a restart), without CNI ADD. */
  async recover(key: string, payload: RecoverPayload): Promise<PodNetworkState> {
    validateKey(key);
    const log = this.log.child({ key, op: 'recover' });
    const nsPath = this.nsPathOf(key);
    const have = this.states.get(key);
    // a live key: the same csn again is a no-op (the runtime retried), another one is an error
    if (have) {
      checkSameCsn(key, have.csn, payload.csn);
      if (have.fds.length === have.interfaces.length) return have;
    }
    if (!existsSync(nsPath)) throw new VmpodError(ErrorCode.NotFound, `recover ${key}: netns ${nsPath} does not exist: nothing to recover`, { key, op: 'recover' });
    const { rec, corrupt } = this.readRecord(key);
    if (corrupt) log.warn({ err: corrupt }, 'state record unreadable: rebuilding it from the netns and the csn');
    if (rec && rec.phase === Phase.Ready && rec.csn) {
      checkSameCsn(key, rec.csn, payload.csn);
      return this.attach(rec, true);
    }
    if (rec && rec.phase !== Phase.Ready) {
      throw new VmpodError(ErrorCode.State, `recover ${key}: the pod network was left in phase "${rec.phase}"; release it`, { key, op: 'recover' });
    }
    const csn = payload.csn;
    checkRecoverCsn(key, csn, this.opts.enableSriov === true);
    const live = await observeNetns(nsPath);
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
  async restore(): Promise<{ restored: string[]; rolledBack: string[]; netnsMissing: string[]; quarantined: string[] }> {
    const restored: string[] = [];
    const rolledBack: string[] = [];
    const netnsMissing: string[] = [];
    const quarantined: string[] = [];
    this.sweepTemps();
    for (const key of this.store.keys()) {
      const out = await this.restoreKey(key);
      if (out === 'restored') restored.push(key);
      else if (out === 'rolledBack') rolledBack.push(key);
      else if (out === 'netnsMissing') netnsMissing.push(key);
      else if (out === 'quarantined') quarantined.push(key);
    }
    return { restored, rolledBack, netnsMissing, quarantined };
  }

  /** kill -9 leftovers: half-written temporary records (the records themselves are whole); run before a restore. */
  sweepTemps(): void {
    const temps = this.store.sweepTemps();
    if (temps.length > 0) this.log.info({ files: temps }, 'removed temporary state files a killed daemon left');
  }

  /** Keys with a state record, as a restore would visit them. */
  recordedKeys(): string[] {
    return this.store.keys();
  }

  /**
   * Restores one key at daemon start (the daemon runs this in the key's queue, so requests for the key wait for
   * it): a ready record gets its taps reopened; a record left adding/releasing is undone. 'kept': the record
   * stays as it is (unreadable, or the undo incomplete), reported in the log.
   */
  async restoreKey(key: string): Promise<'restored' | 'rolledBack' | 'netnsMissing' | 'quarantined' | 'kept' | 'none'> {
    const log = this.log.child({ key, op: 'restore' });
    if (this.states.has(key)) return 'none';
    const { rec, corrupt } = this.readRecord(key);
    if (corrupt) log.error({ err: corrupt }, 'state record unreadable: left as it is (release the key to clean up)');
    if (!rec) return corrupt ? 'kept' : 'none';
    if (rec.phase === Phase.Ready && existsSync(rec.nsPath)) {
      try {
        this.attach(rec, true);
        return 'restored';
      } catch (e) {
        log.error({ err: e }, 'reopening the taps failed: the record stays');
        return 'kept';
      }
    }
    if (rec.phase === Phase.Ready) {
      // the netns is gone (a node reboot, or someone deleted it): no guessing what else went with it; the
      // record stays, so that the runtime's release runs the CNI DEL that frees the pod's IP
      log.error({ nsPath: rec.nsPath }, 'pod network is recorded ready but its netns is missing: kept for release (not torn down)');
      return 'netnsMissing';
    }
    // an add or release cut off (kill -9, a crash): rolled back now, with the config its ADD used
    log.warn({ phase: rec.phase, netnsExists: existsSync(rec.nsPath) }, 'undoing a pod network left halfway');
    rec.phase = Phase.Releasing;
    this.safeWrite(rec, log);
    const errors = await undoRecord(this.deps, rec, log);
    if (errors.length === 0) {
      this.store.remove(key);
      return 'rolledBack';
    }
    this.quarantine(rec, errors, log);
    return 'quarantined';
  }

  /**
   * Every state record with its phase, for list and the pods-by-state metric: "quarantined" when its undo could not
   * finish (release --force ends it), "corrupt" when unreadable.
   */
  records(): { key: string; phase: string; rec?: PodRecord }[] {
    return this.store.keys().map((key) => {
      const { rec, corrupt } = this.readRecord(key);
      if (!rec) return { key, phase: corrupt ? 'corrupt' : 'missing' };
      return { key, phase: rec.quarantine ? 'quarantined' : rec.phase, rec };
    });
  }

  /** Keys with a record or in memory, sorted. */
  keys(): string[] {
    return [...new Set([...this.store.keys(), ...this.states.keys()])].sort();
  }

  /** Daemon exit: close our fds; the pod networks stay in place (the taps are persistent); the spare netns go. */
  closeAll(): void {
    this.spares.close();
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

  /** Marks the record as what a failed undo left (phase releasing, the errors), and writes it. */
  private quarantine(rec: PodRecord, errors: Error[], log: Logger): void {
    rec.phase = Phase.Releasing;
    rec.quarantine = { at: new Date().toISOString(), errors: errors.map((x) => errorChain(x)) };
    log.error({ errors: rec.quarantine.errors }, 'undo incomplete: what is left is quarantined until the next add or release of the key');
    this.safeWrite(rec, log);
  }

  /**
   * A record not ready (left by a failed add or release, or a crash) found by `op`: undone now; when that fails
   * again the key stays quarantined and `op` fails saying so.
   */
  private async finishLeftover(rec: PodRecord, log: Logger, op: string): Promise<void> {
    log.warn({ phase: rec.phase, quarantine: rec.quarantine }, 'finishing what an earlier operation on this key left');
    rec.phase = Phase.Releasing;
    this.safeWrite(rec, log);
    const errors = await undoRecord(this.deps, rec, log);
    if (errors.length > 0) {
      this.quarantine(rec, errors, log);
      throw new VmpodError(ErrorCode.Conflict, `${op} ${rec.key}: what an earlier failed operation left is quarantined and still cannot be undone: ${rec.quarantine!.errors.join('; ')}; fix the cause, or run "tapctl release --force ${rec.key}"`, {
        key: rec.key,
        op,
      });
    }
    this.store.remove(rec.key);
    log.info('quarantine finished');
  }

  /**
   * The network(s) a DEL runs against: the config recorded with the ADD; for a record without one (a record lost,
   * or written before configs were recorded), those the CNI cache holds for this attachment (libcni keeps the
   * config beside the result); else the config dir as it is now. A config dir that cannot be read does not stop
   * the release: the DEL is skipped, loudly (there is nothing to tell the network by).
   */
  private async networksForDel(rec: PodRecord, ifName: string, config: string | undefined): Promise<NetworkConfigList[]> {
    if (config !== undefined) return [parseConfList(Buffer.from(config, 'base64'), `the CNI config recorded for ${rec.key}`)];
    const cached = await this.opts.cni.cachedNetworks(rec.key, ifName);
    if (cached.length > 0) return cached;
    try {
      return [await this.opts.loadConfList()];
    } catch (e) {
      this.log.error({ key: rec.key, op: 'release', err: e }, 'CNI DEL skipped: no config recorded or cached for this pod and the config dir fails; IPAM allocations of the pod may remain');
      return [];
    }
  }

  private safeWrite(rec: PodRecord, log: Logger): void {
    try {
      this.store.write(rec);
    } catch (e) {
      log.error({ err: e }, 'writing the state record failed');
    }
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

/**
 * The CNI attachment of a pod: its key as the container id, the K8S_* args kubelet's CRI runtime would pass, and the
 * request's port mappings and bandwidth as capability args (runtimeConfig of the plugins that declare them). All of it
 * comes from the record, so DEL (and a restart's) gets what ADD got.
 */
export function runtimeConf(rec: Pick<PodRecord, 'key' | 'nsPath' | 'desc'>, ifName: string): RuntimeConf {
  const caps = capabilityArgs(rec.desc);
  return {
    ...(caps ? { capabilityArgs: caps } : {}),
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

/** The capability args of a pod (CNI conventions: portMappings, bandwidth); undefined when it has none. */
export function capabilityArgs(desc: PodNetworkDesc): Record<string, unknown> | undefined {
  const caps: Record<string, unknown> = {};
  if (desc.portMappings && desc.portMappings.length > 0) caps['portMappings'] = desc.portMappings;
  if (desc.bandwidth) caps['bandwidth'] = desc.bandwidth;
  return Object.keys(caps).length > 0 ? caps : undefined;
}

/** A pod's interfaces for a log line: `virtlet-eth0->br0/tap0`, or a VF's PCI address and PF. */
export function describeInterfaces(st: Pick<PodNetworkState, 'interfaces'>): string[] {
  return st.interfaces.map((i) =>
    i.type === 'vf'
      ? `${i.cniName}->vfio-pci ${i.pciAddress ?? '?'} (VF ${i.vf?.vfIndex ?? '?'} of ${i.vf?.pfIfname ?? '?'})`
      : i.binding === 'tc-redirect'
        ? `${i.cniName}<-tc-redirect->${i.tapName}`
        : `${i.cniName}->${i.bridgeName}/${i.tapName}`,
  );
}
