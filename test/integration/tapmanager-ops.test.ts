// What an operator probes and scrapes on a real daemon: HTTP /healthz, /readyz and /metrics on 127.0.0.1 with an
// ephemeral port, `tapctl status --ready` and `tapctl list`, sd_notify datagrams on the test's own NOTIFY_SOCKET,
// and the start-up checks that end tapmanager at once with one line.
import { describe, it, expect } from 'vitest';
import { spawn } from 'node:child_process';
import { createServer, type AddressInfo } from 'node:net';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';
import { startDaemon, stopDaemonAndNet, removeDir, BIN, REPO, type Daemon } from '../helpers/daemon.js';
import { makeCniConf } from '../helpers/cniconf.js';
import { FdClient } from '../../src/client/fdclient.js';

const rand = () => randomBytes(3).toString('hex');

function httpPort(d: Daemon): number {
  const line = d.lines().find((l) => l.msg === 'HTTP listening: /healthz /readyz /metrics');
  if (!line) throw new Error(`no HTTP listening line in:\n${d.logs()}`);
  return line.port as number;
}

async function get(port: number, path: string): Promise<{ status: number; body: string; type: string }> {
  const r = await fetch(`http://127.0.0.1:${port}${path}`);
  return { status: r.status, body: await r.text(), type: r.headers.get('content-type') ?? '' };
}

function sample(text: string, name: string, labels = ''): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${name}${labels ? `{${labels}}` : ''} `));
  return line === undefined ? undefined : Number(line.split(' ').pop());
}

const tapctl = (socket: string, ...a: string[]) =>
  execa(process.execPath, [BIN.tapctl, '--socket', socket, ...a], { reject: false, timeout: 60_000 });

describe('probes, metrics and list on a running tapmanager', () => {
  it('answers /healthz, /readyz, /metrics and tapctl status --ready; says why when the CNI config goes away', async () => {
    const net = await makeCniConf();
    const d = await startDaemon({
      confDir: net.confDir,
      binDirs: net.binDirs,
      cacheDir: net.cacheDir,
      extraArgs: ['--http-listen', '127.0.0.1:0'],
    });
    const key = `vmpo-${rand()}`;
    try {
      const port = httpPort(d);
      expect(await get(port, '/healthz')).toMatchObject({ status: 200, body: 'ok\n' });
      expect(await get(port, '/readyz')).toMatchObject({ status: 200, body: 'ready\n' });
      expect((await get(port, '/nope')).status).toBe(404);
      const ready = await tapctl(d.socket, 'status', '--ready');
      expect(ready.exitCode).toBe(0);
      expect(ready.stdout).toMatch(/^ready: 0 pod networks, up \d+s$/);

      const add = await tapctl(d.socket, 'add', key, '--pod-name', 'vm-ops', '--pod-namespace', 'ops-ns');
      expect(add.exitCode).toBe(0);
      const csn = JSON.parse(add.stdout) as {
        Interfaces: { HardwareAddr: string }[];
        Result: { ips: { address: string }[] };
      };
      const list = await tapctl(d.socket, 'list');
      expect(list.exitCode).toBe(0);
      const [head, row, ...more] = list.stdout.split('\n');
      expect(head).toMatch(/^KEY\s+POD\s+NAMESPACE\s+IPS\s+MAC\s+STATE\s+AGE\s+LAST LEASE$/);
      expect(more).toEqual([]);
      expect(row!.split(/\s{3,}/)).toEqual([
        key,
        'vm-ops',
        'ops-ns',
        csn.Result.ips[0]!.address,
        expect.stringMatching(/^[0-9a-f:]{17}$/i),
        'ready',
        expect.stringMatching(/^\d+s$/),
        '-',
      ]);
      const json = JSON.parse((await tapctl(d.socket, 'list', '--json')).stdout);
      expect(json).toEqual([
        expect.objectContaining({
          key,
          podName: 'vm-ops',
          podNs: 'ops-ns',
          state: 'ready',
          dhcp: true,
          lastLease: null,
        }),
      ]);
      expect(Date.now() - Date.parse(json[0].createdAt)).toBeLessThan(120_000);

      const m = await get(port, '/metrics');
      expect(m.status).toBe(200);
      expect(m.type).toMatch(/^text\/plain/);
      expect(sample(m.body, 'vmpod_requests_total', 'command="add",result="ok"')).toBe(1);
      expect(sample(m.body, 'vmpod_requests_total', 'command="status",result="ok"')).toBe(1);
      expect(sample(m.body, 'vmpod_request_duration_seconds_count', 'command="add"')).toBe(1);
      expect(
        sample(m.body, 'vmpod_cni_plugin_duration_seconds_count', 'plugin="bridge",command="add",result="ok"'),
      ).toBe(1);
      expect(sample(m.body, 'vmpod_pods', 'state="ready"')).toBe(1);
      expect(sample(m.body, 'vmpod_restore_duration_seconds_count')).toBe(1);
      expect(sample(m.body, 'vmpod_restored')).toBe(1);
      expect(sample(m.body, 'process_open_fds')).toBeGreaterThan(0);

      expect((await tapctl(d.socket, 'release', key)).exitCode).toBe(0);
      expect(sample((await get(port, '/metrics')).body, 'vmpod_pods', 'state="ready"')).toBe(0);

      // the CNI config disappears (a CNI daemonset being reinstalled): not ready, and both probes say why
      const conf = readdirSync(net.confDir)[0]!;
      renameSync(join(net.confDir, conf), join(net.root, conf));
      const rz = await get(port, '/readyz');
      expect(rz.status).toBe(503);
      expect(rz.body).toBe(
        `not ready: CNI config in ${net.confDir} does not load: no CNI network config in ${net.confDir} (looked for .conf, .conflist, .json)\n`,
      );
      const nr = await tapctl(d.socket, 'status', '--ready');
      expect(nr.exitCode).toBe(1);
      expect(nr.stdout).toBe(rz.body.trimEnd());
      expect((await get(port, '/healthz')).status).toBe(200);
      renameSync(join(net.root, conf), join(net.confDir, conf));
      expect((await get(port, '/readyz')).status).toBe(200);
      expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
    } finally {
      await stopDaemonAndNet(d, net, { ifAlive: true, podKey: key });
    }
  }, 240_000);
});

describe('systemd notify', () => {
  it('sends READY=1 once it listens and has restored, WATCHDOG=1 at half WATCHDOG_USEC, STOPPING=1 on SIGTERM', async () => {
    const net = await makeCniConf();
    const dir = mkdtempSync(join(tmpdir(), 'vmpod-notify-'));
    const sock = join(dir, 'notify');
    const rx = spawn('/usr/bin/python3', [join(REPO, 'test/fixtures/notify-receiver.py'), sock], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    rx.stdout!.on('data', (b) => (out += b));
    const msgs = () =>
      out
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => (JSON.parse(l) as { msg: string }).msg);
    const waitFor = async (what: string, cond: () => boolean) => {
      const end = Date.now() + 20_000;
      while (!cond()) {
        if (Date.now() > end) throw new Error(`timed out waiting for ${what}; got ${JSON.stringify(msgs())}`);
        await new Promise((r) => setTimeout(r, 20));
      }
    };
    let d: Daemon | undefined;
    try {
      await waitFor('the receiver', () => out.startsWith('ready'));
      d = await startDaemon({
        confDir: net.confDir,
        binDirs: net.binDirs,
        cacheDir: net.cacheDir,
        env: { NOTIFY_SOCKET: sock, WATCHDOG_USEC: '400000' },
      });
      await waitFor('READY=1', () => msgs().some((m) => m.startsWith('READY=1')));
      // READY is sent after the socket listens and restore ran: the daemon is ready by its own account
      expect(new FdClient(d.socket).status()).toMatchObject({ ready: true, restored: true });
      const readyMsg = msgs().find((m) => m.startsWith('READY=1'))!;
      expect(readyMsg.split('\n')).toEqual([
        'READY=1',
        `STATUS=serving 0 pod networks on ${d.socket}`,
        `MAINPID=${d.pid}`,
      ]);
      await waitFor('two WATCHDOG=1', () => msgs().filter((m) => m === 'WATCHDOG=1').length >= 2);
      expect(await d.stop()).toBe(0);
      await waitFor('STOPPING=1', () => msgs().some((m) => m.startsWith('STOPPING=1')));
      expect(msgs().indexOf(readyMsg)).toBe(0);
    } finally {
      rx.kill();
      if (d) await stopDaemonAndNet(d, net, { ifAlive: true });
      else await net.cleanup();
      removeDir(dir);
    }
  });
});

describe('bad input at start-up', () => {
  /** Runs the daemon to its exit; it must end at once (not hang waiting for anything). */
  async function runToExit(args: string[]): Promise<{ code: number | undefined; stderr: string; ms: number }> {
    const t0 = Date.now();
    const r = await execa(process.execPath, [BIN.tapmanager, ...args], { reject: false, timeout: 30_000 });
    return { code: r.exitCode, stderr: r.stderr, ms: Date.now() - t0 };
  }

  it('a missing socket dir, a missing CNI plugin dir, an unwritable state dir, a taken HTTP port: exit 1 with one line, nothing created', async () => {
    const pkgVersion = (JSON.parse(readFileSync('package.json', 'utf8')) as { version: string }).version;
    const dir = mkdtempSync(join(tmpdir(), 'vmpod-badin-'));
    const conf = join(dir, 'conf');
    mkdirSync(conf);
    const notDir = join(dir, 'a-file');
    writeFileSync(notDir, '');
    const base = (over: Record<string, string>) => {
      const o: Record<string, string> = {
        '--socket': join(dir, 'tm.sock'),
        '--cni-conf-dir': conf,
        '--cni-bin-dir': '/usr/lib/cni',
        '--state-dir': join(dir, 'state'),
        '--cni-cache-dir': join(dir, 'cache'),
        ...over,
      };
      return Object.entries(o).flat();
    };
    const taken = createServer();
    await new Promise<void>((r) => taken.listen(0, '127.0.0.1', r));
    const port = (taken.address() as AddressInfo).port;
    try {
      const cases: [Record<string, string>, RegExp][] = [
        [
          { '--socket': join(dir, 'no-such-dir', 'tm.sock') },
          new RegExp(
            `^tapmanager: socket dir ${dir}/no-such-dir does not exist \\(ENOENT\\): mount the host's ${dir}/no-such-dir into the tapmanager container`,
          ),
        ],
        [
          { '--cni-bin-dir': join(dir, 'no-cni-bin') },
          new RegExp(
            `^tapmanager: CNI plugin dir ${dir}/no-cni-bin does not exist \\(ENOENT\\): mount the host's ${dir}/no-cni-bin \\(read-only\\)`,
          ),
        ],
        [
          { '--state-dir': join(notDir, 'state') },
          new RegExp(
            `^tapmanager: state dir ${notDir}/state cannot be created \\(ENOTDIR\\): .*--state-dir / VMPOD_STATE_DIR`,
          ),
        ],
        // root writes anywhere a mode allows; /proc is a place even root cannot create a file in
        [
          { '--state-dir': '/proc/self' },
          /^tapmanager: state dir \/proc\/self is not writable \((ENOENT|EACCES)\): make it writable/,
        ],
        [
          { '--http-listen': `127.0.0.1:${port}` },
          new RegExp(
            `^tapmanager: HTTP listen 127\\.0\\.0\\.1:${port}: EADDRINUSE: another process holds this port: stop it or choose another port \\(--http-listen / VMPOD_HTTP_LISTEN\\)$`,
          ),
        ],
      ];
      for (const [over, want] of cases) {
        const r = await runToExit(base(over));
        expect(r.code, r.stderr).toBe(1);
        // the log's first line says which version ran; then the problem, one line
        const [first, ...rest] = r.stderr.split('\n');
        expect(JSON.parse(first!)).toMatchObject({ msg: 'tapmanager starting', version: pkgVersion });
        expect(rest, r.stderr).toHaveLength(1);
        expect(rest[0]).toMatch(want);
        // a start that fails its checks creates nothing: no socket, no state dir, no CNI cache dir
        expect(readdirSync(dir).sort()).toEqual(['a-file', 'conf']);
        console.log(`tapmanager exited after ${r.ms} ms: ${r.stderr}`);
      }
      // the exec probe against a daemon that is not there: not ready, and why
      const probe = await tapctl(join(dir, 'tm.sock'), 'status', '--ready');
      expect(probe.exitCode).toBe(1);
      expect(probe.stdout).toMatch(new RegExp(`^not ready: tapmanager does not answer on ${dir}/tm.sock: .*ENOENT`));
    } finally {
      taken.close();
      removeDir(dir);
    }
  });
});
