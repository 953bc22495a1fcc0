// The add of one pod network, stage by stage, in the order they run (each a function below, in this order):
//   checkKeyFree    nothing of the key is live or in the way; what an earlier failed operation left is finished first
//   readNetwork     the CNI config list read (or the one the caller admitted) and its plugins located: a failure
//                   here has made nothing
//   startCniAdd     the plugins' ADD started: its first plugin exec'd now, before the stages below, and given its
//                   config once the netns is made and the record durable (until then it has done nothing)
//   takeNetns       a spare netns made while idle (its links prepared already) or a fresh one: chosen once, here,
//                   with the binding its links are prepared for
//   recordAdd       the netns, its prepared links and the CNI ADD written to the record (durably), before any runs
//   makeNetns       the netns made, or the spare bound under the key, while the record's fsyncs run
//   runCniAdd       the plugins' ADD to its end; a fresh netns gets its prepared links on a pool thread meanwhile
//   observeAndPlan  the netns read and the container side planned (plan.ts, pure), DHCP's early start with it
//   applyPlan       the plan recorded, then applied; the caller's DHCP servers start meanwhile when the plan says so
//   openTaps        the taps opened for the VM
//   markReady       the CNI cache written, the record ready: the pod network's state
// and rollBack, when any stage fails: the record's undo ops run in reverse (steps.ts), the record goes (or stays
// quarantined when the undo cannot finish).
import { existsSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { ErrorCode, VmpodError, errorChain, isVmpodError, type ErrorCode as ErrorCodeT } from '../errors.js';
import { lazyChild, type Logger } from '../log.js';
import type { PodNetworkDesc, ContainerSideNetwork, CniResultV031 } from '../protocol/payloads.js';
import { toV031 } from '../protocol/result.js';
import { CniPluginError, startHeld, type NetworkConfigList } from '../cni/index.js';
import type { CniResult } from '../cni/types.js';
import { native } from '../native.js';
import { Phase, StepName, newRecord, type PodRecord, type Step } from '../state/record.js';
import type { PodInterface } from '../state/types.js';
import { observeNetns } from './exec.js';
import { completeResult, withPodDns } from './result.js';
import { planContainerSide, preparedSteps, randomLaaMac, type ContainerSidePlan } from './plan.js';
import { cniAddStep, podNetnsSteps } from './netnssteps.js';
import { buildCsn } from './csn.js';
import {
  StepError,
  bindNetns,
  forgetStep,
  recordSteps,
  recordStepsThenSync,
  runSteps,
  stepError,
  undoRecord,
  type StepDeps,
} from './steps.js';
import { findVfs, planVfs } from './vf.js';
import { chooseBinding, expectedBinding, type Binding } from './binding.js';
import type { Spare } from './sparens.js';
import type { ObservedLink } from './types.js';
import { closeFds, openFds } from './fds.js';
import { finishLeftover, quarantine } from './quarantine.js';
import { runtimeConf, type PodEnv, type PodNetworkState } from './podenv.js';

export interface AddRequest {
  key: string;
  desc: PodNetworkDesc;
  /** where the pod netns is mounted */
  nsPath: string;
  signal?: AbortSignal;
  /**
   * Called with the pod network as it will be (no fds yet) while its plan is applied, when the plan says the DHCP
   * servers can start then (ContainerSidePlan.dhcpEarly), so that the caller's work overlaps the apply; a throw fails
   * the add (rolled back). Not called otherwise: the caller does that work after add.
   */
  whileApplying?: (st: PodNetworkState) => void;
  /** the network to add to, when the caller read it already (the CNI STATUS admission); else it is read here */
  list?: NetworkConfigList;
}

/** What a failed add must let go of besides its record: the spare it took, the CNI cache write, the fds. */
interface Held {
  netns?: NetnsSource;
  cniSettled?: () => Promise<void>;
  fds: number[];
}

/** Adds the pod network of req.key: every stage in order; on a failure, the rollback. */
export async function addPodNetwork(env: PodEnv, req: AddRequest): Promise<PodNetworkState> {
  const log = lazyChild(env.log, { key: req.key, op: 'add' });
  // when each stage ended, in ms from the start: the debug line at the end carries them (bench/add-stages.mjs)
  const t0 = performance.now();
  const stages: Record<string, number> = {};
  const mark = (stage: string): void => {
    stages[stage] = Math.round((performance.now() - t0) * 100) / 100;
  };
  await checkKeyFree(env, req, log);
  const rec = newRecord({
    key: req.key,
    desc: req.desc,
    nsPath: req.nsPath,
    phase: Phase.Adding,
    steps: [],
    cniIfNames: [env.ifName],
  });
  const held: Held = { fds: [] };
  try {
    const list = await readNetwork(env, req.list);
    const gate = netnsGate();
    const { adding, started } = startCniAdd(env, rec, list, gate.made, req.signal);
    await started;
    const { netns, recorded } = await gate.take(takeAndRecord(env, rec, list, held), adding);
    const made = makeNetns(env.deps, rec, netns, recorded, req.signal).then(() => mark('netns'));
    gate.open(made);
    const result = await runCniAdd(env, rec, list, netns, recorded, made, adding, held, req.signal);
    mark('cni');
    const planned = await observeAndPlan(env, rec, list, result, netns.preparedFor, log, req.signal);
    mark('planned');
    const applied = await applyPlan(env.deps, rec, planned, req, mark);
    mark('applied');
    held.fds = await openTaps(env, rec.nsPath, applied.interfaces);
    mark('taps');
    const st = await markReady(env, rec, applied, held);
    mark('ready');
    log.debug({ netnsFrom: netns.from, stages }, 'pod network added');
    return st;
  } catch (e) {
    throw await rollBack(env, rec, held, e, log);
  }
}

/**
 * Nothing of the key is in the way: a ready record is a live pod network (release it first), a netns at nsPath not
 * ours is never adopted (nor deleted on rollback); a record left by a failed add or release (or a crash) is undone
 * first, so that it never blocks the retry.
 */
async function checkKeyFree(env: PodEnv, req: AddRequest, log: Logger): Promise<void> {
  const old = env.store.read(req.key);
  if (old?.phase === Phase.Ready) {
    throw new VmpodError(ErrorCode.Conflict, `add ${req.key}: a pod network for this key exists; release it first`, {
      key: req.key,
      op: 'add',
    });
  }
  if (old) await finishLeftover(env, old, log, 'add');
  if (existsSync(req.nsPath)) {
    throw new VmpodError(ErrorCode.Conflict, `add ${req.key}: netns ${req.nsPath} exists already`, {
      key: req.key,
      op: 'add',
    });
  }
}

/**
 * The network read (unless the caller gives the one it admitted) and its plugins located before anything is made: a
 * missing plugin or a broken config dir has run nothing.
 */
async function readNetwork(env: PodEnv, given?: NetworkConfigList): Promise<NetworkConfigList> {
  try {
    const list = given ?? (await env.loadConfList());
    await env.cni.locate(list);
    return list;
  } catch (e) {
    throw stepError(StepName.CniAdd, undefined, e);
  }
}

/**
 * Where the add's netns comes from, chosen once (takeNetns). Either way the netns ends with the pod netns steps
 * (podNetnsSteps) and the prepared links (preparedSteps) done; the source says how.
 */
interface NetnsSource {
  /** where it came from (the add's debug line says so) */
  from: 'spare' | 'fresh';
  /** the binding its prepared links are for (binding.ts expectedBinding; plan.ts preparedSteps) */
  preparedFor: Binding;
  /** does the pod netns steps, recorded already */
  make(deps: StepDeps, rec: PodRecord, steps: Step[], signal?: AbortSignal): Promise<void>;
  /** does the prepared steps (recorded already) while the plugins run */
  prepare(deps: StepDeps, rec: PodRecord, steps: Step[], signal?: AbortSignal): Promise<void>;
  /** lets go of what it holds when the add fails before make */
  discard(): void;
}

/** The CNI ADD as it ends (it never rejects): its result and the settling of its cache write, or its error. */
type Adding = Promise<{ added: { result: CniResult; settled: () => Promise<void> } } | { error: unknown }>;

/**
 * The CNI ADD started before the netns is taken: its first plugin is exec'd now (`started` resolves then, or once the
 * ADD has failed before it), ahead of the record's write, and is given its config once `made` resolves (the netns
 * made and the record durable). A plugin does nothing before it has read its config, and its start (the exec, its
 * runtime's own) takes longer than all of that.
 */
function startCniAdd(
  env: PodEnv,
  rec: PodRecord,
  list: NetworkConfigList,
  made: Promise<void>,
  signal?: AbortSignal,
): { adding: Adding; started: Promise<void> } {
  const { running, execd } = startHeld(made, (hold) =>
    env.cni.addDeferred(list, runtimeConf(rec, env.ifName), signal, hold),
  );
  const adding: Adding = running.then(
    (added) => ({ added }),
    (error: unknown) => ({ error }),
  );
  return { adding, started: execd };
}

/**
 * What the started CNI ADD waits for: `made`, resolved by open() with the netns stage, or rejected by take() when the
 * netns cannot be taken or the add recorded (the plugin is then killed without its config, and take() rethrows once
 * it is gone).
 */
function netnsGate() {
  let open!: (made: Promise<void>) => void;
  let fail!: (e: unknown) => void;
  const made = new Promise<void>((resolve, reject) => {
    open = (m) => m.then(resolve, reject);
    fail = reject;
  });
  // a plugin whose exec failed never waits for it: its rejection is handled here then
  made.catch(() => {});
  return {
    made,
    open,
    async take<T>(taking: Promise<T>, adding: Adding): Promise<T> {
      try {
        return await taking;
      } catch (e) {
        fail(e);
        await adding;
        throw e;
      }
    },
  };
}

/** The netns taken (held, so that a rollback lets go of it) and the add recorded. */
async function takeAndRecord(
  env: PodEnv,
  rec: PodRecord,
  list: NetworkConfigList,
  held: Held,
): Promise<{ netns: NetnsSource; recorded: Recorded }> {
  const netns = (held.netns = await takeNetns(env, list));
  return { netns, recorded: recordAdd(env, rec, list, netns.preparedFor) };
}

/**
 * A netns made while tapmanager was idle (sparens.ts), with its links prepared, or else a fresh one, whose links are
 * prepared for the binding that the network's first plugin is expected to get.
 */
async function takeNetns(env: PodEnv, list: NetworkConfigList): Promise<NetnsSource> {
  const spare = await env.spares.take();
  return spare === undefined ? freshNetns(expectedBinding(env.binding, list.plugins[0]?.type)) : spareNetns(spare);
}

function freshNetns(preparedFor: Binding): NetnsSource {
  return { from: 'fresh', preparedFor, make: runSteps, prepare: runSteps, discard: () => {} };
}

function spareNetns({ fd, preparedFor }: Spare): NetnsSource {
  let held = true;
  return {
    from: 'spare',
    preparedFor,
    // bound under the key; bindNetns closes the fd (the mount holds the netns)
    make: (deps, rec, steps) => {
      held = false;
      return bindNetns(deps, rec, steps[0]!, rec.key, fd);
    },
    // made with them (sparens.ts)
    prepare: async () => {},
    discard: () => {
      if (held) native().close(fd);
      held = false;
    },
  };
}

/** The steps the add records before any of them runs, and the durable write of them. */
interface Recorded {
  netns: Step[];
  prepared: Step[];
  cniAdd: Step;
  /** resolves once the record is on disk (a CNI ADD's IPAM allocation outlives a reboot: it waits for this) */
  durable: Promise<void>;
}

/**
 * One durable write covers the netns, what is prepared in it and the CNI ADD (its DEL must follow even a failed ADD).
 * The prepared links come before the CNI ADD: a rollback's DEL comes first, and the netns's removal takes them. The
 * exact config goes with the pod: its DEL runs against this network, whatever the config dir holds then.
 */
function recordAdd(env: PodEnv, rec: PodRecord, list: NetworkConfigList, preparedFor: Binding): Recorded {
  const netns = podNetnsSteps(rec.key);
  const prepared = preparedSteps(env.ifName, preparedFor);
  const cniAdd = cniAddStep(env.ifName, list.bytes.toString('base64'));
  const durable = recordStepsThenSync(env.store, rec, [...netns, ...prepared, cniAdd]);
  return { netns, prepared, cniAdd, durable };
}

/** The netns made while the record's fsyncs run (a reboot takes it anyway); both are over when this resolves. */
async function makeNetns(
  deps: StepDeps,
  rec: PodRecord,
  netns: NetnsSource,
  recorded: Recorded,
  signal?: AbortSignal,
): Promise<void> {
  try {
    await netns.make(deps, rec, recorded.netns, signal);
  } finally {
    await recorded.durable.catch(() => {});
  }
  await recorded.durable;
}

/**
 * The CNI ADD to its end (startCniAdd started it; its plugin gets its config once `made` resolves). The prepared links
 * (the bridge, tap and filter that need nothing from the result) are made on a pool thread once the netns is, as the
 * plugins take most of an add, waiting. All of it is over before anything goes on, or back; a failure of `made` is
 * the add's, whatever the plugin did (it was killed without its config). A first plugin that could not be executed ran
 * nothing: its step leaves the record, and the rollback runs no DEL.
 */
async function runCniAdd(
  env: PodEnv,
  rec: PodRecord,
  list: NetworkConfigList,
  netns: NetnsSource,
  recorded: Recorded,
  made: Promise<void>,
  adding: Adding,
  held: Held,
  signal?: AbortSignal,
): Promise<CniResult> {
  const prepared = made
    .then(() => netns.prepare(env.deps, rec, recorded.prepared, signal))
    .then(
      () => undefined,
      (e: unknown) => e,
    );
  try {
    const ended = await adding;
    if ('error' in ended) throw ended.error;
    const { added } = ended;
    held.cniSettled = added.settled;
    const prepError = await prepared;
    if (prepError !== undefined) throw prepError;
    return added.result;
  } catch (e) {
    await prepared;
    const notMade = await made.then(
      () => undefined,
      (m: unknown) => m,
    );
    if (notMade !== undefined) throw notMade;
    if (e instanceof StepError) throw e;
    if (ranNothing(e, list)) forgetStep(env.store, rec, recorded.cniAdd);
    throw stepError(recorded.cniAdd.name, undefined, e);
  }
}

/** The errnos of an exec that started nothing (the file is missing, not executable, or not a program). */
const NOT_EXECUTED: ReadonlySet<string> = new Set(['ENOENT', 'EACCES', 'ENOEXEC']);

/** Did this ADD fail at the exec of the list's first plugin (so that no plugin ran)? */
function ranNothing(e: unknown, list: NetworkConfigList): boolean {
  if (!(e instanceof CniPluginError) || e.plugin !== list.plugins[0]?.type) return false;
  const code = (e.cause as NodeJS.ErrnoException | undefined)?.code;
  return code !== undefined && NOT_EXECUTED.has(code);
}

/** The container side planned from the netns as the plugins left it; `result` is the plugins' result, completed. */
interface Planned {
  plan: ContainerSidePlan;
  result: CniResult;
}

/** The netns read, the result completed from it (and the request's DNS), VFs found and planned, the plan made. */
async function observeAndPlan(
  env: PodEnv,
  rec: PodRecord,
  list: NetworkConfigList,
  added: CniResult,
  preparedFor: Binding,
  log: Logger,
  signal?: AbortSignal,
): Promise<Planned> {
  try {
    // on the event loop when this add is alone: the loop is awake already (the plugin just exited), and a pool
    // thread woken after the plugin's run costs more than the three dumps; with other adds and releases in flight,
    // whose plugins and link changes hold rtnl_lock, the dumps may wait for it, and the loop must not
    const observed = await observeNetns(rec.nsPath, signal, { offLoop: env.spares.inFlight > 1 });
    // the request's DNS goes into the result the runtime keeps (Virtlet's), and so to DHCP after a recover
    const result = withPodDns(completeResult(added, observed, rec.nsPath), rec.desc.DNS);
    const vfs = findVfs(env.deps.sysfs, observed, result);
    const vfSetups = env.enableSriov
      ? await planVfs(env.deps.sysfs, env.deps.vfLink, observed, vfs, list, log, signal)
      : undefined;
    const bindingOf = (_i: number, link: ObservedLink): Binding => chooseBinding(env.binding, link);
    const plan = planContainerSide({
      observed,
      result,
      newMac: () => randomLaaMac(),
      vfs: new Set(vfs.keys()),
      prepared: env.ifName,
      preparedFor,
      bindingOf,
      ...(vfSetups ? { vfSetups } : {}),
    });
    // after the add's turn: serializing what was observed would otherwise time into the plan stage
    if (log.isLevelEnabled('debug'))
      setImmediate(() => log.debug({ observed, steps: plan.steps.length }, 'container-side network planned'));
    return { plan, result };
  } catch (e) {
    throw stepError('plan', undefined, e);
  }
}

/** What the reply and the ready record hold. */
interface Applied {
  result: CniResultV031;
  csn: ContainerSideNetwork;
  interfaces: PodInterface[];
}

/**
 * The plan recorded, then applied on a pool thread; meanwhile the reply's csn is built and, when the plan says so,
 * the caller's whileApplying runs (should either throw, the steps end first).
 */
async function applyPlan(
  deps: StepDeps,
  rec: PodRecord,
  planned: Planned,
  req: AddRequest,
  mark: (stage: string) => void,
): Promise<Applied> {
  const { plan } = planned;
  recordSteps(deps.store, rec, plan.steps);
  mark('recorded');
  const applying = runSteps(deps, rec, plan.steps, req.signal);
  try {
    const result = toV031(planned.result);
    const csn = buildCsn(result, rec.nsPath, plan.interfaces);
    if (plan.dhcpEarly && req.whileApplying) {
      try {
        req.whileApplying({
          key: rec.key,
          nsPath: rec.nsPath,
          csn,
          interfaces: plan.interfaces,
          fds: [],
          desc: rec.desc,
        });
      } catch (e) {
        throw stepError('dhcp', undefined, e);
      }
      mark('dhcp');
    }
    await applying;
    return { result, csn, interfaces: plan.interfaces };
  } catch (e) {
    await applying.catch(() => {});
    throw e;
  }
}

/**
 * The VM's fds. On the event loop when this add is alone; on a pool thread when other adds or releases run, whose
 * plugins and link changes hold rtnl_lock, which TUNSETIFF waits for.
 */
async function openTaps(env: PodEnv, nsPath: string, interfaces: PodInterface[]): Promise<number[]> {
  try {
    return await openFds(nsPath, interfaces, env.log, { justMade: true, offLoop: env.spares.inFlight > 1 });
  } catch (e) {
    throw stepError('open-tap', undefined, e);
  }
}

/**
 * The CNI ADD's cache file and bookkeeping over, the record ready: atomic, not durable (after a crash of the machine
 * the netns is gone and the adding record's undo, CNI DEL, is what is left to do: its durable write covers it).
 */
async function markReady(env: PodEnv, rec: PodRecord, applied: Applied, held: Held): Promise<PodNetworkState> {
  const settled = held.cniSettled;
  held.cniSettled = undefined;
  try {
    await settled?.();
  } catch (e) {
    throw stepError(StepName.CniAdd, undefined, e);
  }
  rec.phase = Phase.Ready;
  rec.result = applied.result;
  rec.csn = applied.csn;
  rec.interfaces = applied.interfaces;
  env.store.write(rec, false);
  return {
    key: rec.key,
    nsPath: rec.nsPath,
    csn: applied.csn,
    interfaces: applied.interfaces,
    fds: held.fds,
    desc: rec.desc,
  };
}

/**
 * Undoes what the record holds, in reverse; the record goes, or stays quarantined when the undo cannot finish (the
 * next add or release of the key finishes it). Returns the add's error, saying which step failed and what is left.
 */
async function rollBack(env: PodEnv, rec: PodRecord, held: Held, e: unknown, log: Logger): Promise<VmpodError> {
  held.netns?.discard();
  await closeFds(held.fds, log);
  const op = isVmpodError(e) && e.op ? e.op : 'add';
  log.error({ err: e, step: op }, 'add failed: rolling back');
  // the DEL reads the cache the ADD wrote (prevResult): the write is over first, whatever it gave
  await held.cniSettled?.().catch(() => {});
  const undoErrors = await undoRecord(env.deps, rec, log);
  let tail = '';
  if (undoErrors.length === 0) {
    try {
      env.store.remove(rec.key);
    } catch (re) {
      log.error({ err: re }, 'removing the state record after the rollback failed');
    }
  } else {
    quarantine(env.store, rec, undoErrors, log);
    tail =
      ` (rollback incomplete: ${undoErrors.map((u) => errorChain(u)).join('; ')}; what is left is quarantined: ` +
      `the next add or release of ${rec.key} finishes it first, or run "tapctl release --force ${rec.key}")`;
  }
  const what = e instanceof StepError ? e.message : `step "${op}" failed: ${errorChain(e)}`;
  const code: ErrorCodeT = isVmpodError(e) ? e.code : ErrorCode.Internal;
  return new VmpodError(code, `add ${rec.key}: ${what}${tail}`, { cause: e, key: rec.key, op });
}
