// Running one plugin (libcni pkg/invoke: RawExec, FindInPath). The client gets a PluginExec; tests pass a
// recording fake, production passes spawnPluginExec().
import { accessSync, constants, statSync } from 'node:fs';
import { basename, join } from 'node:path';
import { constants as osConstants } from 'node:os';
import { setTimeout as delay } from 'node:timers/promises';
import { ErrorCode, VmpodError } from '../errors.js';
import { native, ChildEvent, type ChildResult } from '../native.js';
import { pluginFailure } from './errors.js';
import { PgidSlots, killGroup, ticksSinceBoot } from './pgid.js';

export interface PluginRunOptions {
  pluginPath: string;
  /** the complete environment (nothing is inherited) */
  env: Record<string, string>;
  /**
   * The plugin's config. A promise: the plugin is exec'd at once and given its config once the promise resolves (a
   * plugin reads its config to EOF before it does anything, so its start overlaps what the caller must finish first).
   * Should it reject, the plugin is killed without having had its config, and the run rejects with that reason. The
   * timeout counts from the config's write.
   */
  stdin: Buffer | Promise<Buffer>;
  /** called once the plugin is exec'd, or its exec has failed */
  onExec?: () => void;
  timeoutMs: number;
  signal?: AbortSignal;
  /**
   * Resolve as soon as the plugin has exited: the bookkeeping after it (its PID record removed) is left to the
   * `cleanup` of the result, for the caller to await when it is done with the run.
   */
  deferCleanup?: boolean;
}

export interface PluginExec {
  /**
   * Run the plugin to completion; rejects with CniPluginError on a non-zero exit, a signal, a timeout or an abort.
   * With deferCleanup, `cleanup` settles when the run's bookkeeping is done (it never rejects).
   */
  run(opts: PluginRunOptions): Promise<{ stdout: Buffer; stderr: Buffer; cleanup?: Promise<void> }>;
  /** Where `plugin` lives (libcni invoke.Exec.FindInPath); the client uses findInPath() when absent. */
  findInPath?(plugin: string, dirs: readonly string[]): Promise<string>;
  /** Daemon stop: the runs' bookkeeping on disk removed when no run is in flight (spawnPluginExec's pgidDir file). */
  close?(): void;
}

/** libcni FindInPath: the first dir holding an executable regular file named `plugin`. */
export async function findInPath(plugin: string, dirs: readonly string[]): Promise<string> {
  if (plugin === '' || plugin.includes('/') || plugin === '.' || plugin === '..') {
    throw new VmpodError(ErrorCode.Config, `invalid CNI plugin name ${JSON.stringify(plugin)}`, {
      op: 'find CNI plugin',
    });
  }
  for (const dir of dirs) {
    const p = join(dir, plugin);
    // synchronous: a lookup the dentry cache answers costs less than a hop to the pool and back, and every add looks
    // its plugins up (a missing one throws no exception here)
    try {
      if (statSync(p, { throwIfNoEntry: false })?.isFile()) {
        accessSync(p, constants.X_OK);
        return p;
      }
    } catch {
      // not here (or not executable): try the next dir, as libcni does
    }
  }
  throw new VmpodError(
    ErrorCode.Config,
    `CNI plugin ${JSON.stringify(plugin)} not found in ${dirs.length === 0 ? '(no bin dirs)' : dirs.join(', ')}`,
    {
      op: 'find CNI plugin',
    },
  );
}

export interface SpawnPluginExecOptions {
  /** after SIGTERM, how long the plugin's process group gets before SIGKILL (default 2000 ms) */
  killGraceMs?: number;
  /** stdout/stderr limit per stream (default 1 MiB; a CNI result is a few KiB): a plugin printing more is killed */
  maxBufferBytes?: number;
  /**
   * Where each running plugin's process group is recorded (pgid.ts PgidSlots: one file per daemon, a slot in it per
   * plugin running at once, blank again when the run ends), so that a daemon started after a kill -9 finds the plugins
   * its predecessor left running (killOrphanPlugins).
   */
  pgidDir?: string;
}

/** Default bound on a plugin's captured stdout and stderr (each). */
export const DEFAULT_PLUGIN_OUTPUT_BYTES = 1024 * 1024;

/** ETXTBSY: the binary is still open for writing (being installed). libcni retries this one errno. */
const TEXT_BUSY_RETRIES = 3;

function checkTimeout(timeoutMs: number, what: string): void {
  if (!Number.isSafeInteger(timeoutMs) || timeoutMs <= 0) {
    throw new VmpodError(
      ErrorCode.Config,
      `${what} must be a positive integer of milliseconds, got ${JSON.stringify(timeoutMs)}`,
    );
  }
}

/** How one spawn of a plugin ended. */
interface RunOutcome {
  stdout: Buffer;
  stderr: Buffer;
  /** with deferCleanup: the PID record's removal, still running */
  cleanup?: Promise<void>;
  exitCode?: number;
  signal?: NodeJS.Signals;
  /** spawn(2) itself failed (ENOENT, EACCES, ENOEXEC, ETXTBSY...) */
  spawnError?: NodeJS.ErrnoException;
  stopped?: 'timeout' | 'abort' | 'overflow' | 'withheld';
  /** why the plugin was killed before it had its stdin (stopped 'withheld': its stdin's promise rejected) */
  withheld?: unknown;
}

/** A signal number as its name (SIGKILL), as child_process reports it. */
function signalName(n: number): NodeJS.Signals {
  for (const [name, num] of Object.entries(osConstants.signals)) if (num === n) return name as NodeJS.Signals;
  return `SIG${n}` as NodeJS.Signals;
}

/**
 * Plugins spawned by the addon (native spawnChild: posix_spawn, so the event loop waits only for the exec, and the
 * daemon's memory is not copied for a fork): argv is the plugin's path alone (CNI passes everything in env and stdin),
 * a private environment, stdin written in full. Each plugin runs in its own session (setsid), so a timeout, an abort
 * or an output flood signals the plugin together with anything it started (iptables, helpers): SIGTERM to the group,
 * SIGKILL after killGraceMs, and a final SIGKILL sweep of the group once the plugin has exited, so nothing it started
 * outlives a killed run.
 */
export function spawnPluginExec(opts: SpawnPluginExecOptions = {}): PluginExec {
  const killGraceMs = opts.killGraceMs ?? 2000;
  const maxBuffer = opts.maxBufferBytes ?? DEFAULT_PLUGIN_OUTPUT_BYTES;
  checkTimeout(killGraceMs, 'killGraceMs');
  const spawner: Spawner = {
    killGraceMs,
    maxBuffer,
    slots: opts.pgidDir === undefined ? undefined : new PgidSlots(opts.pgidDir),
  };
  return { findInPath, run: (o) => runPlugin(spawner, o), close: () => spawner.slots?.close() };
}

/** How spawnPluginExec runs each plugin. */
interface Spawner {
  killGraceMs: number;
  maxBuffer: number;
  /** where the running plugins' groups are recorded, if anywhere */
  slots: PgidSlots | undefined;
}

/** One plugin run to its end: spawned (again while the binary is busy being written, ETXTBSY), its failure told. */
async function runPlugin(
  sp: Spawner,
  o: PluginRunOptions,
): Promise<{ stdout: Buffer; stderr: Buffer; cleanup?: Promise<void> }> {
  checkTimeout(o.timeoutMs, 'CNI plugin timeoutMs');
  const plugin = basename(o.pluginPath);
  const verb = o.env.CNI_COMMAND ?? '?';
  if (o.signal?.aborted === true) throw pluginFailure({ plugin, verb, aborted: true });
  for (let attempt = 0; ; attempt++) {
    const r = await runOnce(sp, o);
    const { stdout, stderr, stopped } = r;
    if (stopped === undefined && r.spawnError === undefined && r.exitCode === 0)
      return { stdout, stderr, ...(r.cleanup ? { cleanup: r.cleanup } : {}) };
    // a failed run is reported once its bookkeeping is done
    await r.cleanup;
    if (stopped === 'withheld') throw r.withheld;
    const base = {
      plugin,
      verb,
      stdout,
      stderr,
      ...(r.exitCode === undefined ? {} : { exitCode: r.exitCode }),
      ...(r.signal === undefined ? {} : { signal: r.signal }),
    };
    if (stopped === 'timeout') throw pluginFailure({ ...base, timedOut: true, timeoutMs: o.timeoutMs });
    if (stopped === 'abort') throw pluginFailure({ ...base, aborted: true });
    if (stopped === 'overflow') throw pluginFailure({ ...base, outputTooLarge: true, outputLimitBytes: sp.maxBuffer });
    if (r.spawnError === undefined) throw pluginFailure(base);
    if (r.spawnError.code !== 'ETXTBSY' || attempt >= TEXT_BUSY_RETRIES)
      throw pluginFailure({ plugin, verb, spawnError: r.spawnError });
    await delay(50 * (attempt + 1));
  }
}

/** How a run ended, from the child's result and why it was stopped, if it was. */
function outcomeOf(r: ChildResult, stopped: RunOutcome['stopped'], withheld: unknown): RunOutcome {
  return {
    stdout: r.stdout,
    stderr: r.stderr,
    ...(r.code === null ? {} : { exitCode: r.code }),
    ...(r.signal === null ? {} : { signal: signalName(r.signal) }),
    ...(stopped === undefined ? {} : { stopped }),
    ...(stopped === 'withheld' ? { withheld } : {}),
  };
}

/**
 * One spawn of the plugin, its group recorded while it runs, stopped on a timeout, an abort or an output flood; with
 * a promise of its stdin, given its stdin once it resolves (and killed without it should it reject).
 */
function runOnce(sp: Spawner, o: PluginRunOptions): Promise<RunOutcome> {
  return new Promise((resolve) => {
    let pid: number;
    let stopped: RunOutcome['stopped'];
    let withheld: unknown;
    let graceTimer: NodeJS.Timeout | undefined;
    let ended = false;
    const stop = (why: 'timeout' | 'abort' | 'overflow'): void => {
      if (stopped !== undefined) return;
      stopped = why;
      killGroup(pid, 'SIGTERM');
      graceTimer = setTimeout(() => killGroup(pid, 'SIGKILL'), sp.killGraceMs);
    };
    // a plugin without its config has done nothing: nothing to wait for
    const withhold = (why: unknown): void => {
      if (ended || stopped !== undefined) return;
      stopped = 'withheld';
      withheld = why;
      killGroup(pid, 'SIGKILL');
    };
    const env = Object.entries(o.env).map(([k, v]) => `${k}=${v}`);
    let timer: NodeJS.Timeout | undefined;
    let slot: number | undefined;
    const onAbort = (): void => stop('abort');
    const finish = (r: ChildResult): void => {
      ended = true;
      clearTimeout(timer);
      clearTimeout(graceTimer);
      o.signal?.removeEventListener('abort', onAbort);
      // whatever the plugin started in its group (a helper it forked) does not outlive the run
      killGroup(pid, 'SIGKILL');
      const outcome = outcomeOf(r, stopped, withheld);
      // the run is over once its record is gone (a synchronous removal: nothing is left for a deferred cleanup)
      if (slot !== undefined) sp.slots?.clear(slot);
      resolve(o.deferCleanup === true ? { ...outcome, cleanup: Promise.resolve() } : outcome);
    };
    const startTicks = ticksSinceBoot();
    const { stdin } = o;
    try {
      pid = native().spawnChild(o.pluginPath, env, Buffer.isBuffer(stdin) ? stdin : null, sp.maxBuffer, (event, r) => {
        if (event === ChildEvent.Overflow) stop('overflow');
        else if (r !== undefined) finish(r);
      });
    } catch (e) {
      // nothing runs: the exec failed (ENOENT, EACCES, ENOEXEC, ETXTBSY), or pipes or memory ran out
      o.onExec?.();
      resolve({ stdout: Buffer.alloc(0), stderr: Buffer.alloc(0), spawnError: e as NodeJS.ErrnoException });
      return;
    }
    o.onExec?.();
    // its group (its pid: it leads its own session)
    slot = sp.slots?.put({
      pgid: pid,
      plugin: basename(o.pluginPath),
      verb: o.env.CNI_COMMAND ?? '?',
      containerId: o.env.CNI_CONTAINERID ?? '',
      startTicks,
      daemonPid: process.pid,
    });
    const started = (): void => {
      timer = setTimeout(() => stop('timeout'), o.timeoutMs);
    };
    o.signal?.addEventListener('abort', onAbort, { once: true });
    if (Buffer.isBuffer(stdin)) started();
    else
      stdin.then((given) => {
        if (ended || stopped !== undefined) return;
        try {
          native().childStdin(pid, given);
        } catch (e) {
          withhold(e);
          return;
        }
        started();
      }, withhold);
  });
}
