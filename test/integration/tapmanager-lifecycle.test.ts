// The daemon's life as an operator sees it: SIGTERM while adds run, a second daemon on the same state dir or socket,
// a restart whose restore is slow, and a soak of many pods from several clients at once.
import { describe, it, expect, afterEach, vi } from 'vitest';
import { spawn } from 'node:child_process';
import { chmodSync, mkdirSync, readFileSync, writeFileSync, existsSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';
import { startDaemon, removeDir, firstPodDone, fdsSettled, BIN, REPO, type Daemon } from '../helpers/daemon.js';
import { makeCniConf, SYSTEM_CNI_BIN, type CniTestNet } from '../helpers/cniconf.js';
import { connect, exchange, readReply, requestBytes } from '../helpers/rawclient.js';
import { native } from '../../src/native.js';

const rand = () => randomBytes(3).toString('hex');
const desc = (k: string) => ({ podNetworkDesc: { podId: k, podNs: 'default', podName: k, DNS: null } });
const ADD = 0;
const RELEASE = 1;
const GET = 2;

/**
 * Chains a plugin after bridge that sleeps on ADD (addS seconds) for containers whose id starts with "slow", and
 * with delGate, holds their DEL until that file exists (at most 60 s); it does nothing otherwise.
 */
function chainSlowPlugin(net: CniTestNet, addS: number, delGate?: string): string[] {
  const bin = join(net.root, 'slowbin');
  mkdirSync(bin, { recursive: true });
  writeFileSync(
    join(bin, 'vmpod-test-slow'),
    '#!/bin/sh\nwhile IFS= read -r _l; do :; done\n' +
      `case "$CNI_COMMAND:$CNI_CONTAINERID" in ADD:slow*) : > ${join(net.root, 'add-started')}; /bin/sleep ${addS} ;; esac\n` +
      (delGate
        ? `case "$CNI_COMMAND:$CNI_CONTAINERID" in DEL:slow*) i=0; while [ ! -e ${delGate} ] && [ $i -lt 600 ]; do /bin/sleep 0.1; i=$((i+1)); done ;; esac\n`
        : '') +
      'case "$CNI_COMMAND" in ADD) printf \'{"cniVersion":"1.0.0"}\' ;; esac\n',
  );
  chmodSync(join(bin, 'vmpod-test-slow'), 0o755);
  const confFile = join(net.confDir, '10-test.conflist');
  const conf = JSON.parse(readFileSync(confFile, 'utf8')) as { plugins: unknown[] };
  conf.plugins.push({ type: 'vmpod-test-slow' });
  writeFileSync(confFile, JSON.stringify(conf));
  return [bin, SYSTEM_CNI_BIN];
}

async function netnsList(): Promise<string[]> {
  const r = await execa('ip', ['netns', 'list'], { timeout: 10_000 });
  return r.stdout
    .split('\n')
    .map((l) => l.split(' ')[0]!)
    .filter(Boolean);
}

/** Sends a request on a new connection and returns the fd; the reply is read later with replyOf. */
function send(socket: string, command: number, key: string, payload?: object): number {
  const fd = connect(socket);
  native().writeAll(fd, requestBytes(command, key, payload));
  return fd;
}

function replyOf(fd: number): number | null {
  try {
    return readReply(fd)?.command ?? null;
  } finally {
    native().close(fd);
  }
}

/** Log lines of the daemon, read from its pipe: lets the event loop deliver them first (bounded). */
async function logLines(
  d: Daemon,
  until: (lines: Record<string, unknown>[]) => boolean,
): Promise<Record<string, unknown>[]> {
  for (let i = 0; i < 200 && !until(d.lines()); i++) await new Promise((r) => setTimeout(r, 25));
  return d.lines();
}

// the machine may be shared and slow: generous bounds, never timing assertions
vi.setConfig({ testTimeout: 300_000, hookTimeout: 120_000 });

let net: CniTestNet | undefined;
const daemons: Daemon[] = [];
const keys: string[] = [];
afterEach(async () => {
  const ds = daemons.splice(0);
  for (const d of ds) if (d.alive()) await d.stop();
  const left = await netnsList();
  for (const k of keys.splice(0)) if (left.includes(k)) await execa('ip', ['netns', 'del', k], { reject: false });
  await net?.cleanup();
  for (const d of ds) removeDir(d.dir);
  net = undefined;
});

describe('SIGTERM', () => {
  it('while several adds run inside a slow plugin: each gets its reply, the daemon exits 0, a restart hands the pods back', async () => {
    net = await makeCniConf();
    const binDirs = chainSlowPlugin(net, 1.5);
    const d = await startDaemon({ confDir: net.confDir, binDirs, cacheDir: net.cacheDir });
    daemons.push(d);
    const slow = [0, 1, 2].map(() => `slow-${rand()}`);
    keys.push(...slow);
    const fds = slow.map((k) => send(d.socket, ADD, k, desc(k)));
    await new Promise((r) => setTimeout(r, 500)); // every add is inside the slow plugin now
    d.proc.kill('SIGTERM');
    // every running add completes and answers
    expect(fds.map(replyOf)).toEqual([0x80, 0x80, 0x80]);
    expect(await d.stop()).toBe(0);
    const lines = d.lines();
    expect(lines.some((l) => l.msg === 'stopped')).toBe(true);
    // no new connections once stopping: the socket is gone
    expect(existsSync(d.socket)).toBe(false);
    // the pods stayed whole: a restart hands them back, and releases them completely
    const d2 = await startDaemon({ confDir: net.confDir, binDirs, reuse: d });
    daemons.push(d2);
    for (const k of slow) {
      const g = exchange(d2.socket, GET, k);
      expect(g.command).toBe(0x82);
      expect(g.fds).toHaveLength(1);
      for (const fd of g.fds) native().close(fd);
      expect(exchange(d2.socket, RELEASE, k).command).toBe(0x81);
    }
    expect(await d2.stop()).toBe(0);
    expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
    expect((await netnsList()).filter((n) => slow.includes(n))).toEqual([]);
  });

  it("logs a pod's DHCP, RA and DHCPv6 servers' start before its add's line, and their stop before the daemon's last line", async () => {
    net = await makeCniConf({ ipv6: 'dual' });
    const d = await startDaemon({ confDir: net.confDir, cacheDir: net.cacheDir });
    daemons.push(d);
    const k = `dlog-${rand()}`;
    keys.push(k);
    expect(exchange(d.socket, ADD, k, desc(k)).command).toBe(0x80);
    d.proc.kill('SIGTERM');
    expect(await d.stop()).toBe(0);
    const msgs = d.lines().map((l) => l.msg);
    const at = (m: string): number => msgs.indexOf(m);
    for (const [started, stopped] of [
      ['dhcp server listening', 'dhcp server stopped'],
      ['router advertisements on', 'router advertisements off'],
      ['dhcp6 server listening', 'dhcp6 server stopped'],
    ]) {
      expect(at(started), started).toBeGreaterThanOrEqual(0);
      expect(at(started), started).toBeLessThan(at('add done'));
      expect(at(stopped), stopped).toBeGreaterThan(at('add done'));
      expect(at(stopped), stopped).toBeLessThan(at('stopped'));
      // each stop line carries the server's counters
      expect(d.lines()[at(stopped)]?.stats, stopped).toBeTypeOf('object');
    }
    // the pod stayed whole: a restart releases it completely
    const d2 = await startDaemon({ confDir: net.confDir, reuse: d });
    daemons.push(d2);
    expect(exchange(d2.socket, RELEASE, k).command).toBe(0x81);
    expect(await d2.stop()).toBe(0);
    expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
  });
});

/** Runs tapmanager to its exit (a daemon that is expected to refuse to start). */
async function runToExit(args: string[]): Promise<{ code: number | null; stderr: string }> {
  const p = spawn(process.execPath, [BIN.tapmanager, ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  p.stderr!.on('data', (b) => (stderr += b));
  const t = setTimeout(() => p.kill('SIGKILL'), 20_000);
  const code = await new Promise<number | null>((r) => p.on('close', (c) => r(c))); // close: stderr read to its end
  clearTimeout(t);
  return { code, stderr };
}

describe('one daemon per state dir and socket', () => {
  it('a second daemon on the same state dir, or on the same socket, refuses with one line; the first still serves', async () => {
    net = await makeCniConf();
    const d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir });
    daemons.push(d);
    const common = ['--cni-conf-dir', net.confDir, '--cni-bin-dir', SYSTEM_CNI_BIN, '--cni-cache-dir', net.cacheDir];

    const sameState = await runToExit([...common, '--socket', join(d.dir, 'other.sock'), '--state-dir', d.stateDir]);
    expect(sameState.code).toBe(1);
    const stateLine = sameState.stderr.split('\n').filter((l) => l.startsWith('tapmanager:'));
    expect(stateLine).toEqual([
      `tapmanager: another tapmanager is running on the state dir ${d.stateDir} (it holds its lock): stop it first, or give this one its own --state-dir and --socket`,
    ]);
    expect(existsSync(join(d.dir, 'other.sock'))).toBe(false);

    const sameSocket = await runToExit([...common, '--socket', d.socket, '--state-dir', join(d.dir, 'state2')]);
    expect(sameSocket.code).toBe(1);
    expect(sameSocket.stderr).toContain(
      `tapmanager: another tapmanager is serving on the socket ${d.socket}: stop it first`,
    );

    // the first daemon's socket is still there and served
    expect(d.alive()).toBe(true);
    const k = `vmpt-${rand()}`;
    keys.push(k);
    expect(exchange(d.socket, ADD, k, desc(k)).command).toBe(0x80);
    expect(exchange(d.socket, RELEASE, k).command).toBe(0x81);
    expect(await d.stop()).toBe(0);
    // and a stale socket (nobody listening) is taken over by the next daemon
    const d2 = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, reuse: d });
    daemons.push(d2);
    expect(await d2.stop()).toBe(0);
  });
});

describe('serving during restore', () => {
  it('listens at once; a request for the pod being restored waits for it, another pod is served meanwhile; ready only once restored', async () => {
    net = await makeCniConf();
    const gate = join(net.root, 'release-the-del');
    const binDirs = chainSlowPlugin(net, 5, gate);
    const d = await startDaemon({ confDir: net.confDir, binDirs, cacheDir: net.cacheDir });
    daemons.push(d);
    const slow = `slow-${rand()}`;
    const fast = `vmpt-${rand()}`;
    keys.push(slow, fast);
    // kill -9 in the middle of the slow add: its record stays "adding", the restart must roll it back, and its CNI DEL
    // is held until the gate file exists
    const addFd = send(d.socket, ADD, slow, desc(slow));
    // kill only once the add is inside the plugin (its CNI step recorded), however slow the machine
    for (let i = 0; i < 1200 && !existsSync(join(net.root, 'add-started')); i++)
      await new Promise((r) => setTimeout(r, 50));
    d.proc.kill('SIGKILL');
    await d.stop();
    native().close(addFd);
    await new Promise((r) => setTimeout(r, 5500)); // the orphaned plugin finishes its sleep

    // systemd's notify socket, stood in for by a receiver on an abstract name of this test's own
    const notifySocket = `@vmpod-notify-${rand()}`;
    const rx = spawn('/usr/bin/python3', [join(REPO, 'test/fixtures/notify-receiver.py'), notifySocket], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let notified = '';
    rx.stdout!.on('data', (b) => (notified += b));
    try {
      for (let i = 0; i < 400 && !notified.startsWith('ready'); i++) await new Promise((r) => setTimeout(r, 25));
      const d2 = await startDaemon({
        confDir: net.confDir,
        binDirs,
        reuse: d,
        extraArgs: ['--http-listen', '127.0.0.1:0'],
        env: { NOTIFY_SOCKET: notifySocket },
      });
      daemons.push(d2);
      // the socket answers while the slow pod is still being rolled back
      const getSlow = send(d2.socket, GET, slow);
      const addFast = send(d2.socket, ADD, fast, desc(fast));
      expect(replyOf(addFast)).toBe(0x80);
      // the slow pod's restore is still held in its CNI DEL: nothing for it has been answered
      expect(d2.lines().some((l) => l.msg === 'restored pod networks from the state dir')).toBe(false);
      // answering is not ready: the exec probe, /readyz and systemd all wait for the restore, and say so
      const statusReady = () =>
        execa(process.execPath, [BIN.tapctl, '--socket', d2.socket, 'status', '--ready'], {
          reject: false,
          timeout: 60_000,
        });
      const port = d2.lines().find((l) => l.msg === 'HTTP listening: /healthz /readyz /metrics')!.port as number;
      const readyz = async () => {
        const r = await fetch(`http://127.0.0.1:${port}/readyz`);
        return [r.status, await r.text()];
      };
      const restoring = 'not ready: restoring the pods recorded in the state dir';
      const early = await statusReady();
      expect([early.exitCode, early.stdout]).toEqual([1, restoring]);
      expect(await readyz()).toEqual([503, `${restoring}\n`]);
      expect(notified).not.toMatch(/READY=1/);
      writeFileSync(gate, '');
      // the get waited in the slow key's queue for the rollback, then found nothing
      const g = connectReply(getSlow);
      expect(g.command).toBe(0xff);
      expect(g.text).toMatch(new RegExp(`no pod network for key ${slow}`));
      const lines = await logLines(d2, (ls) => ls.some((l) => l.msg === 'restored pod networks from the state dir'));
      const idx = (pred: (l: Record<string, unknown>) => boolean) => lines.findIndex(pred);
      const fastDone = idx((l) => l.msg === 'add done' && l.key === fast);
      const restoreDone = idx((l) => l.msg === 'restored pod networks from the state dir');
      const getDone = idx((l) => l.msg === 'get failed' && l.key === slow);
      expect(fastDone).toBeGreaterThanOrEqual(0);
      expect(fastDone).toBeLessThan(restoreDone);
      // sent before the add, answered after it: the get waited (had it not, it would have found the record mid-rollback)
      expect(fastDone).toBeLessThan(getDone);
      expect(lines[restoreDone]).toMatchObject({ rolledBack: [slow] });
      // restored: ready everywhere
      for (let i = 0; i < 400 && !notified.includes('READY=1'); i++) await new Promise((r) => setTimeout(r, 25));
      expect(notified).toMatch(/READY=1\\nSTATUS=serving 1 pod networks on /);
      const late = await statusReady();
      expect([late.exitCode, late.stdout]).toEqual([0, expect.stringMatching(/^ready: 1 pod networks, up \d+s$/)]);
      expect(await readyz()).toEqual([200, 'ready\n']);
      expect(exchange(d2.socket, RELEASE, fast).command).toBe(0x81);
      expect(await d2.stop()).toBe(0);
      expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
      expect((await netnsList()).filter((n) => n === slow || n === fast)).toEqual([]);
    } finally {
      rx.kill();
    }
  });
});

function connectReply(fd: number): { command: number; text: string } {
  try {
    const r = readReply(fd)!;
    return { command: r.command, text: r.data.toString('utf8') };
  } finally {
    native().close(fd);
  }
}

describe('soak', () => {
  it('500 (VMPOD_SOAK_CYCLES) add/get/release cycles from 8 clients at once leave fds, netns, links and IPAM files as they were, and a stop an empty state dir', async () => {
    net = await makeCniConf();
    const d = await startDaemon({
      confDir: net.confDir,
      binDirs: net.binDirs,
      cacheDir: net.cacheDir,
      extraArgs: ['--log-level', 'warn'],
    });
    daemons.push(d);
    const prefix = `vmsk${rand()}`;
    await firstPodDone(d);
    // at rest: the spare pod netns the daemon makes once idle is one of them (docs/operations.md)
    const fdsBefore = await fdsSettled(d);
    const nsBefore = (await netnsList()).filter((n) => n.startsWith(prefix));
    const clients = 8;
    // VMPOD_SOAK_CYCLES: fewer cycles on a crowded machine (the default is the 500). The bounds are generous: a
    // bound, not a timing (500 cycles take ~9 min on a loaded 2-core machine)
    const total = Number(process.env.VMPOD_SOAK_CYCLES ?? 500);
    // each client is its own process running our synchronous client: the 8 really run in parallel
    const script = `
      import { FdClient } from ${JSON.stringify(join(REPO, 'dist/client/fdclient.js'))};
      import { closeSync } from 'node:fs';
      const [socket, prefix, from, count] = process.argv.slice(1);
      const c = new FdClient(socket, { timeoutMs: 120000 });
      for (let i = Number(from); i < Number(from) + Number(count); i++) {
        const key = prefix + '-' + i;
        c.add(key, { podId: key, podNs: 'default', podName: 'soak', DNS: null });
        const { fds } = c.get(key);
        if (fds.length !== 1) throw new Error('get ' + key + ': ' + fds.length + ' fds');
        for (const fd of fds) closeSync(fd);
        c.release(key);
      }
      console.log('ok');`;
    const per = Math.ceil(total / clients);
    const runs = Array.from({ length: clients }, (_, i) =>
      execa(
        process.execPath,
        [
          '--input-type=module',
          '-e',
          script,
          d.socket,
          prefix,
          String(i * per),
          String(Math.min(per, total - i * per)),
        ],
        { timeout: 1_500_000, reject: false },
      ),
    );
    const results = await Promise.all(runs);
    for (const r of results)
      expect(r.stdout + r.stderr, `client exit ${r.exitCode}, signal ${r.signal}, ${r.shortMessage}`).toBe('ok');
    expect(d.alive()).toBe(true);
    expect(await fdsSettled(d)).toBe(fdsBefore);
    expect((await netnsList()).filter((n) => n.startsWith(prefix))).toEqual(nsBefore);
    expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
    expect(readdirSync(d.stateDir).filter((f) => f.startsWith(prefix))).toEqual([]);
    expect(await d.stop()).toBe(0);
    // a clean stop leaves nothing of the daemon's own either (the running plugins' record file and its dir)
    expect(readdirSync(d.stateDir, { recursive: true })).toEqual([]);
  }, 1_800_000);
});
