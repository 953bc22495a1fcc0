// The pod networks of this node: the map of live ones and the dispatch of each operation to its module: add.ts (the
// add pipeline, stage by stage), release.ts, restore.ts (restart, recover, get after a restart) and quarantine.ts.
// Each step is written to the record BEFORE it is applied (steps.ts); teardown, failed-ADD rollback and restart
// recovery all run the recorded undo ops in reverse. SR-IOV VFs (enableSriov): bound to vfio-pci and configured on
// their PF in the host netns (vf.ts, src/devices).
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { ErrorCode, VmpodError } from '../errors.js';
import { lazyChild, type Logger } from '../log.js';
import { validateKey } from '../identity.js';
import type { PodNetworkDesc, RecoverPayload } from '../protocol/payloads.js';
import type { CniClient, NetworkConfigList } from '../cni/index.js';
import { Sysfs } from '../devices/sysfs.js';
import { StateStore } from '../state/store.js';
import { Phase, StepName, newRecord, type PodRecord } from '../state/record.js';
import { NetExec } from './exec.js';
import { preparedSteps } from './plan.js';
import { POD_NETNS_SYSCTLS } from './netnssteps.js';
import { DEFAULT_IFNAME } from './types.js';
import { runSteps } from './steps.js';
import { SpareNetns, type Spare } from './sparens.js';
import { native } from '../native.js';
import { ipVfLink } from './vf.js';
import { closeFds, isBusy } from './fds.js';
import { addPodNetwork, type AddRequest } from './add.js';
import { cniDel, releasePodNetwork, type Released } from './release.js';
import { attach, recoverPodNetwork, restoreRecord, type RestoreOutcome } from './restore.js';
import { readRecord } from './quarantine.js';
import type { PodEnv, PodNetworkState } from './podenv.js';
import { expectedBinding, type BindingMode } from './binding.js';
import { checkPod, type PodCheck } from './check.js';
import { networksForDel } from './release.js';
import { runtimeConf } from './podenv.js';

export { resultForRecover } from './recover.js';
export type { PodNetworkState } from './podenv.js';
export { capabilityArgs, runtimeConf } from './podenv.js';

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
  /**
   * Pod netns to keep made ahead of time, while no add or release is in flight (sparens.ts); an add that finds one
   * skips making its netns and its prepared links. Default 0 (tapmanager's --spare-netns sets 1).
   */
  spareNetns?: number;
  /** how CNI interfaces are joined to their taps (binding.ts): default auto */
  binding?: BindingMode;
}

export class PodNetwork {
  private readonly states = new Map<string, PodNetworkState>();
  private readonly netnsDir: string;
  private readonly env: PodEnv;
  private readonly spares: SpareNetns;

  constructor(opts: PodNetworkOptions) {
    this.netnsDir = opts.netnsDir ?? IP_NETNS_DIR;
    if (![IP_NETNS_DIR, '/run/netns'].includes(resolve(this.netnsDir))) {
      // `ip netns add` and `ip -n NAME` only know NETNS_RUN_DIR; another dir would need our own bind mounts
      throw new VmpodError(
        ErrorCode.Config,
        `netnsDir ${JSON.stringify(this.netnsDir)}: only ${IP_NETNS_DIR} (or /run/netns) is supported, as ` +
          `iproute2's "ip netns" uses it`,
      );
    }
    const exec = new NetExec(opts.cmdTimeoutMs);
    const store = new StateStore(opts.stateDir);
    const log = opts.log;
    this.spares = new SpareNetns(opts.spareNetns ?? 0, () => this.makeSpare(), log);
    this.env = {
      store,
      cni: opts.cni,
      loadConfList: opts.loadConfList,
      spares: this.spares,
      ifName: opts.ifNamePrefix ?? DEFAULT_IFNAME,
      enableSriov: opts.enableSriov === true,
      binding: opts.binding ?? 'auto',
      log,
      deps: {
        exec,
        store,
        sysfs: opts.sysfs ?? new Sysfs(opts.sysfsRoot ?? '/sys'),
        vfLink: opts.vfLink ?? ipVfLink(exec),
        netnsDir: this.netnsDir,
        vfNetdevTimeoutMs: opts.vfNetdevTimeoutMs ?? 10_000,
        cniDel: cniDel({ cni: opts.cni, loadConfList: opts.loadConfList, log }),
      },
    };
  }

  /**
   * A pod netns as an add makes it before its plugins return (podNetnsSteps, preparedSteps for the binding the node's
   * network is expected to get: binding.ts expectedBinding), held by an fd.
   */
  private async makeSpare(): Promise<Spare> {
    const list = await this.env.loadConfList().catch(() => undefined);
    const preparedFor = expectedBinding(this.env.binding, list?.plugins[0]?.type);
    const fd = await native().netnsMake(POD_NETNS_SYSCTLS);
    try {
      // a record of its own, never written: the add that takes the spare records these steps under its key
      const steps = preparedSteps(this.env.ifName, preparedFor);
      const rec = newRecord({
        key: 'spare',
        desc: { podId: '', podNs: '', podName: '' },
        nsPath: `/proc/self/fd/${fd}`,
        phase: Phase.Adding,
        steps,
        cniIfNames: [this.env.ifName],
      });
      await runSteps(this.env.deps, rec, steps);
    } catch (e) {
      native().close(fd);
      throw e;
    }
    return { fd, preparedFor };
  }

  /** How many spare pod netns are ready to be taken (made and prepared; one being made is not counted). */
  get sparesReady(): number {
    return this.spares.count;
  }

  nsPathOf(key: string): string {
    return join(this.netnsDir, key);
  }

  /** Adds the pod network of `key` (add.ts: the pipeline, stage by stage); see AddRequest for whileApplying. */
  async add(
    key: string,
    desc: PodNetworkDesc,
    signal?: AbortSignal,
    opts: Pick<AddRequest, 'whileApplying' | 'list'> = {},
  ): Promise<PodNetworkState> {
    validateKey(key);
    if (this.states.has(key)) {
      throw new VmpodError(ErrorCode.Conflict, `add ${key}: a pod network for this key exists; release it first`, {
        key,
        op: 'add',
      });
    }
    this.spares.begin();
    try {
      const st = await addPodNetwork(this.env, {
        key,
        desc,
        nsPath: this.nsPathOf(key),
        ...(signal ? { signal } : {}),
        ...opts,
      });
      this.states.set(key, st);
      return st;
    } finally {
      this.spares.end();
    }
  }

  /**
   * Undoes the pod network and forgets it. `force` (tapctl release --force): the record goes even when undo
   * steps fail; what could not be undone is returned (and logged) instead of thrown.
   */
  async release(key: string, opts: { force?: boolean } = {}): Promise<Released> {
    validateKey(key);
    const st = this.states.get(key);
    this.states.delete(key);
    this.spares.begin();
    try {
      return await releasePodNetwork(this.env, key, this.nsPathOf(key), st, opts.force === true);
    } finally {
      this.spares.end();
    }
  }

  /** Re-attach to an existing pod network (after a restart), without CNI ADD. */
  async recover(key: string, payload: RecoverPayload): Promise<PodNetworkState> {
    validateKey(key);
    const st = await recoverPodNetwork(this.env, key, this.nsPathOf(key), this.states.get(key), payload);
    this.states.set(key, st);
    return st;
  }

  /** tapctl check and --check-interval: the pod's own checks and CNI CHECK (check.ts). Changes nothing. */
  async check(key: string, dhcp: () => string | undefined): Promise<PodCheck> {
    validateKey(key);
    const rec = this.env.store.read(key);
    if (!rec) throw new VmpodError(ErrorCode.NotFound, `no pod network for key ${key}`, { key, op: 'check' });
    if (rec.phase !== Phase.Ready)
      throw new VmpodError(
        ErrorCode.State,
        `pod network ${key} is in phase "${rec.phase}", not ready: nothing to check`,
        { key, op: 'check' },
      );
    const ifName = rec.cniIfNames[0] ?? this.env.ifName;
    const del = rec.steps.find((st) => st.name === StepName.CniAdd)?.undo.find((o) => o.op === 'cni-del');
    const config = del?.op === 'cni-del' ? del.config : undefined;
    return checkPod({
      key,
      nsPath: rec.nsPath,
      interfaces: rec.interfaces,
      cni: this.env.cni,
      networks: () => networksForDel(this.env, rec, ifName, config),
      runtime: runtimeConf(rec, ifName),
      dhcp,
      exec: this.env.deps.exec,
    });
  }

  /** A pod netns exists for `key` (false for a string that is not a valid key). */
  netnsExists(key: string): boolean {
    try {
      validateKey(key);
    } catch {
      return false;
    }
    return existsSync(this.nsPathOf(key));
  }

  /** CNI_IFNAME of the pods this network adds (the attachments in the CNI cache that are tapmanager's). */
  get cniIfName(): string {
    return this.env.ifName;
  }

  state(key: string): PodNetworkState | undefined {
    return this.states.get(key);
  }

  /**
   * For get: the state with its fds (one per interface), reopening them from the record if they were lost (a restart).
   */
  async ensureFds(key: string): Promise<PodNetworkState> {
    validateKey(key);
    const have = this.states.get(key);
    if (have && have.fds.length === have.interfaces.length) return have;
    const rec = this.env.store.read(key);
    if (!rec) throw new VmpodError(ErrorCode.NotFound, `no pod network for key ${key}`, { key, op: 'get' });
    if (rec.phase !== Phase.Ready || !rec.csn) {
      throw new VmpodError(ErrorCode.State, `pod network ${key} is in phase "${rec.phase}", not ready`, {
        key,
        op: 'get',
      });
    }
    try {
      const st = await attach(this.env, rec);
      this.states.set(key, st);
      return st;
    } catch (e) {
      if (isBusy(e))
        throw new VmpodError(
          ErrorCode.Conflict,
          `get ${key}: a tap of the pod is in use (EBUSY): the VM holds it already`,
          { cause: e, key, op: 'get' },
        );
      throw e;
    }
  }

  /** Daemon start: ready records get their taps reopened; records left adding/releasing are undone. */
  async restore(): Promise<{
    restored: string[];
    rolledBack: string[];
    netnsMissing: string[];
    quarantined: string[];
  }> {
    const out = {
      restored: [] as string[],
      rolledBack: [] as string[],
      netnsMissing: [] as string[],
      quarantined: [] as string[],
    };
    this.sweepTemps();
    for (const key of this.env.store.keys()) {
      const r = await this.restoreKey(key);
      if (r !== 'kept' && r !== 'none') out[r].push(key);
    }
    return out;
  }

  /** kill -9 leftovers: half-written temporary records (the records themselves are whole); run before a restore. */
  sweepTemps(): void {
    const temps = this.env.store.sweepTemps();
    if (temps.length > 0) this.env.log.info({ files: temps }, 'removed temporary state files a killed daemon left');
  }

  /** Keys with a state record, as a restore would visit them. */
  recordedKeys(): string[] {
    return this.env.store.keys();
  }

  /**
   * Restores one key at daemon start (restore.ts; the daemon runs this in the key's queue, so requests for the key
   * wait for it).
   */
  async restoreKey(key: string): Promise<RestoreOutcome> {
    if (this.states.has(key)) return 'none';
    const { outcome, st } = await restoreRecord(this.env, key);
    if (st) this.states.set(key, st);
    return outcome;
  }

  /**
   * Every state record with its phase, for list and the pods-by-state metric: "quarantined" when its undo could not
   * finish (release --force ends it), "corrupt" when unreadable.
   */
  records(): { key: string; phase: string; rec?: PodRecord }[] {
    return this.env.store.keys().map((key) => {
      const { rec, corrupt } = readRecord(this.env.store, key);
      if (!rec) return { key, phase: corrupt ? 'corrupt' : 'missing' };
      return { key, phase: rec.quarantine ? 'quarantined' : rec.phase, rec };
    });
  }

  /** Keys with a record or in memory, sorted. */
  keys(): string[] {
    return [...new Set([...this.env.store.keys(), ...this.states.keys()])].sort();
  }

  /** Daemon exit: close our fds; the pod networks stay in place (the taps are persistent); the spare netns go. */
  closeAll(): void {
    this.spares.close();
    for (const st of this.states.values()) void closeFds(st.fds, lazyChild(this.env.log, { key: st.key, op: 'close' }));
  }
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
