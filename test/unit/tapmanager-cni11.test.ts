// The daemon's CNI 1.1 parts over fakes: STATUS gating (cni-status.ts), one GC (gc.ts) and the pods' checks
// (checks.ts). The plugins themselves run in test/integration/tapmanager-cni11.test.ts.
import { describe, expect, it } from 'vitest';
import { parseConfList, type NetworkConfigList, type PluginStatus } from '../../src/cni/index.js';
import { CniStatusMonitor } from '../../src/tapmanager/cni-status.js';
import { runGc } from '../../src/tapmanager/gc.js';
import { OpLock } from '../../src/tapmanager/oplock.js';
import { PodChecker } from '../../src/tapmanager/checks.js';
import type { PodCheck } from '../../src/podnet/index.js';
import { silentLogger } from '../../src/log.js';

const list = (name = 'net'): NetworkConfigList =>
  parseConfList(
    Buffer.from(JSON.stringify({ cniVersion: '1.1.0', name, plugins: [{ type: 'a' }, { type: 'b' }] })),
    '/x.conflist',
  );

function monitor(answers: PluginStatus[][], opts: { intervalMs?: number; lists?: NetworkConfigList[] } = {}) {
  let asked = 0;
  const l = list();
  const seen: PluginStatus[][] = [];
  const m = new CniStatusMonitor({
    status: async () => answers[Math.min(asked++, answers.length - 1)]!,
    loadConfList: async () => opts.lists?.[Math.min(asked, opts.lists.length - 1)] ?? l,
    intervalMs: opts.intervalMs ?? 60_000,
    log: silentLogger(),
    onStatus: (_n, s) => void seen.push(s),
  });
  return { m, asked: () => asked, seen };
}

const ok: PluginStatus[] = [
  { plugin: 'a', code: 0, msg: '' },
  { plugin: 'b', code: 0, msg: '' },
];
const down: PluginStatus[] = [
  { plugin: 'a', code: 0, msg: '' },
  { plugin: 'b', code: 50, msg: 'no uplink' },
];

describe('CniStatusMonitor', () => {
  it('refuses an add at once while the last answer is fresh and an error, without asking again', async () => {
    const { m, asked, seen } = monitor([down]);
    await m.refresh();
    await expect(m.admitAdd()).rejects.toThrow(
      'add refused: CNI plugin b of network net answers STATUS with error 50 (cannot take adds): no uplink; the network cannot take adds now',
    );
    await expect(m.admitAdd()).rejects.toThrow(/plugin b/);
    expect(asked()).toBe(1);
    expect(m.reasons()).toEqual([
      'CNI plugin b of network net answers STATUS with error 50 (cannot take adds): no uplink',
    ]);
    expect(seen).toEqual([down]);
  });

  it('asks again before an add when the last answer is older than the interval', async () => {
    const { m, asked } = monitor([down, ok], { intervalMs: 1 });
    await m.refresh();
    await new Promise((r) => setTimeout(r, 5));
    await m.admitAdd();
    expect(asked()).toBe(2);
    expect(m.reasons()).toEqual([]);
  });

  it('asks again when the config changed, and once for callers that come together', async () => {
    const { m, asked } = monitor([ok], { lists: [list('net'), list('net2')] });
    await Promise.all([m.refresh(), m.refresh()]);
    expect(asked()).toBe(1);
    await m.admitAdd();
    expect(asked()).toBe(2);
  });
});

describe('runGc', () => {
  it("reads the live pods inside the lock and names them with tapmanager's ifName", async () => {
    const lock = new OpLock();
    let live = ['p1'];
    let release!: () => void;
    const adding = lock.runShared(() => new Promise<void>((r) => (release = r)));
    const calls: unknown[] = [];
    const gc = runGc({
      gc: async (l, valid, opts) => (
        calls.push({ network: l.name, valid, opts }),
        { network: l.name, removed: [], pluginsAsked: [], errors: ['x failed'] }
      ),
      loadConfList: async () => list(),
      liveKeys: () => live,
      netnsExists: (key) => key === 'orphan',
      ifName: 'virtlet-eth0',
      plugins: true,
      lock,
      log: silentLogger(),
    });
    await new Promise((r) => setImmediate(r));
    expect(calls).toEqual([]);
    live = ['p1', 'p2']; // the add that held the lock made p2
    release();
    await adding;
    expect((await gc).errors).toEqual(['x failed']);
    expect(calls).toEqual([
      {
        network: 'net',
        valid: [
          { containerId: 'p1', ifName: 'virtlet-eth0' },
          { containerId: 'p2', ifName: 'virtlet-eth0' },
        ],
        opts: { plugins: true, ifNames: ['virtlet-eth0'], stillHeld: expect.any(Function) },
      },
    ]);
    const { stillHeld } = (calls[0] as { opts: { stillHeld: (a: { containerId: string; ifName: string }) => boolean } })
      .opts;
    expect([
      stillHeld({ containerId: 'orphan', ifName: 'virtlet-eth0' }),
      stillHeld({ containerId: 'gone', ifName: 'virtlet-eth0' }),
    ]).toEqual([true, false]);
  });
});

describe('PodChecker', () => {
  const result = (key: string, failures: PodCheck['failures']): PodCheck => ({
    key,
    ok: failures.length === 0,
    failures,
    cni: 'checked',
    at: '2026-01-01T00:00:00.000Z',
  });

  it('keeps a failing pod degraded until a check passes, and counts each reason once per check', async () => {
    let next = result('p1', [
      { reason: 'link-down', detail: 'tap0 is down' },
      { reason: 'link-down', detail: 'br0 is down' },
      { reason: 'cni-check-failed', detail: 'x' },
    ]);
    const counted: string[] = [];
    const c = new PodChecker({
      check: async () => next,
      readyKeys: () => ['p1'],
      log: silentLogger(),
      onFailure: (r) => void counted.push(r),
    });
    await c.checkAll();
    expect(c.degraded('p1')?.failures.map((f) => f.reason)).toEqual(['link-down', 'link-down', 'cni-check-failed']);
    expect(counted).toEqual(['link-down', 'cni-check-failed']);
    next = result('p1', []);
    await c.checkOne('p1');
    expect(c.degraded('p1')).toBeUndefined();
  });

  it('goes on past a pod whose check cannot run, and forgets a released pod', async () => {
    const c = new PodChecker({
      check: async (key) =>
        key === 'bad'
          ? Promise.reject(new Error('no record'))
          : result(key, [{ reason: 'netns-missing', detail: 'gone' }]),
      readyKeys: () => ['bad', 'p2'],
      log: silentLogger(),
    });
    await c.checkAll();
    expect(c.degraded('p2')?.ok).toBe(false);
    c.forget('p2');
    expect(c.degraded('p2')).toBeUndefined();
  });
});

describe('PodChecker.checkAll', () => {
  it('runs again after a run that found no pod (it does not stay "running")', async () => {
    let keys: string[] = [];
    let checked = 0;
    const c = new PodChecker({
      check: async (key) => (checked++, { key, ok: true, failures: [], cni: 'checked', at: '' }),
      readyKeys: () => keys,
      log: silentLogger(),
    });
    await c.checkAll();
    keys = ['p1'];
    await c.checkAll();
    expect(checked).toBe(1);
  });
});
