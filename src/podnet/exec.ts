// The effectful edge for links and filters: `ip` (one spawn per batch), `ebtables` in a netns. Argument
// arrays only, every spawn with a timeout and the caller's AbortSignal.
import { execa } from 'execa';
import { ErrorCode, VmpodError } from '../errors.js';

export const DEFAULT_CMD_TIMEOUT_MS = 15_000;

/** One failed line of `ip -batch`: iproute2 prints the error text, then "Command failed -:<line>". */
export interface BatchFailure {
  /** 1-based line of the batch */
  line: number;
  message: string;
}

/** Pure: the failures in `ip -batch` stderr, each with its message. */
export function parseBatchFailures(stderr: string): BatchFailure[] {
  const out: BatchFailure[] = [];
  let pending: string[] = [];
  for (const raw of stderr.split('\n')) {
    const line = raw.trim();
    if (line === '') continue;
    const m = /^Command failed (?:-|\S+):(\d+)$/.exec(line);
    if (m) {
      out.push({ line: Number(m[1]), message: pending.join('; ') || 'failed' });
      pending = [];
    } else pending.push(line);
  }
  if (pending.length > 0) out.push({ line: 0, message: pending.join('; ') });
  return out;
}

/**
 * Pure: does this undo error mean "already undone"? iproute2 only gives text: the strerror of ENODEV
 * ("Cannot find device", "No such device"), ESRCH on route del ("No such process"), the extack of a
 * missing address ("Address not found"), EADDRNOTAVAIL, ENOENT; ebtables: no matching rule.
 */
export function isAlreadyUndone(message: string): boolean {
  return /Cannot find device|No such device|No such process|Address not found|Cannot assign requested address|No such file or directory|does not exist|does a matching rule exist/i.test(message);
}

/** ip -batch splits lines on blanks and treats quotes, backslashes and '#' specially: refuse such tokens. */
export function batchLine(args: readonly string[]): string {
  for (const a of args) {
    if (a === '' || /[\s"'#\\]/.test(a)) throw new VmpodError(ErrorCode.Internal, `ip batch argument ${JSON.stringify(a)} is empty or has blanks, quotes, '#' or '\\'`);
  }
  return args.join(' ');
}

export interface RunOpts {
  signal?: AbortSignal;
  input?: string;
}

export interface RunResult {
  exitCode: number;
  stdout: string;
  stderr: string;
}

export class NetExec {
  constructor(private readonly timeoutMs = DEFAULT_CMD_TIMEOUT_MS) {}

  /** Runs a program; never rejects on a non-zero exit (the caller decides), rejects on spawn failure/timeout/abort. */
  async run(file: string, args: string[], opts: RunOpts = {}): Promise<RunResult> {
    const r = await execa(file, args, {
      timeout: this.timeoutMs,
      reject: false,
      stripFinalNewline: false,
      ...(opts.input !== undefined ? { input: opts.input } : { stdin: 'ignore' as const }),
      ...(opts.signal ? { cancelSignal: opts.signal } : {}),
    });
    const cmd = [file, ...args].join(' ');
    if (r.timedOut) throw new VmpodError(ErrorCode.Timeout, `${cmd}: timed out after ${this.timeoutMs} ms`);
    if (r.isCanceled) throw new VmpodError(ErrorCode.Timeout, `${cmd}: aborted`, { cause: opts.signal?.reason });
    if (r.exitCode === undefined) throw new VmpodError(ErrorCode.Netlink, `${cmd}: ${r.shortMessage}`, { cause: r.cause });
    return { exitCode: r.exitCode, stdout: String(r.stdout ?? ''), stderr: String(r.stderr ?? '') };
  }

  /** `ip [-n ns] [flags] -batch -`; returns stdout and the failed lines (with force, all of them; without, the first). */
  async ipBatch(ns: string | undefined, lines: readonly (readonly string[])[], opts: RunOpts & { force?: boolean; flags?: string[] } = {}): Promise<{ stdout: string; failures: BatchFailure[] }> {
    const input = lines.map(batchLine).join('\n') + '\n';
    const args = [...(ns ? ['-n', ns] : []), ...(opts.flags ?? []), ...(opts.force ? ['-force'] : []), '-batch', '-'];
    const r = await this.run('ip', args, { input, ...(opts.signal ? { signal: opts.signal } : {}) });
    const failures = r.exitCode === 0 ? [] : parseBatchFailures(r.stderr);
    if (r.exitCode !== 0 && failures.length === 0) failures.push({ line: 0, message: r.stderr.trim() || `exit code ${r.exitCode}` });
    return { stdout: r.stdout, failures };
  }

  /** One ip command; throws VmpodError(Netlink) quoting it and ip's stderr. */
  async ip(args: string[], opts: RunOpts = {}): Promise<string> {
    const r = await this.run('ip', args, opts);
    if (r.exitCode !== 0) throw new VmpodError(ErrorCode.Netlink, `ip ${args.join(' ')}: ${r.stderr.trim() || `exit code ${r.exitCode}`}`);
    return r.stdout;
  }

  /**
   * A program inside the netns at nsPath. nsenter enters only the network namespace (no sysfs remount,
   * cheaper than `ip netns exec`), enough for ebtables, which talks netlink.
   */
  async inNetns(nsPath: string, argv: string[], opts: RunOpts = {}): Promise<RunResult> {
    return this.run('nsenter', [`--net=${nsPath}`, '--', ...argv], opts);
  }
}
