// The step engine (src/podnet/steps.ts) against the real kernel: the rp-filter step in a netns that starts with
// rp_filter 2 (what a new netns copies from an Ubuntu host), and the undo run that removes the netns. The host's
// own sysctls are never touched: the netns's copies are set to 2 from inside it.
import { describe, it, expect, afterEach } from 'vitest';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { NetExec } from '../../src/podnet/exec.js';
import { recordSteps, runSteps, undoRecord, type StepDeps } from '../../src/podnet/steps.js';
import type { Step } from '../../src/state/record.js';
import { podNetnsSteps, rpFilterStep } from '../../src/podnet/netnssteps.js';
import { Sysfs } from '../../src/devices/sysfs.js';
import { StateStore } from '../../src/state/store.js';
import { Phase, newRecord, StepName, type PodRecord } from '../../src/state/record.js';
import { silentLogger } from '../../src/log.js';
import { ErrorCode, VmpodError } from '../../src/errors.js';
import { delNetns, listNetns, uniqueName } from '../helpers/netns.js';

/** Records the steps, then applies them, as add does. */
async function applySteps(deps: StepDeps, rec: PodRecord, steps: Step[]): Promise<void> {
  recordSteps(deps.store, rec, steps);
  await runSteps(deps, rec, steps);
}

const NETNS_DIR = '/var/run/netns';
const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function setup(): { key: string; deps: StepDeps; rec: PodRecord } {
  const key = uniqueName('vmpst-');
  const stateDir = mkdtempSync(join(tmpdir(), 'vmpod-steps-'));
  const store = new StateStore(stateDir);
  const never = async (): Promise<never> => {
    throw new VmpodError(ErrorCode.Internal, 'not used by this test');
  };
  const deps: StepDeps = {
    exec: new NetExec(10_000),
    store,
    sysfs: new Sysfs('/sys'),
    vfLink: never,
    netnsDir: NETNS_DIR,
    vfNetdevTimeoutMs: 0,
    cniDel: never,
  };
  const rec = newRecord({
    key,
    desc: { podId: key, podNs: 'default', podName: key },
    nsPath: join(NETNS_DIR, key),
    phase: Phase.Adding,
    steps: [],
    cniIfNames: [],
  });
  cleanups.push(async () => {
    await delNetns(key);
    rmSync(stateDir, { recursive: true, force: true });
    expect(await listNetns(), 'netns left').not.toContain(key);
  });
  return { key, deps, rec };
}

async function inNetns(key: string, argv: string[]): Promise<string> {
  return (await execa('nsenter', [`--net=${join(NETNS_DIR, key)}`, '--', ...argv], { timeout: 10_000 })).stdout;
}

const rpFilters = async (key: string, devs: string[]) =>
  (await inNetns(key, ['sysctl', '-n', ...devs.map((d) => `net.ipv4.conf.${d}.rp_filter`)])).split('\n');

describe('step engine: record before apply', () => {
  it('refuses to run a step that is not in the record, and runs nothing', async () => {
    const { key, deps, rec } = setup();
    const [netns] = podNetnsSteps(key);
    await expect(runSteps(deps, rec, [netns!])).rejects.toMatchObject({
      op: 'netns',
      message: expect.stringMatching(/^step "netns" on .* failed: applied before it was recorded/),
    });
    expect(await listNetns()).not.toContain(key);
  });
});

describe('step engine: rp-filter', () => {
  it('sets all and default to 0 in a netns that had 2, so a bridge made after has 0; the undo run leaves nothing', async () => {
    const { key, deps, rec } = setup();
    const [netns, rpFilter] = podNetnsSteps(key);
    await applySteps(deps, rec, [netns!]);
    // what a new netns copies from a host with rp_filter 2 (loose), set from inside: the host keeps its own
    await inNetns(key, ['sysctl', '-q', '-w', 'net.ipv4.conf.all.rp_filter=2', 'net.ipv4.conf.default.rp_filter=2']);
    expect(await rpFilters(key, ['all', 'default'])).toEqual(['2', '2']);

    const br = uniqueName('vmpsb');
    await applySteps(deps, rec, [
      rpFilter!,
      {
        name: StepName.Bridge,
        target: br,
        do: [{ op: 'ip', args: ['link', 'add', 'name', br, 'type', 'bridge'] }],
        undo: [{ op: 'ip', args: ['link', 'del', 'dev', br], withNetns: true }],
      },
    ]);
    expect(await rpFilters(key, ['all', 'default', br])).toEqual(['0', '0', '0']);
    expect(deps.store.read(key)!.steps.map((s) => s.name)).toEqual(['netns', 'rp-filter', 'bridge']);

    expect(await undoRecord(deps, rec, silentLogger())).toEqual([]);
    expect(await listNetns()).not.toContain(key);
  });

  it("a sysctl that fails is a step error naming rp-filter and sysctl's complaint", async () => {
    const { key, deps, rec } = setup();
    await applySteps(deps, rec, podNetnsSteps(key).slice(0, 1));
    const bad = rpFilterStep(key);
    bad.do = [{ op: 'sysctl', settings: ['net.ipv4.conf.vmpod-nosuchdev.rp_filter=0'] }];
    await expect(applySteps(deps, rec, [bad])).rejects.toMatchObject({
      op: 'rp-filter',
      message: expect.stringMatching(
        new RegExp(`^step "rp-filter" on ${key} failed: sysctl -w net.ipv4.conf.vmpod-nosuchdev.rp_filter=0 in .*: .+`),
      ),
    });
    expect(await undoRecord(deps, rec, silentLogger())).toEqual([]);
  });

  it("made with the netns in one call: a failing sysctl removes the netns again; the error is the netns step's, naming the sysctl", async () => {
    const { key, deps, rec } = setup();
    const [netns, rpFilter] = podNetnsSteps(key);
    rpFilter!.do = [
      { op: 'sysctl', settings: ['net.ipv4.conf.all.rp_filter=0', 'net.ipv4.conf.vmpod-nosuchdev.rp_filter=0'] },
    ];
    await expect(applySteps(deps, rec, [netns!, rpFilter!])).rejects.toMatchObject({
      op: 'netns',
      message: expect.stringMatching(
        new RegExp(
          `^step "netns" on ${key} failed: netnsMake: sysctl -w net.ipv4.conf.vmpod-nosuchdev.rp_filter=0: ENOENT`,
        ),
      ),
    });
    expect(await listNetns()).not.toContain(key);
    expect(existsSync(join(NETNS_DIR, key))).toBe(false);
    // nothing of it is left to undo: the record drops the netns and what came after
    expect(deps.store.read(key)!.steps).toEqual([]);
    expect(await undoRecord(deps, rec, silentLogger())).toEqual([]);
  });
});

describe('step engine: the undo starts its CNI DEL early', () => {
  it('the DEL is called at once, and its plugins get their go only once the runs ahead of it are over', async () => {
    const { key, deps, rec } = setup();
    // a second netns, recorded after the CNI ADD: its removal comes before the DEL in the undo
    const other = uniqueName('vmpst-');
    cleanups.push(async () => {
      await delNetns(other);
    });
    const otherPath = join(NETNS_DIR, other);
    await applySteps(deps, rec, [
      podNetnsSteps(key)[0]!,
      { name: StepName.CniAdd, target: 'eth0', do: [], undo: [{ op: 'cni-del', ifName: 'eth0' }] },
      podNetnsSteps(other)[0]!,
    ]);
    expect(existsSync(otherPath)).toBe(true);
    const events: string[] = [];
    deps.cniDel = async (_rec, ifName, _config, hold) => {
      events.push(`del called (${ifName}); the other netns there: ${existsSync(otherPath)}`);
      await hold?.until;
      events.push(`del go; the other netns there: ${existsSync(otherPath)}`);
    };
    expect(await undoRecord(deps, rec, silentLogger())).toEqual([]);
    expect(events).toEqual(['del called (eth0); the other netns there: true', 'del go; the other netns there: false']);
    expect(await listNetns()).not.toContain(key);
    expect(await listNetns()).not.toContain(other);
  });
});
