// The effectful edge for links and filters: `ip` lines run as rtnetlink requests by the addon in the pod netns (no
// process), `ebtables` and host-side `ip` spawned. Argument arrays only, every spawn with a timeout and the caller's
// AbortSignal.
import { execFile } from 'node:child_process';
import { constants as osConstants } from 'node:os';
import { ErrorCode, VmpodError } from '../errors.js';
import { native } from '../native.js';
import { decodeAnswers, encodeBatch, type NlAnswer, type NlRequest } from '../net/rtnl.js';
import { ipRequest } from './iplines.js';
import { tcRequest } from './tclines.js';
import { filterDelRequest, filterRequest } from './filter.js';
import { OBSERVE_REQUESTS, decodeObserved } from './observe.js';
import type { Observed } from './types.js';

export const DEFAULT_CMD_TIMEOUT_MS = 15_000;
/** what `ip` or `ebtables` may print before it is stopped */
const OUTPUT_LIMIT_BYTES = 16 * 1024 * 1024;

/** One failed line of a batch of `ip` lines. */
export interface BatchFailure {
  /** 1-based line of the batch */
  line: number;
  /** the errno name the kernel answered (ENODEV, EEXIST...) */
  code: string;
  message: string;
}

/**
 * Pure: does this undo error's errno mean "already undone"? ENODEV (no such device, also for a name that is not
 * there), ESRCH (route del of a missing route), EADDRNOTAVAIL (addr del of a missing address), ENOENT (a missing
 * table, rule or file).
 */
export function isAlreadyUndone(code: string | undefined): boolean {
  return code !== undefined && ALREADY_UNDONE.has(code);
}

const ALREADY_UNDONE: ReadonlySet<string> = new Set(['ENODEV', 'ESRCH', 'EADDRNOTAVAIL', 'ENOENT']);

/**
 * The requests of lines met before. Pods repeat most of their lines (the same link names in every pod netns), and a
 * line's parse (tc's above all) was most of a batch's encoding on the event loop. A request is never changed once
 * made; the map is emptied when full, so that lines met once (a pod's addresses) cannot grow it.
 */
const requestOfLine = new Map<string, NlRequest>();
const LINES_KEPT = 256;

/** The request of one batch line: an `ip` line, or a `tc` line marked by its leading "tc" (steps.ts lineOf). */
export function lineRequest(args: readonly string[]): NlRequest {
  const line = args.join('\0');
  let req = requestOfLine.get(line);
  if (req === undefined) {
    req = args[0] === 'tc' ? tcRequest(args.slice(1)) : ipRequest(args);
    if (requestOfLine.size >= LINES_KEPT) requestOfLine.clear();
    requestOfLine.set(line, req);
  }
  return req;
}

/** A batch line as a command, for messages. */
export const lineText = (args: readonly string[]): string =>
  args[0] === 'tc' ? args.join(' ') : `ip ${args.join(' ')}`;

/** An errno number as its name (the kernel's answers carry the number). */
export function errnoName(errno: number): string {
  for (const [name, n] of Object.entries(osConstants.errno)) if (n === errno) return name;
  return `E${errno}`;
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
  run(file: string, args: string[], opts: RunOpts = {}): Promise<RunResult> {
    const cmd = [file, ...args].join(' ');
    return new Promise((resolve, reject) => {
      const child = execFile(
        file,
        args,
        {
          timeout: this.timeoutMs,
          killSignal: 'SIGKILL',
          maxBuffer: OUTPUT_LIMIT_BYTES,
          ...(opts.signal ? { signal: opts.signal } : {}),
        },
        (err, stdout, stderr) => {
          if (err === null) return resolve({ exitCode: 0, stdout, stderr });
          if (typeof err.code === 'number') return resolve({ exitCode: err.code, stdout, stderr });
          if (err.name === 'AbortError')
            return reject(new VmpodError(ErrorCode.Timeout, `${cmd}: aborted`, { cause: opts.signal?.reason }));
          if (err.killed)
            return reject(new VmpodError(ErrorCode.Timeout, `${cmd}: timed out after ${this.timeoutMs} ms`));
          reject(
            new VmpodError(ErrorCode.Netlink, `${cmd}: ${err.signal ? `killed by ${err.signal}` : err.message}`, {
              cause: err,
            }),
          );
        },
      );
      child.stdin?.on('error', () => {}); // a program that does not read its input: its exit status tells
      child.stdin?.end(opts.input);
    });
  }

  /** One ip command; throws VmpodError(Netlink) quoting it and ip's stderr. */
  async ip(args: string[], opts: RunOpts = {}): Promise<string> {
    const r = await this.run('ip', args, opts);
    if (r.exitCode !== 0)
      throw new VmpodError(ErrorCode.Netlink, `ip ${args.join(' ')}: ${r.stderr.trim() || `exit code ${r.exitCode}`}`);
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

async function netlink(
  nsPath: string,
  reqs: NlRequest[],
  force: boolean,
  signal?: AbortSignal,
  offLoop = true,
): Promise<NlAnswer[]> {
  if (signal?.aborted)
    throw new VmpodError(ErrorCode.Timeout, `netlink in ${nsPath}: aborted`, { cause: signal.reason });
  try {
    return decodeAnswers(await native().netlinkInNetns(nsPath, encodeBatch(reqs), force, offLoop));
  } catch (e) {
    throw new VmpodError(ErrorCode.Netlink, `netlink in ${nsPath}: ${(e as Error).message}`, { cause: e });
  }
}

/**
 * A line of a netlink batch: a recorded `ip` (or `tc`: lineRequest) line, or sysctls written in the netns in their
 * turn.
 */
export type NetlinkLine = readonly string[] | { sysctl: readonly string[] };

/**
 * Runs recorded `ip` lines (and sysctls) in the netns at nsPath, as rtnetlink requests in one addon call on a pool
 * thread (no process). As `ip -batch`, it stops at the first failing line; with force (`ip -force -batch`) every line
 * runs. Returns the failed lines, each with the kernel's errno and reason.
 */
export async function runIpLines(
  nsPath: string,
  lines: readonly NetlinkLine[],
  opts: { force?: boolean; signal?: AbortSignal } = {},
): Promise<BatchFailure[]> {
  const answers = await netlink(
    nsPath,
    lines.map((l) => ('sysctl' in l ? { sysctl: l.sysctl } : lineRequest(l))),
    opts.force ?? false,
    opts.signal,
  );
  return answers.flatMap((a, i) =>
    a.errno === 0 ? [] : [{ line: i + 1, code: errnoName(Math.abs(a.errno)), message: a.text }],
  );
}

/**
 * The netns's links, addresses and main-table routes, from three rtnetlink dumps in one addon call; on a pool thread
 * unless opts.offLoop is false.
 */
export async function observeNetns(
  nsPath: string,
  signal?: AbortSignal,
  opts: { offLoop?: boolean } = {},
): Promise<Observed> {
  const answers = await netlink(nsPath, OBSERVE_REQUESTS, false, signal, opts.offLoop ?? true);
  const failed = answers.find((a) => a.errno !== 0);
  if (failed || answers.length !== 3)
    throw new VmpodError(ErrorCode.Netlink, `read links and routes of ${nsPath}: ${failed?.text ?? 'no answer'}`);
  return decodeObserved(answers[0]!.data, answers[1]!.data, answers[2]!.data);
}

/** Makes the filter table `table` with these rules (ebtables' words, filter.ts) in the netns, in one transaction. */
export async function addFilterTable(
  nsPath: string,
  table: string,
  rules: readonly (readonly string[])[],
  signal?: AbortSignal,
): Promise<void> {
  const [a] = await netlink(nsPath, [filterRequest(table, rules)], false, signal);
  if (a?.errno !== 0)
    throw new VmpodError(ErrorCode.Netlink, `nf_tables table bridge ${table} in ${nsPath}: ${a?.text ?? 'no answer'}`);
}

/** Deletes the filter table with its chains and rules; a table that is not there is "already undone" (ENOENT). */
export async function deleteFilterTable(nsPath: string, table: string): Promise<void> {
  const [a] = await netlink(nsPath, [filterDelRequest(table)], false);
  if (!a || (a.errno !== 0 && !isAlreadyUndone(errnoName(Math.abs(a.errno)))))
    throw new VmpodError(
      ErrorCode.Netlink,
      `delete nf_tables table bridge ${table} in ${nsPath}: ${a?.text ?? 'no answer'}`,
    );
}
