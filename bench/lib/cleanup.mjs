// Cleanup for benchmarks that make kernel objects and processes: a LIFO list of undo actions that runs once, on
// success, on error, on SIGINT/SIGTERM and when the time bound expires. Each action is awaited with its own
// failure reported, so one failure does not leave the rest behind.
import { spawn } from 'node:child_process';

export class Cleanup {
  #actions = [];
  #running;

  /** what: a label for the error report; fn: sync or async */
  push(what, fn) {
    this.#actions.push({ what, fn });
  }

  /** Runs every action in reverse order, once; later calls return the first run's promise. Returns the failures. */
  run() {
    this.#running ??= (async () => {
      const failures = [];
      while (this.#actions.length > 0) {
        const { what, fn } = this.#actions.pop();
        try {
          await fn();
        } catch (e) {
          failures.push(`${what}: ${e?.message ?? e}`);
        }
      }
      for (const f of failures) console.error(`cleanup: ${f}`);
      return failures;
    })();
    return this.#running;
  }

  /**
   * SIGINT/SIGTERM run the cleanup, then exit 130/143; after `boundMs` the cleanup runs and the process exits 1
   * (the timer is unref'd: it never keeps a finished bench alive).
   */
  installGuards(name, boundMs) {
    const onSignal = (sig) => {
      console.error(`${name}: ${sig}: cleaning up`);
      void this.run().finally(() => process.exit(sig === 'SIGINT' ? 130 : 143));
    };
    process.once('SIGINT', onSignal);
    process.once('SIGTERM', onSignal);
    const timer = setTimeout(() => {
      console.error(`${name}: still running after ${boundMs} ms: cleaning up and giving up`);
      void this.run().finally(() => process.exit(1));
    }, boundMs);
    timer.unref();
  }
}

/**
 * Run a command (argument array, no shell) with a timeout; resolves { code, stdout, stderr }, rejects on spawn failure
 * or timeout.
 */
export function run(cmd, args, { timeoutMs = 10_000, input, env } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, {
      stdio: [input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
      ...(env ? { env } : {}),
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (b) => (stdout += b));
    child.stderr.on('data', (b) => (stderr += b));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${cmd} ${args.join(' ')}: no exit after ${timeoutMs} ms`));
    }, timeoutMs);
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(new Error(`${cmd} ${args.join(' ')}: ${e.message}`));
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code: code ?? (signal ? 128 : 1), stdout, stderr });
    });
    if (input !== undefined) child.stdin.end(input);
  });
}

/** run() that throws with the command's stderr when it exits non-zero */
export async function mustRun(cmd, args, opts) {
  const r = await run(cmd, args, opts);
  if (r.code !== 0) throw new Error(`${cmd} ${args.join(' ')}: exit ${r.code}: ${r.stderr.trim()}`);
  return r.stdout;
}

/**
 * Stops a child we spawned, by its PID: SIGTERM, then SIGKILL after graceMs; resolves when it has exited.
 * `child` is a ChildProcess whose 'exit' event tells us it is gone (so a recycled PID is never signalled).
 */
export function stopChild(child, graceMs = 3_000) {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve();
    const timer = setTimeout(() => {
      if (child.exitCode === null && child.signalCode === null) signal(child.pid, 'SIGKILL');
    }, graceMs);
    child.once('exit', () => {
      clearTimeout(timer);
      resolve();
    });
    signal(child.pid, 'SIGTERM');
  });
}

/** kill(2) that ignores ESRCH: the child can exit (and be reaped) between our check and the signal */
function signal(pid, sig) {
  try {
    process.kill(pid, sig);
  } catch (e) {
    if (e.code !== 'ESRCH') throw e;
  }
}
