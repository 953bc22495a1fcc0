// The step engine: records steps and applies their do-ops, and runs the recorded undo-ops (teardown, failed-ADD
// rollback, restart recovery). Each step is written to the record BEFORE it is applied (DESIGN.md), so an undo
// run reads exactly what may have been done. Ops are grouped into runs (runsOf, pure) so that many link
// operations cost one addon call (rtnetlink in the pod netns); the filter is one nf_tables transaction. Nothing on the
// add path starts a process but the CNI plugins (ebtables runs only to undo records of earlier versions).
import { existsSync, rmSync, statSync } from 'node:fs';
import { native, netnsAdd } from '../native.js';
import { dirname, join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { ErrorCode, VmpodError, errorChain, isVmpodError, type ErrorCode as ErrorCodeT } from '../errors.js';
import type { Logger } from '../log.js';
import { startHeld, type ConfigHold } from '../cni/index.js';
import type { Sysfs } from '../devices/sysfs.js';
import { bindToVfio } from '../devices/bind.js';
import { vfLinkArgv } from '../devices/vf.js';
import type { StateStore } from '../state/store.js';
import type { Op, PodRecord, Step } from '../state/record.js';
import {
  addFilterTable,
  deleteFilterTable,
  isAlreadyUndone,
  lineText,
  runIpLines,
  type NetExec,
  type NetlinkLine,
} from './exec.js';
import { restoreVfDriver, restoreVfLink, returnVfNetdev, type VfLink } from './vf.js';

/** What the engine works with; PodNetwork builds it once. */
export interface StepDeps {
  exec: NetExec;
  store: StateStore;
  sysfs: Sysfs;
  vfLink: VfLink;
  /** where `ip netns` keeps named netns */
  netnsDir: string;
  /** how long the undo of a VF's bind waits for its netdev */
  vfNetdevTimeoutMs: number;
  /**
   * CNI DEL of the record's attachment ifName, with the config the ADD ran with when the op carries it; with hold,
   * its first plugin is exec'd at once and given its config once hold.until resolves (ConfigHold)
   */
  cniDel: (rec: PodRecord, ifName: string, config?: string, hold?: ConfigHold) => Promise<void>;
}

/** A failure of one recorded step (or of a stage that is not a step, such as open-tap): its message names the step. */
export class StepError extends VmpodError {}

export function stepError(step: string, target: string | undefined, cause: unknown): StepError {
  const code: ErrorCodeT = isVmpodError(cause) ? cause.code : ErrorCode.Internal;
  return new StepError(code, `step "${step}"${target ? ` on ${target}` : ''} failed: ${errorChain(cause)}`, {
    cause,
    op: step,
  });
}

/**
 * Takes a step out of the record, with every step recorded after it, and writes it: for a step that has made nothing
 * (its undo must not run) and after which nothing ran.
 */
export function forgetStep(store: StateStore, rec: PodRecord, step: Step): void {
  const at = rec.steps.indexOf(step);
  if (at >= 0) rec.steps = rec.steps.slice(0, at);
  store.write(rec);
}

export interface StepOp {
  step: Step;
  op: Op;
}

/** An op of a netlink batch: an `ip` or `tc` line, or sysctls written in the pod netns in their turn. */
export type NetlinkOp = Extract<Op, { op: 'ip' | 'tc' | 'sysctl' }>;

/**
 * Ops run together: the netns made with the sysctls of the step after it (one pool-thread call: the thread that made
 * it is in it), one batch of `ip` lines and sysctls (one netlink call), one ebtables-restore, or one op alone.
 */
export type Run =
  | { kind: 'netns'; step: Step; name: string; sysctl: Step; settings: string[] }
  | { kind: 'ip'; lines: { step: Step; op: NetlinkOp }[] }
  | { kind: 'ebtables'; step: Step; rules: string[][] }
  | { kind: 'one'; step: Step; op: Op };

/**
 * Pure: a netns-add and the sysctl op right after it form one run; consecutive ip and sysctl ops (of any steps)
 * form one run, all run by one netlink call in the pod netns; consecutive ebtables ops form one run per step (one
 * atomic ebtables-restore); every other op is a run alone.
 */
export function runsOf(items: readonly StepOp[]): Run[] {
  const runs: Run[] = [];
  for (const { step, op } of items) {
    const last = runs[runs.length - 1];
    if (op.op === 'sysctl' && last?.kind === 'one' && last.op.op === 'netns-add') {
      runs[runs.length - 1] = {
        kind: 'netns',
        step: last.step,
        name: last.op.name,
        sysctl: step,
        settings: op.settings,
      };
    } else if (op.op === 'ip' || op.op === 'tc' || op.op === 'sysctl') {
      if (last?.kind === 'ip') last.lines.push({ step, op });
      else runs.push({ kind: 'ip', lines: [{ step, op }] });
    } else if (op.op === 'ebtables') {
      if (last?.kind === 'ebtables' && last.step === step) last.rules.push(op.args);
      else runs.push({ kind: 'ebtables', step, rules: [op.args] });
    } else runs.push({ kind: 'one', step, op });
  }
  return runs;
}

/**
 * A netlink op as runIpLines takes it (a tc line marked by its leading "tc": exec.ts lineRequest); and as a message
 * shows it.
 */
const lineOf = (op: NetlinkOp): NetlinkLine =>
  op.op === 'sysctl' ? { sysctl: op.settings } : op.op === 'tc' ? ['tc', ...op.args] : op.args;
const textOf = (op: NetlinkOp): string =>
  op.op === 'sysctl' ? `sysctl -w ${op.settings.join(' ')}` : lineText(lineOf(op) as readonly string[]);

/** Pure: ebtables-restore input that changes the filter table by these rules (no flush), in one transaction. */
export function ebtablesRestoreInput(rules: readonly (readonly string[])[]): string {
  return ['*filter', ...rules.map((a) => a.join(' ')), 'COMMIT', ''].join('\n');
}

/**
 * Appends the steps to the record and writes it (one atomic write), durably when one of them does something that
 * outlives a reboot of the machine: a CNI ADD (its IPAM allocation), a VF's binding and PF settings. Everything else a
 * step makes lives in the pod netns, which a reboot takes with it; an atomic write covers a crash of tapmanager.
 */
export function recordSteps(store: StateStore, rec: PodRecord, steps: Step[]): void {
  appendWritten(rec, steps, () => store.write(rec, outlivesReboot(steps)));
}

/**
 * recordSteps, with the durable part left to finish meanwhile: the record is written (atomically) at once, and the
 * promise resolves once it is on disk. Whatever outlives a reboot must wait for it; what lives in the pod netns need
 * not.
 */
export function recordStepsThenSync(store: StateStore, rec: PodRecord, steps: Step[]): Promise<void> {
  return appendWritten(rec, steps, () => {
    if (outlivesReboot(steps)) return store.writeThenSync(rec);
    store.write(rec, false);
    return Promise.resolve();
  });
}

/**
 * The steps appended to rec, which write() then writes. A write that throws leaves rec without them: none of them
 * ran (each runs once it is recorded), so a rollback has nothing of them to undo (no DEL for an ADD that never had
 * its config, no removal of a netns never made).
 */
function appendWritten<T>(rec: PodRecord, steps: Step[], write: () => T): T {
  rec.steps.push(...steps);
  try {
    return write();
  } catch (e) {
    rec.steps.length -= steps.length;
    throw e;
  }
}

const outlivesReboot = (steps: Step[]): boolean => steps.some((s) => s.do.some((o) => OUTLIVES_REBOOT.has(o.op)));

const OUTLIVES_REBOOT: ReadonlySet<string> = new Set(['cni-add', 'vf-bind', 'vf-link']);

/**
 * Runs the do-ops of steps that are in the record already (recordSteps wrote them, possibly together with
 * later steps, so that one durable write covers them all).
 */
export async function runSteps(deps: StepDeps, rec: PodRecord, steps: Step[], signal?: AbortSignal): Promise<void> {
  // the rule the undo relies on, kept by the engine: no step runs that is not in the record
  const unrecorded = steps.find((s) => !rec.steps.includes(s));
  if (unrecorded)
    throw stepError(
      unrecorded.name,
      unrecorded.target,
      new VmpodError(ErrorCode.Internal, 'applied before it was recorded'),
    );
  const sig = signal ? { signal } : {};
  for (const run of runsOf(steps.flatMap((step) => step.do.map((op) => ({ step, op }))))) {
    if (run.kind === 'netns') await addNetnsWithSysctls(deps, rec, run);
    else if (run.kind === 'ip') await runNetlinkOps(rec, run.lines, sig);
    else {
      const { step } = run;
      try {
        // ebtables rules are only ever undone (records of earlier versions); the filter is an nft op now
        if (run.kind === 'ebtables')
          throw new VmpodError(ErrorCode.Internal, `step ${step.name}: ebtables rules are no longer applied`);
        await applyOne(deps, rec, step, run.op, sig);
      } catch (e) {
        if (run.kind === 'one' && run.op.op === 'netns-add') forgetNetns(deps, rec, step);
        throw stepError(step.name, step.target, e);
      }
    }
  }
}

/** One netlink batch of do-ops; the first failing line names its step. */
async function runNetlinkOps(
  rec: PodRecord,
  lines: { step: Step; op: NetlinkOp }[],
  sig: { signal?: AbortSignal },
): Promise<void> {
  let failures;
  try {
    failures = await runIpLines(
      rec.nsPath,
      lines.map((g) => lineOf(g.op)),
      sig,
    );
  } catch (e) {
    throw stepError(lines[0]!.step.name, lines[0]!.step.target, e);
  }
  const f = failures[0];
  if (f === undefined) return;
  const g = lines[f.line - 1] ?? lines[0]!;
  const code = g.op.op === 'sysctl' ? ErrorCode.Syscall : ErrorCode.Netlink;
  throw stepError(g.step.name, g.step.target, new VmpodError(code, `${textOf(g.op)} in ${rec.nsPath}: ${f.message}`));
}

/**
 * netnsAdd (as `ip netns add`) cleans up after itself when it fails: nothing of ours to undo, and the netns (if it
 * exists now) is someone else's: the step is dropped so that rollback does not delete it, with every step recorded
 * after it (none ran: no CNI DEL to make, nothing in that netns is ours).
 */
function forgetNetns(deps: StepDeps, rec: PodRecord, step: Step): void {
  forgetStep(deps.store, rec, step);
}

/**
 * A netns step and the sysctl step after it, applied by one netnsAdd. Its failure is the netns step's: the addon
 * removes a netns whose sysctls fail, as if it had never been made, and its error says which sysctl failed.
 */
async function addNetnsWithSysctls(
  deps: StepDeps,
  rec: PodRecord,
  run: Extract<Run, { kind: 'netns' }>,
): Promise<void> {
  try {
    await netnsAdd(deps.netnsDir, run.name, run.settings);
  } catch (e) {
    forgetNetns(deps, rec, run.step);
    throw stepError(run.step.name, run.step.target, e);
  }
}

/**
 * The pod netns steps (podNetnsSteps: the netns and its sysctls) done by binding a netns made ahead of time (fd, with
 * those sysctls: sparens.ts) under the netns step's name; a failure is the netns step's, as netnsAdd's. fd is closed
 * either way (the mount holds the netns).
 */
export async function bindNetns(deps: StepDeps, rec: PodRecord, netns: Step, name: string, fd: number): Promise<void> {
  try {
    await native().netnsBind(fd, deps.netnsDir, name);
  } catch (e) {
    forgetNetns(deps, rec, netns);
    throw stepError(netns.name, netns.target, e);
  } finally {
    native().close(fd);
  }
}

/** One do-op that runs alone (not ip, not ebtables). */
async function applyOne(
  deps: StepDeps,
  rec: PodRecord,
  step: Step,
  op: Op,
  sig: { signal?: AbortSignal },
): Promise<void> {
  switch (op.op) {
    case 'vf-bind':
      // host side, synchronous sysfs writes; the VF's netdev leaves the pod netns as its driver lets go
      bindToVfio(deps.sysfs, op.address);
      return;
    case 'vf-link':
      try {
        await deps.vfLink(vfLinkArgv(op.pf, op.vf, op.mac, op.vlan));
      } catch (e) {
        throw new VmpodError(ErrorCode.Device, `set MAC ${op.mac} VLAN ${op.vlan} on VF ${op.vf} of ${op.pf}`, {
          cause: e,
        });
      }
      return;
    case 'netns-add':
      // what `ip netns add` does, without its spawn: the addon makes it on a pool thread
      await netnsAdd(deps.netnsDir, op.name);
      return;
    case 'nft':
      // one nf_tables transaction by the addon: the table with all its rules, or nothing
      await addFilterTable(rec.nsPath, op.table, op.rules, sig.signal);
      return;
    case 'nft-del':
      // the prepared filter that the plan does not use (plan.ts dropPreparedStep)
      await deleteFilterTable(rec.nsPath, op.table);
      return;
    case 'ip':
    case 'tc':
    case 'sysctl':
    case 'ebtables':
    case 'netns-del':
    case 'cni-add':
    case 'cni-del':
    case 'vf-restore-driver':
    case 'vf-netdev-return':
      throw new VmpodError(ErrorCode.Internal, `step ${step.name}: op ${op.op} cannot be applied here`);
    default: {
      const never: never = op;
      throw new VmpodError(ErrorCode.Internal, `unknown op ${JSON.stringify(never)}`);
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
export function undoRecord(deps: StepDeps, rec: PodRecord, log: Logger): Promise<Error[]> {
  return startUndo(deps, rec, log).run();
}

/** An undo started: its first CNI DEL's plugin exec'd (earlyDel), the rest to run, or the undo called off. */
export interface Undo {
  /** resolves once that plugin is exec'd (or will not be: no DEL, or its exec failed) */
  started: Promise<void>;
  /** runs the undo (undoRecord) */
  run(): Promise<Error[]>;
  /** calls it off before run: its plugin is killed without its config, and this resolves once it is gone */
  cancel(why: unknown): Promise<void>;
}

/**
 * The undo of rec's steps, its first CNI DEL exec'd now (a release starts it before it writes the record's phase, so
 * that the plugin's own start overlaps the write). Nothing is undone before run.
 */
export function startUndo(deps: StepDeps, rec: PodRecord, log: Logger): Undo {
  const netnsGoes = rec.steps.some((s) => s.undo.some((o) => o.op === 'netns-del'));
  // ebtables rules (records of earlier versions) live in the pod netns too
  const goesWithNetns = (op: Op): boolean => op.op === 'ebtables' || ('withNetns' in op && op.withNetns === true);
  const items = [...rec.steps]
    .reverse()
    .flatMap((step) => step.undo.map((op) => ({ step, op })))
    .filter(({ op }) => !(netnsGoes && goesWithNetns(op)));
  const runs = runsOf(items);
  const del = earlyDel(deps, rec, runs);
  return {
    started: del?.started ?? Promise.resolve(),
    run: () => {
      if (netnsGoes) dropUnmountedNetns(rec.nsPath, log);
      return runUndo(deps, rec, runs, del, log);
    },
    cancel: async (why) => del?.cancel(why),
  };
}

async function runUndo(
  deps: StepDeps,
  rec: PodRecord,
  runs: readonly Run[],
  del: EarlyDel | undefined,
  log: Logger,
): Promise<Error[]> {
  const errors: Error[] = [];
  let t = performance.now();
  for (const run of runs) {
    const nsThere = existsSync(rec.nsPath);
    const first = run.kind === 'ip' ? run.lines[0]!.step : run.step;
    try {
      if (run.kind === 'ip') {
        if (nsThere) errors.push(...(await undoIpLines(rec, run.lines)));
      } else if (run.kind === 'ebtables') {
        if (nsThere) await undoEbtables(deps.exec, rec.nsPath, run.rules);
      } else if (run.kind === 'one') await (run === del?.run ? del.go() : undoOne(deps, rec, run.op, log));
      else throw new VmpodError(ErrorCode.Internal, `a netns is not made by an undo`);
    } catch (e) {
      errors.push(stepError(`undo ${first.name}`, first.target, e));
    }
    const now = performance.now();
    const last = run.kind === 'ip' ? run.lines[run.lines.length - 1]!.step : run.step;
    log.debug({ ms: Math.round((now - t) * 10) / 10 }, `undo ${last.name}`);
    t = now;
  }
  for (const e of errors) log.error({ err: e }, 'undo step failed');
  return errors;
}

interface EarlyDel {
  run: Run;
  /** its plugin exec'd, or not to be (its exec failed, or the DEL failed before it) */
  started: Promise<void>;
  /** the undo has reached it: its plugin gets its config, and this settles as the DEL does */
  go(): Promise<void>;
  /** the undo is called off: its plugin is killed without its config; resolves once it is gone */
  cancel(why: unknown): Promise<void>;
}

/**
 * The undo's first CNI DEL, started now: its first plugin is exec'd at once and gets its config when the undo reaches
 * it (go), once the runs before it are over (they give the interface back its addresses and routes for the DEL). A
 * plugin does nothing before it has its config, and its start overlaps those runs (docs/decisions.md).
 */
function earlyDel(deps: StepDeps, rec: PodRecord, runs: readonly Run[]): EarlyDel | undefined {
  const run = runs.find((r) => r.kind === 'one' && r.op.op === 'cni-del');
  if (run?.kind !== 'one' || run.op.op !== 'cni-del') return undefined;
  let reached!: () => void;
  let calledOff!: (why: unknown) => void;
  const when = new Promise<void>((resolve, reject) => {
    reached = resolve;
    calledOff = reject;
  });
  when.catch(() => {}); // a plugin whose exec failed never waits for it
  const { ifName, config } = run.op;
  const { running: done, execd } = startHeld(when, (hold) => deps.cniDel(rec, ifName, config, hold));
  done.catch(() => {}); // its error is the undo's when it is reached (go)
  return {
    run,
    started: execd,
    go: () => {
      reached();
      return done;
    },
    cancel: (why) => {
      calledOff(why);
      return done.then(
        () => {},
        () => {},
      );
    },
  };
}

/**
 * A netns removal cut between its unmount and its unlink (kill -9) leaves a plain file at nsPath: the netns is gone
 * already, and nothing can run in that file (setns fails, and a CNI plugin's DEL refuses a path that is not a netns):
 * it is removed, so that the undo runs as for a netns that is gone. A mounted netns is another filesystem's inode.
 */
function dropUnmountedNetns(nsPath: string, log: Logger): void {
  const st = statSync(nsPath, { throwIfNoEntry: false });
  if (st === undefined || st.dev !== statSync(dirname(nsPath), { throwIfNoEntry: false })?.dev) return;
  log.warn({ nsPath }, 'the netns was unmounted but its file left (a release cut short): removing the file');
  rmSync(nsPath, { force: true });
}

/**
 * Undo lines run as `ip -force -batch` would: every line runs; the failures that are not "already undone", each naming
 * its step.
 */
async function undoIpLines(rec: PodRecord, lines: { step: Step; op: NetlinkOp }[]): Promise<Error[]> {
  const key = rec.key;
  const failures = await runIpLines(
    rec.nsPath,
    lines.map((g) => lineOf(g.op)),
    { force: true },
  );
  return failures
    .filter((f) => !isAlreadyUndone(f.code))
    .map((f) => {
      const g = lines[f.line - 1] ?? lines[0]!;
      return new VmpodError(
        ErrorCode.Netlink,
        `undo "${g.step.name}"${g.step.target ? ` on ${g.step.target}` : ''}: ${textOf(g.op)}: ${f.message}`,
        { key, op: g.step.name },
      );
    });
}

async function undoOne(deps: StepDeps, rec: PodRecord, op: Op, log: Logger): Promise<void> {
  switch (op.op) {
    case 'cni-del':
      // DEL with the cached ADD result as prevResult (the CNI client reads its cache); it must succeed
      // when called again and after a failed ADD, and a missing netns is the plugins' to tolerate
      return deps.cniDel(rec, op.ifName, op.config);
    case 'netns-del':
      if (!existsSync(join(deps.netnsDir, op.name))) return;
      await native().netnsDel(join(deps.netnsDir, op.name));
      return;
    case 'vf-restore-driver':
      return restoreVfDriver(deps.sysfs, op, log);
    case 'vf-link':
      return restoreVfLink(deps.vfLink, deps.sysfs, op, log);
    case 'vf-netdev-return':
      return returnVfNetdev(deps, rec, op, log);
    case 'nft-del':
      if (!existsSync(rec.nsPath)) return;
      return deleteFilterTable(rec.nsPath, op.table);
    case 'ip':
    case 'tc':
    case 'ebtables':
      throw new VmpodError(ErrorCode.Internal, `op ${op.op} runs in a batch, not alone`);
    case 'netns-add':
    case 'sysctl':
    case 'cni-add':
    case 'vf-bind':
    case 'nft':
      throw new VmpodError(ErrorCode.Internal, `op ${op.op} is not an undo op`);
    default: {
      const never: never = op;
      throw new VmpodError(ErrorCode.Internal, `unknown op ${JSON.stringify(never)}`);
    }
  }
}

/**
 * Deletes ebtables rules (records of earlier versions) in one ebtables-restore transaction (one spawn). Only run when
 * the record holds no netns removal, which would take them.
 */
async function undoEbtables(exec: NetExec, nsPath: string, rules: string[][]): Promise<void> {
  const r = await exec.inNetns(nsPath, ['ebtables-restore', '--noflush'], { input: ebtablesRestoreInput(rules) });
  if (r.exitCode !== 0) throw new VmpodError(ErrorCode.Netlink, `ebtables-restore in ${nsPath}: ${r.stderr.trim()}`);
}
