// Running one plugin (libcni pkg/invoke: RawExec, FindInPath). The client gets a PluginExec; tests pass a
// recording fake, production passes execaPluginExec().
import { constants } from 'node:fs';
import { access, stat } from 'node:fs/promises';
import { basename, join } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { execa } from 'execa';
import { ErrorCode, VmpodError } from '../errors.js';
import { pluginFailure } from './errors.js';

export interface PluginRunOptions {
  pluginPath: string;
  /** the complete environment (nothing is inherited) */
  env: Record<string, string>;
  stdin: Buffer;
  timeoutMs: number;
  signal?: AbortSignal;
}

export interface PluginExec {
  /** Run the plugin to completion; rejects with CniPluginError on a non-zero exit, a signal, a timeout or an abort. */
  run(opts: PluginRunOptions): Promise<{ stdout: Buffer; stderr: Buffer }>;
  /** Where `plugin` lives (libcni invoke.Exec.FindInPath); the client uses findInPath() when absent. */
  findInPath?(plugin: string, dirs: readonly string[]): Promise<string>;
}

/** libcni FindInPath: the first dir holding an executable regular file named `plugin`. */
export async function findInPath(plugin: string, dirs: readonly string[]): Promise<string> {
  if (plugin === '' || plugin.includes('/') || plugin === '.' || plugin === '..') {
    throw new VmpodError(ErrorCode.Config, `invalid CNI plugin name ${JSON.stringify(plugin)}`, { op: 'find CNI plugin' });
  }
  for (const dir of dirs) {
    const p = join(dir, plugin);
    try {
      if ((await stat(p)).isFile()) {
        await access(p, constants.X_OK);
        return p;
      }
    } catch {
      // not here (or not executable): try the next dir, as libcni does
    }
  }
  throw new VmpodError(ErrorCode.Config, `CNI plugin ${JSON.stringify(plugin)} not found in ${dirs.length === 0 ? '(no bin dirs)' : dirs.join(', ')}`, {
    op: 'find CNI plugin',
  });
}

export interface ExecaPluginExecOptions {
  /** after SIGTERM, how long the plugin's process group gets before SIGKILL (default 2000 ms) */
  killGraceMs?: number;
  /** stdout/stderr limit per stream (default 16 MiB; a CNI result is a few KiB) */
  maxBufferBytes?: number;
}

/** ETXTBSY: the binary is still open for writing (being installed). libcni retries this one errno. */
const TEXT_BUSY_RETRIES = 3;

function checkTimeout(timeoutMs: number, what: string): void {
  if (!Number.isSafeInteger(timeoutMs) || timeoutMs <= 0) {
    throw new VmpodError(ErrorCode.Config, `${what} must be a positive integer of milliseconds, got ${JSON.stringify(timeoutMs)}`);
  }
}

/** kill(2) on a whole process group; ESRCH (already gone) is the expected case and ignored. */
function killGroup(pgid: number | undefined, sig: NodeJS.Signals): void {
  if (pgid === undefined || pgid <= 0) return;
  try {
    process.kill(-pgid, sig);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ESRCH') throw e;
  }
}

/**
 * Plugins spawned with execa: argument array (none: CNI passes everything in env and stdin), a private
 * environment, stdin written in full. Each plugin runs in its own session (detached => setsid), so a
 * timeout or an abort can signal the plugin together with anything it started (iptables, helpers):
 * SIGTERM to the group, SIGKILL after killGraceMs, and a final SIGKILL sweep of the group once the
 * plugin has exited, so nothing it started outlives a killed run.
 */
export function execaPluginExec(opts: ExecaPluginExecOptions = {}): PluginExec {
  const killGraceMs = opts.killGraceMs ?? 2000;
  const maxBuffer = opts.maxBufferBytes ?? 16 * 1024 * 1024;
  checkTimeout(killGraceMs, 'killGraceMs');

  async function runOnce(o: PluginRunOptions) {
    const sub = execa(o.pluginPath, [], {
      input: o.stdin,
      env: o.env,
      extendEnv: false,
      detached: true,
      encoding: 'buffer',
      reject: false,
      stripFinalNewline: false,
      maxBuffer,
    });
    let stopped: 'timeout' | 'abort' | undefined;
    let graceTimer: NodeJS.Timeout | undefined;
    const stop = (why: 'timeout' | 'abort'): void => {
      if (stopped !== undefined) return;
      stopped = why;
      killGroup(sub.pid, 'SIGTERM');
      graceTimer = setTimeout(() => killGroup(sub.pid, 'SIGKILL'), killGraceMs);
    };
    const timer = setTimeout(() => stop('timeout'), o.timeoutMs);
    const onAbort = (): void => stop('abort');
    o.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      const result = await sub;
      return { result, stopped };
    } finally {
      clearTimeout(timer);
      clearTimeout(graceTimer);
      o.signal?.removeEventListener('abort', onAbort);
      if (stopped !== undefined) killGroup(sub.pid, 'SIGKILL');
    }
  }

  return {
    findInPath,
    async run(o) {
      checkTimeout(o.timeoutMs, 'CNI plugin timeoutMs');
      const plugin = basename(o.pluginPath);
      const verb = o.env.CNI_COMMAND ?? '?';
      if (o.signal?.aborted === true) throw pluginFailure({ plugin, verb, aborted: true });
      for (let attempt = 0; ; attempt++) {
        const { result: r, stopped } = await runOnce(o);
        const stdout = Buffer.from(r.stdout);
        const stderr = Buffer.from(r.stderr);
        if (stopped === undefined && !r.failed) return { stdout, stderr };
        const base = { plugin, verb, stdout, stderr, ...(r.exitCode === undefined ? {} : { exitCode: r.exitCode }), ...(r.signal === undefined ? {} : { signal: r.signal }) };
        if (stopped === 'timeout') throw pluginFailure({ ...base, timedOut: true, timeoutMs: o.timeoutMs });
        if (stopped === 'abort') throw pluginFailure({ ...base, aborted: true });
        if (r.isMaxBuffer) throw pluginFailure({ ...base, outputTooLarge: true });
        if (r.exitCode === undefined && r.signal === undefined) {
          // spawn(2) itself failed: ENOENT, EACCES, ENOEXEC, ETXTBSY...
          const code = (r as { code?: string }).code;
          if (code === 'ETXTBSY' && attempt < TEXT_BUSY_RETRIES) {
            await delay(50 * (attempt + 1));
            continue;
          }
          throw pluginFailure({ plugin, verb, spawnError: r.cause ?? new Error(r.originalMessage) });
        }
        throw pluginFailure(base);
      }
    },
  };
}
