// tapctl check through a real tapmanager on Debian's bridge + host-local plugins: a healthy pod passes (CNI CHECK
// gets the prevResult its pod netns holds now, as the cached ADD result would fail it); a pod whose tap went down,
// whose IPAM allocation was removed, or whose host bridge was deleted behind tapmanager's back fails with the reason;
// `tapctl list` shows it degraded until a later check passes; nothing is repaired.
import { randomBytes } from 'node:crypto';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CniClient, loadConfList } from '../../src/cni/index.js';
import { BIN, startDaemon, stopDaemonAndNet, type Daemon } from '../helpers/daemon.js';
import { makeCniConf, type CniTestNet } from '../helpers/cniconf.js';

const KEY = `chk-${process.pid}-${randomBytes(2).toString('hex')}`;
let net: CniTestNet;
let daemon: Daemon;
let port = 0;

const tapctl = (...a: string[]) =>
  execa(process.execPath, [BIN.tapctl, '--socket', daemon.socket, ...a], { reject: false, timeout: 60_000 });

interface Check {
  ok: boolean;
  failures: { reason: string; detail: string }[];
  cni: string;
}

async function check(): Promise<{ code: number; r: Check }> {
  const out = await tapctl('check', KEY);
  return { code: out.exitCode ?? -1, r: JSON.parse(out.stdout) as Check };
}

async function listed(): Promise<{ state: string; degraded?: { failures: { reason: string }[] } }> {
  const pods = JSON.parse((await tapctl('list', '--json')).stdout) as {
    key: string;
    state: string;
    degraded?: { failures: { reason: string }[] };
  }[];
  return pods.find((p) => p.key === KEY)!;
}

async function failuresCounted(reason: string): Promise<number> {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const line = text.split('\n').find((l) => l.startsWith(`vmpod_pod_check_failures_total{reason="${reason}"} `));
  return Number(line?.split(' ').pop());
}

beforeAll(async () => {
  net = await makeCniConf();
  daemon = await startDaemon({
    confDir: net.confDir,
    binDirs: net.binDirs,
    cacheDir: net.cacheDir,
    extraArgs: ['--check-interval', '0', '--http-listen', '127.0.0.1:0'],
  });
  port = daemon.lines().find((l) => l.msg === 'HTTP listening: /healthz /readyz /metrics')?.port as number;
  const r = await tapctl('add', KEY, '--pod-name', 'vm-check', '--pod-namespace', 'default');
  expect(r.exitCode, r.stderr).toBe(0);
});

afterAll(async () => {
  await tapctl('release', KEY);
  await stopDaemonAndNet(daemon, net, { ifAlive: true, podKey: KEY });
  expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
});

describe('tapctl check', () => {
  it('passes a healthy pod, with CNI CHECK run (the cached result as stored would fail it)', async () => {
    const { code, r } = await check();
    expect(r.failures).toEqual([]);
    expect([code, r.ok, r.cni]).toEqual([0, true, 'checked']);
    expect((await listed()).state).toBe('ready');
    // why the prevResult is rewritten: the cached one names the address that went to the VM (and, under the bridge
    // binding, its MAC)
    const client = new CniClient({ binDirs: net.binDirs, cacheDir: net.cacheDir });
    const rt = {
      containerId: KEY,
      netns: `/var/run/netns/${KEY}`,
      ifName: 'virtlet-eth0',
      args: [
        ['IgnoreUnknown', '1'],
        ['K8S_POD_NAMESPACE', 'default'],
        ['K8S_POD_NAME', 'vm-check'],
        ['K8S_POD_INFRA_CONTAINER_ID', KEY],
      ] as [string, string][],
    };
    await expect(client.check(await loadConfList(net.confDir), rt)).rejects.toThrow(
      /plugin bridge CHECK failed: .*Failed to match addr/,
    );
  });

  it('fails a pod whose tap is down, and passes it again once it is up (nothing repaired it)', async () => {
    await execa('ip', ['-n', KEY, 'link', 'set', 'tap0', 'down']);
    const { code, r } = await check();
    expect(code).toBe(1);
    expect(r.failures).toEqual([{ reason: 'link-down', detail: 'the tap tap0 is down' }]);
    expect(await listed()).toMatchObject({ state: 'degraded', degraded: { failures: [{ reason: 'link-down' }] } });
    expect((await tapctl('list')).stdout).toMatch(new RegExp(`${KEY}.*degraded`));
    await execa('ip', ['-n', KEY, 'link', 'set', 'tap0', 'up']);
    expect((await check()).code).toBe(0);
    expect((await listed()).state).toBe('ready');
    expect(await failuresCounted('link-down')).toBe(1);
  });

  it("fails a pod whose IPAM allocation was removed behind tapmanager's back", async () => {
    const [alloc] = (await net.leftovers()).allocations;
    const content = readFileSync(alloc!);
    rmSync(alloc!);
    try {
      const { code, r } = await check();
      expect(code).toBe(1);
      expect(r.failures.map((f) => f.reason)).toEqual(['cni-check-failed']);
      expect(r.failures[0]!.detail).toMatch(
        /plugin bridge CHECK failed: .*host-local: Failed to find address added by container/,
      );
      expect(await listed()).toMatchObject({
        state: 'degraded',
        degraded: { failures: [{ reason: 'cni-check-failed' }] },
      });
    } finally {
      writeFileSync(alloc!, content);
    }
    expect((await check()).code).toBe(0);
    expect((await listed()).state).toBe('ready');
  });

  it('fails a pod whose host bridge was deleted, and leaves it deleted', async () => {
    await execa('ip', ['link', 'del', 'dev', net.bridge]);
    const { code, r } = await check();
    expect(code).toBe(1);
    expect(r.failures.map((f) => f.reason)).toEqual(['cni-check-failed']);
    expect(r.failures[0]!.detail).toContain(net.bridge);
    expect(await net.bridgeExists()).toBe(false);
    expect(await failuresCounted('cni-check-failed')).toBe(2);
  });
});

describe('a tc-redirect pod, checked on --check-interval', () => {
  const key = `chkt-${process.pid}-${randomBytes(2).toString('hex')}`;
  let tnet: CniTestNet;
  let td: Daemon;
  const tctl = (...a: string[]) =>
    execa(process.execPath, [BIN.tapctl, '--socket', td.socket, ...a], { reject: false, timeout: 60_000 });
  const state = async (): Promise<{ state: string; degraded?: { failures: { reason: string; detail: string }[] } }> =>
    (JSON.parse((await tctl('list', '--json')).stdout) as { key: string; state: string }[]).find((p) => p.key === key)!;
  const until = async (what: string, cond: () => Promise<boolean>): Promise<void> => {
    const end = Date.now() + 30_000;
    while (!(await cond())) {
      if (Date.now() > end) throw new Error(`timed out waiting for ${what}\n${td.logs()}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  };

  beforeAll(async () => {
    tnet = await makeCniConf();
    td = await startDaemon({
      confDir: tnet.confDir,
      binDirs: tnet.binDirs,
      cacheDir: tnet.cacheDir,
      extraArgs: ['--binding', 'tc-redirect', '--check-interval', '300'],
    });
    const r = await tctl('add', key, '--pod-name', 'vm-tc', '--pod-namespace', 'default');
    expect(r.exitCode, r.stderr).toBe(0);
  });

  afterAll(async () => {
    await tctl('release', key);
    await stopDaemonAndNet(td, tnet, { ifAlive: true, podKey: key });
    expect(await tnet.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
  });

  it('passes with CNI CHECK (the interface keeps its MAC), degrades when a redirect filter goes, and recovers when it is back', async () => {
    const { stdout } = await tctl('check', key);
    expect(JSON.parse(stdout)).toMatchObject({ ok: true, failures: [], cni: 'checked' });
    await execa('ip', ['netns', 'exec', key, 'tc', 'filter', 'del', 'dev', 'tap0', 'parent', 'ffff:', 'prio', '100']);
    await until("the interval's check to find it", async () => (await state()).state === 'degraded');
    expect((await state()).degraded?.failures).toEqual([
      { reason: 'redirect-missing', detail: 'tap0 has no ingress filter redirecting its frames to virtlet-eth0' },
    ]);
    expect(td.lines().some((l) => l.msg === 'pod check failed: degraded (nothing is repaired)' && l.key === key)).toBe(
      true,
    );
    await execa('ip', [
      'netns',
      'exec',
      key,
      'tc',
      'filter',
      'add',
      'dev',
      'tap0',
      'parent',
      'ffff:',
      'prio',
      '100',
      'protocol',
      'all',
      'u32',
      'match',
      'u8',
      '0',
      '0',
      'at',
      '0',
      'action',
      'mirred',
      'egress',
      'redirect',
      'dev',
      'virtlet-eth0',
    ]);
    await until('a later check to pass', async () => (await state()).state === 'ready');
  });
});
