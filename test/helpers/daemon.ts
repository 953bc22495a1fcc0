// Starts the built tapmanager (dist/bundle/tapmanager.js) as a child process, as an operator would.
import { spawn, type ChildProcess } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { execa } from 'execa';
import { expect } from 'vitest';
import type { CniTestNet } from './cniconf.js';
import { native } from '../../src/native.js';
import { FdClient } from '../../src/client/fdclient.js';

export const REPO = resolve(import.meta.dirname, '../..');
export const BIN = {
  tapmanager: join(REPO, 'dist/bundle/tapmanager.js'),
  vmwrapper: join(REPO, 'dist/bundle/vmwrapper.cjs'),
  tapctl: join(REPO, 'dist/bundle/tapctl.js'),
};

export interface Daemon {
  pid: number;
  socket: string;
  stateDir: string;
  cacheDir: string;
  dir: string;
  proc: ChildProcess;
  logs(): string;
  /** parsed JSON log lines */
  lines(): Record<string, unknown>[];
  alive(): boolean;
  /** SIGTERM and wait; resolves with the exit code */
  stop(): Promise<number | null>;
  /** number of open fds of the daemon */
  fdCount(): number;
}

export interface DaemonOptions {
  confDir: string;
  binDirs?: string[];
  extraArgs?: string[];
  env?: Record<string, string>;
  /** CNI cache dir (default: one in the daemon's temp dir) */
  cacheDir?: string;
  /** reuse dirs of an earlier daemon (restart) */
  reuse?: Pick<Daemon, 'socket' | 'stateDir' | 'cacheDir' | 'dir'>;
  /**
   * --log-level; default info, the daemon's own default, so that tests see what a node runs (at info the addon
   * answers gets of ready pods itself; at debug every get goes through the service and is logged)
   */
  logLevel?: 'debug' | 'info';
}

async function waitFor(cond: () => boolean, ms: number, what: string): Promise<void> {
  const end = Date.now() + ms;
  while (!cond()) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

function connectable(path: string): boolean {
  if (!existsSync(path)) return false;
  try {
    native().close(native().connectUnix(path));
    return true;
  } catch {
    return false;
  }
}

export async function startDaemon(opts: DaemonOptions): Promise<Daemon> {
  const dir = opts.reuse?.dir ?? mkdtempSync(join(tmpdir(), 'vmpod-tm-'));
  const socket = opts.reuse?.socket ?? join(dir, 'tm.sock');
  const stateDir = opts.reuse?.stateDir ?? join(dir, 'state');
  const cacheDir = opts.reuse?.cacheDir ?? opts.cacheDir ?? join(dir, 'cnicache');
  const args = [
    BIN.tapmanager,
    '--socket',
    socket,
    '--cni-conf-dir',
    opts.confDir,
    '--cni-bin-dir',
    (opts.binDirs ?? ['/usr/lib/cni']).join(':'),
    '--cni-cache-dir',
    cacheDir,
    '--state-dir',
    stateDir,
    '--log-level',
    opts.logLevel ?? 'info',
    ...(opts.extraArgs ?? []),
  ];
  // the daemon's stdout and stderr go to a file of its own, not a pipe: a test that blocks in a synchronous read
  // would not drain a pipe, and the daemon's synchronous log writes would then block it (a deadlock of the test's making)
  const logFile = join(dir, `daemon-${process.hrtime.bigint()}.log`);
  const logFd = openSync(logFile, 'a');
  const proc = spawn(process.execPath, args, { stdio: ['ignore', logFd, logFd], env: { ...process.env, ...opts.env } });
  closeSync(logFd);
  const readOut = (): string => {
    try {
      return readFileSync(logFile, 'utf8');
    } catch {
      return '';
    }
  };
  let exited = false;
  let exitCode: number | null = null;
  const exitP = new Promise<number | null>((r) =>
    proc.on('exit', (code) => {
      exited = true;
      exitCode = code;
      r(code);
    }),
  );
  await waitFor(() => exited || connectable(socket), 60_000, `tapmanager to listen on ${socket}`).catch((e) => {
    proc.kill('SIGKILL'); // a daemon that never listened must not outlive the test
    throw new Error(`${(e as Error).message}\n${readOut()}`);
  });
  if (exited) throw new Error(`tapmanager exited with ${exitCode}:\n${readOut()}`);
  return {
    pid: proc.pid!,
    socket,
    stateDir,
    cacheDir,
    dir,
    proc,
    logs: readOut,
    lines: () =>
      readOut()
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as Record<string, unknown>),
    alive: () => !exited,
    stop: async () => {
      if (!exited) proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), 20_000);
      const code = await exitP;
      clearTimeout(t);
      return code;
    },
    fdCount: () => readdirSync(`/proc/${proc.pid}/fd`).length,
  };
}

/**
 * The daemon's first child process (an `ip`, a CNI plugin) makes libuv open its EMFILE reserve fd (/dev/null, once
 * per process, in uv__stream_init). One pod added and released first, then the daemon's fds left to settle (it
 * closes connections and child pipes as it notices they ended), so that an fd count taken after this compares a
 * test's own requests alone.
 */
export async function firstPodDone(d: Pick<Daemon, 'socket' | 'fdCount'>): Promise<void> {
  const key = `vmpw-${process.pid}-${Date.now().toString(36)}`;
  const c = new FdClient(d.socket, { timeoutMs: 60_000 });
  c.add(key, { podId: key, podNs: 'default', podName: 'warm-up', DNS: null });
  c.release(key);
  await fdsSettled(d);
}

/** Waits (at most 20 s) until the daemon's fd count has not changed for 250 ms. */
export async function fdsSettled(d: Pick<Daemon, 'fdCount'>): Promise<number> {
  let prev = d.fdCount();
  for (let i = 0, same = 0; i < 400 && same < 5; i++) {
    await new Promise((r) => setTimeout(r, 50));
    const n = d.fdCount();
    same = n === prev ? same + 1 : 0;
    prev = n;
  }
  return prev;
}

export function removeDir(dir: string): void {
  rmSync(dir, { recursive: true, force: true });
}

export interface StopOptions {
  /** only stop (and check the exit code of) a daemon that still runs: a restart test stops and checks it itself */
  ifAlive?: boolean;
  /** a pod whose netns a failed test may have left behind */
  podKey?: string;
}

/**
 * The finally of a test that runs its own tapmanager on a throwaway CNI network: SIGTERM must end the daemon with
 * exit code 0; then the pod's netns (if left), the network and the daemon's temp dir are removed.
 */
export async function stopDaemonAndNet(d: Daemon, net: CniTestNet, opts: StopOptions = {}): Promise<void> {
  if (!opts.ifAlive || d.alive()) expect(await d.stop()).toBe(0);
  if (opts.podKey !== undefined && existsSync(`/var/run/netns/${opts.podKey}`)) {
    await execa('ip', ['netns', 'del', opts.podKey], { reject: false, timeout: 10_000 });
  }
  await net.cleanup();
  removeDir(d.dir);
}
