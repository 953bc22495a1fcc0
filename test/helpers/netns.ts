// Small helpers for tests that make kernel objects: unique names, named netns, links, and a leftover count.
// Everything spawns `ip` with an argument array and a timeout; failures are VmpodErrors carrying the stderr.
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';
import { ErrorCode, VmpodError } from '../../src/errors.js';

/** Linux interface names are at most IFNAMSIZ - 1 = 15 bytes (include/uapi/linux/if.h); netns names share the limit here. */
export const MAX_LINK_NAME_BYTES = 15;
const DEFAULT_TIMEOUT_MS = 10_000;

/** `prefix` + random hex filling the name up to 15 bytes (at least 4 hex chars, so 65536 names per prefix). */
export function uniqueName(prefix: string, randomChars?: number): string {
  const prefixBytes = Buffer.byteLength(prefix);
  const room = MAX_LINK_NAME_BYTES - prefixBytes;
  const n = randomChars ?? Math.min(room, 8);
  if (!/^[A-Za-z0-9_.-]*$/.test(prefix)) {
    throw new VmpodError(
      ErrorCode.BadRequest,
      `unique name prefix ${JSON.stringify(prefix)}: only [A-Za-z0-9_.-] allowed`,
    );
  }
  if (n < 4 || n > room) {
    throw new VmpodError(
      ErrorCode.BadRequest,
      `unique name prefix ${JSON.stringify(prefix)} (${prefixBytes} bytes) leaves ${room} bytes, need 4 to ${room} random chars (asked ${n})`,
    );
  }
  return (
    prefix +
    randomBytes(Math.ceil(n / 2))
      .toString('hex')
      .slice(0, n)
  );
}

export interface RunOptions {
  timeoutMs?: number;
  input?: string;
  code?: ErrorCode;
}

/** Run argv (no shell) and return its stdout; throws a VmpodError naming the command, exit code and stderr. */
export async function run(argv: readonly string[], opts: RunOptions = {}): Promise<string> {
  const [file, ...args] = argv;
  if (file === undefined) throw new VmpodError(ErrorCode.BadRequest, 'run: empty argv');
  try {
    const r = await execa(file, args, {
      timeout: opts.timeoutMs ?? DEFAULT_TIMEOUT_MS,
      ...(opts.input === undefined ? { stdin: 'ignore' as const } : { input: opts.input }),
      stripFinalNewline: true,
    });
    return r.stdout;
  } catch (e) {
    const err = e as {
      exitCode?: number;
      signal?: string;
      timedOut?: boolean;
      stderr?: unknown;
      shortMessage?: string;
    };
    const stderr = typeof err.stderr === 'string' ? err.stderr.trim() : '';
    const how = err.timedOut ? 'timed out' : err.signal ? `killed by ${err.signal}` : `exit ${err.exitCode ?? '?'}`;
    throw new VmpodError(opts.code ?? ErrorCode.Internal, `${argv.join(' ')}: ${how}${stderr ? `: ${stderr}` : ''}`, {
      cause: e,
      op: file,
    });
  }
}

/** Like run, but resolves to the exit code instead of throwing on a non-zero exit. */
export async function runStatus(argv: readonly string[], timeoutMs = DEFAULT_TIMEOUT_MS): Promise<number> {
  const [file, ...args] = argv;
  if (file === undefined) throw new VmpodError(ErrorCode.BadRequest, 'runStatus: empty argv');
  const r = await execa(file, args, { timeout: timeoutMs, reject: false, stdin: 'ignore' });
  if (r.timedOut) throw new VmpodError(ErrorCode.Timeout, `${argv.join(' ')}: timed out after ${timeoutMs} ms`);
  return r.exitCode ?? -1;
}

/** `ip` argv, with `-n NS` when a netns is given. */
export function ipArgv(ns: string | undefined, ...args: string[]): string[] {
  return ns === undefined ? ['ip', ...args] : ['ip', '-n', ns, ...args];
}

export async function addNetns(name: string): Promise<void> {
  await run(['ip', 'netns', 'add', name], { code: ErrorCode.Netlink });
}

/** Deletes a named netns (the links in it go with it). Returns false when it did not exist. */
export async function delNetns(name: string): Promise<boolean> {
  if (!(await listNetns()).includes(name)) return false;
  await run(['ip', 'netns', 'del', name], { code: ErrorCode.Netlink });
  return true;
}

/** Names under /run/netns (`ip -j netns list` prints `[]` or nothing when there are none). */
export async function listNetns(): Promise<string[]> {
  const out = await run(['ip', '-j', 'netns', 'list'], { code: ErrorCode.Netlink });
  if (out.trim() === '') return [];
  return (JSON.parse(out) as Array<{ name: string }>).map((e) => e.name);
}

/** Link names in the host netns, or in `ns`. */
export async function listLinks(ns?: string): Promise<string[]> {
  const out = await run(ipArgv(ns, '-j', 'link', 'show'), { code: ErrorCode.Netlink });
  if (out.trim() === '') return [];
  return (JSON.parse(out) as Array<{ ifname: string }>).map((l) => l.ifname);
}

export async function linkExists(name: string, ns?: string): Promise<boolean> {
  return (await listLinks(ns)).includes(name);
}

export interface Leftovers {
  netns: string[];
  links: string[];
}

/** Named netns and host-netns links whose names start with `prefix`: what a test must not leave behind. */
export async function leftovers(prefix: string): Promise<Leftovers> {
  const [netns, links] = await Promise.all([listNetns(), listLinks()]);
  return { netns: netns.filter((n) => n.startsWith(prefix)), links: links.filter((l) => l.startsWith(prefix)) };
}
