// CNI 1.1's STATUS and GC, and CHECK's prevResult, through the client and spawnPluginExec against
// test/fixtures/cni/fake11: a small CNI 1.1 plugin (installed under two names) that logs its env and stdin and
// answers as its control file says. No kernel objects: the plugins only answer.
import {
  copyFileSync,
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { cacheFilePath } from '../../src/cni/cache.js';
import { CniClient } from '../../src/cni/client.js';
import { parseConfList, type NetworkConfigList, type RuntimeConf } from '../../src/cni/config.js';
import { spawnPluginExec } from '../../src/cni/exec.js';

const FAKE = join(import.meta.dirname, '../fixtures/cni/fake11');

let root = '';
let bin = '';
let cacheDir = '';
let logFile = '';
let control = '';

interface LogLine {
  phase: 'begin' | 'end';
  verb: string;
  type: string;
  pid: number;
  env: Record<string, string>;
  stdin?: Record<string, unknown>;
}

const begins = (verb: string): LogLine[] => runs().filter((l) => l.verb === verb);
const runs = (): LogLine[] =>
  existsSync(logFile)
    ? readFileSync(logFile, 'utf8')
        .trim()
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as LogLine)
        .filter((l) => l.phase === 'begin')
    : [];

function answer(a: Record<string, unknown>): void {
  writeFileSync(control, JSON.stringify(a));
}

function net(version = '1.1.0', extra: Record<string, unknown> = {}, marker = 'one'): NetworkConfigList {
  const plugin = (type: string) => ({ type, log: logFile, control, marker });
  return parseConfList(
    Buffer.from(
      JSON.stringify({ cniVersion: version, name: 'net11', ...extra, plugins: [plugin('fake11'), plugin('fake11b')] }),
    ),
    '/etc/cni/net.d/10-net11.conflist',
  );
}

const rt = (containerId: string, ifName = 'virtlet-eth0'): RuntimeConf => ({
  containerId,
  netns: `/var/run/netns/${containerId}`,
  ifName,
  args: [
    ['IgnoreUnknown', '1'],
    ['K8S_POD_NAME', containerId],
  ],
});

function client(timeoutMs = 20_000): CniClient {
  return new CniClient({ binDirs: [bin], cacheDir, exec: spawnPluginExec({ killGraceMs: 200 }), timeoutMs });
}

beforeEach(() => {
  root = mkdtempSync(join(tmpdir(), 'vmpod-cni11-'));
  bin = join(root, 'bin');
  cacheDir = join(root, 'cache');
  mkdirSync(bin);
  for (const name of ['fake11', 'fake11b']) {
    copyFileSync(FAKE, join(bin, name));
    chmodSync(join(bin, name), 0o755);
  }
  logFile = join(root, 'runs.log');
  control = join(root, 'control.json');
});

afterEach(() => {
  rmSync(root, { recursive: true, force: true });
});

describe('STATUS', () => {
  it('asks every plugin of a 1.1.0 list with its own config and no attachment', async () => {
    expect(await client().status(net())).toEqual([
      { plugin: 'fake11', code: 0, msg: '' },
      { plugin: 'fake11b', code: 0, msg: '' },
    ]);
    const r = runs();
    expect(r.map((x) => `${x.type} ${x.verb}`)).toEqual(['fake11 STATUS', 'fake11b STATUS']);
    expect(r[0]!.env).toMatchObject({
      CNI_COMMAND: 'STATUS',
      CNI_PATH: bin,
      CNI_CONTAINERID: '',
      CNI_NETNS: '',
      CNI_IFNAME: '',
    });
    expect(r[0]!.stdin).toEqual({
      type: 'fake11',
      log: logFile,
      control,
      marker: 'one',
      name: 'net11',
      cniVersion: '1.1.0',
    });
  });

  it("reports each plugin's error code and message (50, 51)", async () => {
    answer({ STATUS: { code: 51, msg: 'the uplink is down', details: 'eth9 has no carrier' } });
    const st = await client().status(net());
    expect(st).toEqual([
      { plugin: 'fake11', code: 51, msg: 'the uplink is down: eth9 has no carrier' },
      { plugin: 'fake11b', code: 51, msg: 'the uplink is down: eth9 has no carrier' },
    ]);
  });

  it('counts a STATUS that hangs as 50, killed at the per-plugin timeout', async () => {
    answer({ STATUS: 'hang' });
    const st = await client(400).status(net());
    expect(st.map((s) => s.code)).toEqual([50, 50]);
    expect(st[0]!.msg).toMatch(/plugin fake11 STATUS timed out after 400 ms/);
    for (const r of runs()) expect(() => process.kill(r.pid, 0)).toThrow();
  });

  it('never asks a list below 1.1.0', async () => {
    expect(await client().status(net('1.0.0'))).toEqual([]);
    expect(runs()).toEqual([]);
  });
});

describe('GC', () => {
  /** ADDs for live (A), stale (B) and another runtime's attachment (C, ifName eth0); the log is cleared. */
  async function attachments(c: CniClient): Promise<void> {
    await c.add(net(), rt('podA'));
    await c.add(net(), rt('podB'));
    await c.add(net(), rt('podC', 'eth0'));
    rmSync(logFile, { force: true });
  }

  it("DELs each stale attachment with the config its cache record holds, only for the runtime's ifName", async () => {
    const c = client();
    await attachments(c);
    // the config dir changed since the ADDs: the DEL still gets the config the ADD ran with
    const report = await c.gc(net('1.1.0', {}, 'two'), [{ containerId: 'podA', ifName: 'virtlet-eth0' }], {
      plugins: false,
      ifNames: ['virtlet-eth0'],
    });
    expect(report).toEqual({
      network: 'net11',
      removed: [{ containerId: 'podB', ifName: 'virtlet-eth0' }],
      pluginsAsked: [],
      errors: [],
    });
    const r = runs();
    expect(r.map((x) => `${x.type} ${x.verb} ${x.env.CNI_CONTAINERID}`)).toEqual([
      'fake11b DEL podB',
      'fake11 DEL podB',
    ]);
    expect(r[0]!.stdin).toMatchObject({ marker: 'one', prevResult: { cniVersion: '1.1.0' } });
    expect(r[0]!.env).toMatchObject({
      CNI_NETNS: '/var/run/netns/podB',
      CNI_IFNAME: 'virtlet-eth0',
      CNI_ARGS: 'IgnoreUnknown=1;K8S_POD_NAME=podB',
    });
    expect(existsSync(cacheFilePath(cacheDir, 'net11', 'podB', 'virtlet-eth0'))).toBe(false);
    expect(existsSync(cacheFilePath(cacheDir, 'net11', 'podA', 'virtlet-eth0'))).toBe(true);
    expect(existsSync(cacheFilePath(cacheDir, 'net11', 'podC', 'eth0'))).toBe(true);
  });

  it('spares an attachment the runtime still holds, and names it valid to the plugins', async () => {
    const c = client();
    await attachments(c);
    const report = await c.gc(net(), [{ containerId: 'podA', ifName: 'virtlet-eth0' }], {
      plugins: true,
      ifNames: ['virtlet-eth0'],
      stillHeld: (a) => a.containerId === 'podB',
    });
    expect(report.removed).toEqual([]);
    expect(begins('DEL')).toEqual([]);
    const valid = [
      { containerID: 'podA', ifname: 'virtlet-eth0' },
      { containerID: 'podB', ifname: 'virtlet-eth0' },
    ];
    for (const g of begins('GC'))
      expect(g.stdin).toMatchObject({ 'cni.dev/valid-attachments': valid, 'cni.dev/attachments': valid });
  });

  it('sends GC to every plugin with exactly the valid attachments under both keys, when asked', async () => {
    const c = client();
    const valid = [{ containerId: 'podA', ifName: 'virtlet-eth0' }];
    const report = await c.gc(net(), valid, { plugins: true, ifNames: ['virtlet-eth0'] });
    expect(report.pluginsAsked).toEqual(['fake11', 'fake11b']);
    const r = runs();
    expect(r.map((x) => `${x.type} ${x.verb}`)).toEqual(['fake11 GC', 'fake11b GC']);
    const attachmentsSent = [{ containerID: 'podA', ifname: 'virtlet-eth0' }];
    expect(r[0]!.stdin).toEqual({
      type: 'fake11',
      log: logFile,
      control,
      marker: 'one',
      name: 'net11',
      cniVersion: '1.1.0',
      'cni.dev/valid-attachments': attachmentsSent,
      'cni.dev/attachments': attachmentsSent,
    });
    expect(r[0]!.env).toMatchObject({
      CNI_COMMAND: 'GC',
      CNI_PATH: bin,
      CNI_CONTAINERID: '',
      CNI_NETNS: '',
      CNI_IFNAME: '',
    });
  });

  it('sends no plugin GC without plugins, nor to a list below 1.1.0', async () => {
    const c = client();
    await c.gc(net(), [], { plugins: false });
    await c.gc(net('1.0.0'), [], { plugins: true });
    expect(runs()).toEqual([]);
  });

  it('does nothing at all for a list with disableGC', async () => {
    const c = client();
    await attachments(c);
    const report = await c.gc(net('1.1.0', { disableGC: true }), [], { plugins: true });
    expect(report).toEqual({ network: 'net11', disabled: true, removed: [], pluginsAsked: [], errors: [] });
    expect(runs()).toEqual([]);
    expect(existsSync(cacheFilePath(cacheDir, 'net11', 'podB', 'virtlet-eth0'))).toBe(true);
  });

  it('goes on past a failing plugin and reports every failure', async () => {
    const c = client();
    await attachments(c);
    answer({ GC: { code: 100, msg: 'cannot list the allocations' }, DEL: { code: 100, msg: 'store locked' } });
    const report = await c.gc(net(), [{ containerId: 'podA', ifName: 'virtlet-eth0' }], {
      plugins: true,
      ifNames: ['virtlet-eth0'],
    });
    expect(report.removed).toEqual([]);
    expect(report.pluginsAsked).toEqual(['fake11', 'fake11b']);
    expect(report.errors).toHaveLength(3);
    expect(report.errors[0]).toMatch(/^DEL of the stale attachment podB\/virtlet-eth0: .*store locked/);
    expect(report.errors[1]).toMatch(
      /^GC of plugin fake11: plugin fake11 GC failed: \[code 100\] cannot list the allocations/,
    );
    expect(report.errors[2]).toMatch(/^GC of plugin fake11b: /);
    // the DEL that failed keeps the record for the next GC
    expect(existsSync(cacheFilePath(cacheDir, 'net11', 'podB', 'virtlet-eth0'))).toBe(true);
  });
});

describe('CHECK', () => {
  it('gives every plugin the prevResult the runtime makes of the cached one', async () => {
    const c = client();
    await c.add(net(), rt('podA'));
    rmSync(logFile, { force: true });
    const out = await c.check(net(), rt('podA'), {
      prevResult: (cached) => ({ ...cached, dns: { nameservers: ['10.0.0.53'] } }),
    });
    expect(out).toBe('checked');
    const r = runs();
    expect(r.map((x) => `${x.type} ${x.verb}`)).toEqual(['fake11 CHECK', 'fake11b CHECK']);
    expect(r[0]!.stdin?.prevResult).toEqual({ cniVersion: '1.1.0', dns: { nameservers: ['10.0.0.53'] } });
  });

  it('honours disableCheck', async () => {
    const c = client();
    await c.add(net(), rt('podA'));
    rmSync(logFile, { force: true });
    expect(await c.check(net('1.1.0', { disableCheck: true }), rt('podA'))).toBe('disabled');
    expect(runs()).toEqual([]);
  });
});
