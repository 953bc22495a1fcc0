// Runs the built vmwrapper as libvirt does, with the stub emulator in place of qemu, and reads what the stub saw.
import { spawn, type StdioOptions } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BIN, REPO } from './daemon.js';
import { inheritableFds } from '../../src/vmwrapper/fds.js';

export const STUB_EMULATOR = join(REPO, 'test/fixtures/stub-emulator');

export interface StubReport {
  pid: number;
  /** /proc/self/cgroup of the stub */
  cgroup: string;
  /** Cpus_allowed_list of the stub */
  cpusAllowed: string;
  argv: string[];
  fds: Record<string, { target: string; info: string }>;
  sigIgn: string;
  sigBlk: string;
  env: Record<string, string>;
}

export interface WrapperRun {
  code: number | null;
  stderr: string;
  /** PID of the process spawned as vmwrapper */
  pid: number;
  stub?: StubReport;
}

export async function runVmwrapper(opts: {
  args: string[];
  env: Record<string, string>;
  /** fds to hand vmwrapper at given numbers, as libvirt hands it the monitor socket and fdsets */
  passFds?: Record<number, number>;
  /** a command that ends by exec'ing its arguments (node vmwrapper ...), e.g. one entering a namespace first */
  wrap?: string[];
  /** run this vmwrapper as a program (its shebang), as libvirt does, instead of this repository's under this node */
  program?: string;
}): Promise<WrapperRun> {
  const dir = mkdtempSync(join(tmpdir(), 'vmpod-vmw-'));
  const out = join(dir, 'stub.json');
  const maxFd = Math.max(2, ...Object.keys(opts.passFds ?? {}).map(Number));
  const stdio: StdioOptions = Array.from({ length: maxFd + 1 }, (_, i) =>
    i === 0 ? 'ignore' : i <= 2 ? 'pipe' : (opts.passFds?.[i] ?? 'ignore'),
  );
  try {
    const env = { PATH: process.env.PATH ?? '/usr/bin:/bin', STUB_EMULATOR_OUT: out, ...opts.env };
    const argv = [
      ...(opts.wrap ?? []),
      ...(opts.program ? [opts.program] : [process.execPath, BIN.vmwrapper]),
      ...opts.args,
    ];
    const child = spawn(argv[0]!, argv.slice(1), { stdio, env });
    let stderr = '';
    child.stderr!.on('data', (d) => (stderr += d));
    child.stdout!.resume();
    const code = await new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
    const stub = existsSync(out) ? (JSON.parse(readFileSync(out, 'utf8')) as StubReport) : undefined;
    return { code, stderr, pid: child.pid!, ...(stub ? { stub } : {}) };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * fds this test process itself inherited without close-on-exec (e.g. from the shell that started the test run):
 * every child inherits them too, so they are not vmwrapper's doing.
 */
export const ambientFds = (): string[] => inheritableFds().map(String);

/** The stub's fd that is a tap: its number and the tap's name from fdinfo ("iff:\ttap0"). */
export function stubTaps(stub: StubReport): { fd: number; iff: string }[] {
  return Object.entries(stub.fds)
    .map(([fd, v]) => ({ fd: Number(fd), iff: /^iff:\s*(\S+)/m.exec(v.info)?.[1] }))
    .filter((x): x is { fd: number; iff: string } => x.iff !== undefined)
    .sort((a, b) => a.fd - b.fd);
}
