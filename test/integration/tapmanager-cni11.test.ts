// CNI 1.1's STATUS and GC through a real tapmanager, with a conflist of two small fake CNI 1.1 plugins
// (test/fixtures/cni/fake11, under the names fake11 and fake11b): the first makes a real veth into the pod netns on
// ADD, each logs its env and stdin and answers as its own control file says. Debian's plugins speak up to 1.0.0, so
// a 1.1.0 conflist needs plugins of its own.
import {
  chmodSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  unlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createHash, randomBytes } from 'node:crypto';
import { setTimeout as delay } from 'node:timers/promises';
import { execa } from 'execa';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { BIN, startDaemon, type Daemon } from '../helpers/daemon.js';
import { delNetns, listLinks, listNetns } from '../helpers/netns.js';

const FAKE = join(import.meta.dirname, '../fixtures/cni/fake11');

interface LogLine {
  phase: 'begin' | 'end';
  verb: string;
  type: string;
  pid: number;
  env: Record<string, string>;
  stdin?: Record<string, unknown>;
}

let root = '';
let confDir = '';
let bin = '';
let cacheDir = '';
let logFile = '';
let daemon: Daemon | undefined;
const keys: string[] = [];
const id = randomBytes(3).toString('hex');
let subnetByte = 0;

/** Writes the conflist: fake11 (a veth with an address of a private /24) then fake11b. */
function conflist(extra: Record<string, unknown> = {}, marker = 'one', version = '1.1.0'): void {
  const plugin = (type: string, more: Record<string, unknown> = {}) => ({
    type,
    log: logFile,
    control: join(root, `${type}.control`),
    marker,
    ...more,
  });
  writeFileSync(
    join(confDir, '10-fake11.conflist'),
    JSON.stringify({
      cniVersion: version,
      name: `net11-${id}`,
      ...extra,
      plugins: [plugin('fake11', { address: `10.251.${subnetByte}.5/24` }), plugin('fake11b')],
    }),
  );
}

function answer(type: 'fake11' | 'fake11b', a: Record<string, unknown>): void {
  writeFileSync(join(root, `${type}.control`), JSON.stringify(a));
}

const runs = (): LogLine[] =>
  existsSync(logFile)
    ? readFileSync(logFile, 'utf8')
        .trim()
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as LogLine)
    : [];
const begins = (verb: string) => runs().filter((l) => l.phase === 'begin' && l.verb === verb);

const tapctl = (...a: string[]) =>
  execa(process.execPath, [BIN.tapctl, '--socket', daemon!.socket, ...a], { reject: false, timeout: 60_000 });

function key(): string {
  const k = `c11-${id}-${keys.length}`;
  keys.push(k);
  return k;
}

async function add(k: string) {
  return tapctl('add', k, '--pod-name', k, '--pod-namespace', 'default');
}

async function addOk(k: string): Promise<void> {
  const r = await add(k);
  expect(r.exitCode, r.stderr).toBe(0);
}

async function until(what: string, cond: () => Promise<boolean> | boolean, ms = 20_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}\n${daemon?.logs() ?? ''}`);
    await delay(50);
  }
}

beforeEach(() => {
  root = mkdtempSync(join(tmpdir(), 'vmpod-c11-'));
  confDir = join(root, 'net.d');
  bin = join(root, 'bin');
  cacheDir = join(root, 'cache');
  logFile = join(root, 'runs.log');
  for (const d of [confDir, bin]) mkdirSync(d);
  for (const name of ['fake11', 'fake11b']) {
    copyFileSync(FAKE, join(bin, name));
    chmodSync(join(bin, name), 0o755);
  }
  subnetByte = 1 + Math.floor(Math.random() * 250);
});

/** The host end of the veth fake11 makes for a pod (its script's rule). */
const hostVeth = (k: string): string => `vf${createHash('sha1').update(`${k}net11-${id}`).digest('hex').slice(0, 11)}`;

afterEach(async () => {
  for (const k of keys) await tapctl('release', '--force', k);
  // the daemon's own temp dir (its socket, state dir and log), shared by a restart's second daemon
  const daemonDir = daemon?.dir;
  await daemon?.stop();
  daemon = undefined;
  if (daemonDir !== undefined) rmSync(daemonDir, { recursive: true, force: true });
  const left = (await listNetns()).filter((n) => keys.includes(n));
  for (const n of left) await delNetns(n);
  const links = await listLinks();
  const veths = keys.map(hostVeth).filter((v) => links.includes(v));
  keys.length = 0;
  rmSync(root, { recursive: true, force: true });
  expect(left).toEqual([]);
  expect(veths).toEqual([]);
});

describe('STATUS', () => {
  it("gates adds, readiness and the metric on the plugins' answers; releases still run", async () => {
    conflist();
    answer('fake11b', { STATUS: { code: 50, msg: 'no uplink on eth9' } });
    daemon = await startDaemon({
      confDir,
      binDirs: [bin],
      cacheDir,
      extraArgs: ['--cni-status-interval', '300', '--http-listen', '127.0.0.1:0', '--check-interval', '0'],
    });
    const port = daemon.lines().find((l) => l.msg === 'HTTP listening: /healthz /readyz /metrics')?.port as number;
    await until('not ready', async () => (await tapctl('status', '--ready')).exitCode === 1);
    const ready = await tapctl('status', '--ready');
    expect(ready.stdout).toMatch(
      /^not ready: CNI plugin fake11b of network net11-\w+ answers STATUS with error 50 \(cannot take adds\): no uplink on eth9$/,
    );
    const readyz = await fetch(`http://127.0.0.1:${port}/readyz`);
    expect(readyz.status).toBe(503);
    expect(await readyz.text()).toContain('fake11b');
    const metrics = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    expect(metrics).toMatch(new RegExp(`vmpod_cni_status\\{network="net11-${id}",plugin="fake11"\\} 0`));
    expect(metrics).toMatch(new RegExp(`vmpod_cni_status\\{network="net11-${id}",plugin="fake11b"\\} 50`));

    const refused = key();
    const r = await add(refused);
    expect(r.exitCode).toBe(1);
    expect(r.stderr).toMatch(
      /add refused: CNI plugin fake11b of network net11-\w+ answers STATUS with error 50 \(cannot take adds\): no uplink on eth9/,
    );
    expect(begins('ADD')).toEqual([]);
    expect(await listNetns()).not.toContain(refused);

    // the plugin recovers: ready again, adds run
    answer('fake11b', {});
    await until('ready', async () => (await tapctl('status', '--ready')).exitCode === 0);
    const k = key();
    await addOk(k);
    // degraded (51) while the pod lives: not ready, yet its release runs
    answer('fake11', { STATUS: { code: 51, msg: 'half the uplinks are down' } });
    await until('not ready again', async () =>
      (await tapctl('status', '--ready')).stdout.includes(
        'error 51 (cannot take adds, and existing attachments may be degraded): half the uplinks are down',
      ),
    );
    expect((await tapctl('list', '--json')).stdout).toContain(k);
    expect((await tapctl('release', k)).exitCode).toBe(0);
    expect(begins('DEL').map((l) => l.env.CNI_CONTAINERID)).toEqual([k, k]);
  });

  it('kills a STATUS that hangs at the per-plugin timeout and counts it as 50', async () => {
    conflist();
    answer('fake11', { STATUS: 'hang' });
    daemon = await startDaemon({
      confDir,
      binDirs: [bin],
      cacheDir,
      extraArgs: ['--cni-timeout', '500', '--cni-status-interval', '60000', '--check-interval', '0'],
    });
    await until('not ready', async () => (await tapctl('status', '--ready')).exitCode === 1);
    expect((await tapctl('status', '--ready')).stdout).toMatch(
      /CNI plugin fake11 of network net11-\w+ answers STATUS with error 50 \(cannot take adds\): plugin fake11 STATUS timed out after 500 ms/,
    );
    for (const l of begins('STATUS')) expect(() => process.kill(l.pid, 0)).toThrow();
  });

  it('never asks a conflist below 1.1.0', async () => {
    conflist({}, 'one', '1.0.0');
    answer('fake11', { STATUS: { code: 50, msg: 'must not be asked' } });
    daemon = await startDaemon({
      confDir,
      binDirs: [bin],
      cacheDir,
      extraArgs: ['--cni-status-interval', '100', '--cni-gc', 'plugins', '--check-interval', '0'],
    });
    const k = key();
    await addOk(k);
    await delay(300);
    expect((await tapctl('status', '--ready')).exitCode).toBe(0);
    const gc = await tapctl('gc');
    expect(JSON.parse(gc.stdout)).toMatchObject({ removed: [], pluginsAsked: [], errors: [] });
    expect((await tapctl('release', k)).exitCode).toBe(0);
    expect(begins('STATUS')).toEqual([]);
    expect(begins('GC')).toEqual([]);
  });
});

describe('GC', () => {
  it('after a restart, DELs a stale cached attachment with its cached config, and GCs the plugins with the live pods under both keys', async () => {
    conflist();
    daemon = await startDaemon({ confDir, binDirs: [bin], cacheDir, extraArgs: ['--check-interval', '0'] });
    const live = key();
    const lost = key();
    const orphan = key();
    await addOk(live);
    await addOk(lost);
    await addOk(orphan);
    const reuse = { socket: daemon.socket, stateDir: daemon.stateDir, cacheDir: daemon.cacheDir, dir: daemon.dir };
    expect(await daemon.stop()).toBe(0);
    // the record of one pod is lost (its netns too): only the CNI cache remembers its attachment
    unlinkSync(join(reuse.stateDir, `${lost}.json`));
    await delNetns(lost);
    // another lost its record only: its netns is a pod network still (recover re-attaches it), not stale
    unlinkSync(join(reuse.stateDir, `${orphan}.json`));
    conflist({}, 'two');
    rmSync(logFile, { force: true });
    answer('fake11', { GC: { code: 100, msg: 'cannot list the allocations' } });
    daemon = await startDaemon({
      confDir,
      binDirs: [bin],
      reuse,
      extraArgs: ['--cni-gc', 'plugins', '--check-interval', '0'],
    });
    await until('the GC after the restore', () => daemon!.lines().some((l) => l.msg === 'CNI GC done'));
    const dels = begins('DEL');
    expect(dels.map((l) => `${l.type} ${l.env.CNI_CONTAINERID} ${l.env.CNI_IFNAME}`)).toEqual([
      `fake11b ${lost} virtlet-eth0`,
      `fake11 ${lost} virtlet-eth0`,
    ]);
    expect(dels[0]!.stdin).toMatchObject({
      marker: 'one',
      prevResult: { ips: [{ address: `10.251.${subnetByte}.5/24` }] },
    });
    const valid = [
      { containerID: live, ifname: 'virtlet-eth0' },
      { containerID: orphan, ifname: 'virtlet-eth0' },
    ];
    const gcs = begins('GC');
    expect(gcs.map((l) => l.type)).toEqual(['fake11', 'fake11b']);
    for (const g of gcs)
      expect(g.stdin).toMatchObject({
        marker: 'two',
        'cni.dev/valid-attachments': valid,
        'cni.dev/attachments': valid,
      });
    expect(
      daemon
        .lines()
        .some((l) => l.msg === 'CNI GC: a part failed' && String(l.error).includes('cannot list the allocations')),
    ).toBe(true);
    expect(existsSync(join(cacheDir, 'results', `net11-${id}-${lost}-virtlet-eth0`))).toBe(false);
    expect(existsSync(join(cacheDir, 'results', `net11-${id}-${live}-virtlet-eth0`))).toBe(true);
    expect(existsSync(join(cacheDir, 'results', `net11-${id}-${orphan}-virtlet-eth0`))).toBe(true);
    // its release (by convention: CNI DEL with the cached config, the netns removed) frees it
    expect((await tapctl('release', orphan)).exitCode).toBe(0);
    expect(existsSync(join(cacheDir, 'results', `net11-${id}-${orphan}-virtlet-eth0`))).toBe(false);
  });

  it('sends no plugin GC without --cni-gc plugins, and nothing at all with disableGC', async () => {
    conflist();
    daemon = await startDaemon({
      confDir,
      binDirs: [bin],
      cacheDir,
      extraArgs: ['--cni-gc-interval', '0', '--check-interval', '0'],
    });
    const k = key();
    await addOk(k);
    // another runtime's attachment in a shared cache dir (ifName eth0) and one of ours whose pod is gone
    const results = join(cacheDir, 'results');
    const record = JSON.parse(readFileSync(join(results, `net11-${id}-${k}-virtlet-eth0`), 'utf8')) as Record<
      string,
      unknown
    >;
    writeFileSync(
      join(results, `net11-${id}-ctrd1-eth0`),
      JSON.stringify({ ...record, containerId: 'ctrd1', ifName: 'eth0' }),
    );
    writeFileSync(
      join(results, `net11-${id}-gone1-virtlet-eth0`),
      JSON.stringify({ ...record, containerId: 'gone1', netns: '/var/run/netns/gone1' }),
    );
    conflist({ disableGC: true });
    let r = await tapctl('gc');
    expect(JSON.parse(r.stdout)).toEqual({
      network: `net11-${id}`,
      disabled: true,
      removed: [],
      pluginsAsked: [],
      errors: [],
    });
    conflist();
    r = await tapctl('gc');
    expect(r.exitCode).toBe(0);
    expect(JSON.parse(r.stdout)).toEqual({
      network: `net11-${id}`,
      removed: [{ containerId: 'gone1', ifName: 'virtlet-eth0' }],
      pluginsAsked: [],
      errors: [],
    });
    expect(begins('GC')).toEqual([]);
    expect(begins('DEL').map((l) => l.env.CNI_CONTAINERID)).toEqual(['gone1', 'gone1']);
    expect(existsSync(join(results, `net11-${id}-ctrd1-eth0`))).toBe(true);
  });

  it('never runs beside an add: it waits for the adds running, and the adds after it wait for it', async () => {
    conflist();
    answer('fake11', { ADD: 'slow' });
    daemon = await startDaemon({
      confDir,
      binDirs: [bin],
      cacheDir,
      extraArgs: ['--cni-gc', 'plugins', '--cni-gc-interval', '0', '--check-interval', '0'],
    });
    const first = [key(), key()];
    const later = [key(), key()];
    const adds1 = first.map(add);
    await until('the first adds to start', () => begins('ADD').length >= 2);
    // the GC asked while they run (each one's first plugin takes a second), the second wave a little later
    const gc = tapctl('gc');
    await delay(400);
    const adds2 = later.map(add);
    for (const r of await Promise.all([...adds1, gc, ...adds2])) expect(r.exitCode, r.stderr).toBe(0);
    // walk the plugins' log: an add is open from its first plugin's begin to its last plugin's end
    const open = new Set<string>();
    const order: string[] = [];
    let gcOpen = false;
    for (const l of runs()) {
      const who = l.env.CNI_CONTAINERID;
      if (l.verb === 'ADD' && l.phase === 'begin' && l.type === 'fake11') {
        expect(gcOpen, `ADD of ${who} began during a GC`).toBe(false);
        open.add(who!);
        order.push(`add ${who}`);
      }
      if (l.verb === 'ADD' && l.phase === 'end' && l.type === 'fake11b') open.delete(who!);
      if (l.verb === 'GC' && l.phase === 'begin' && l.type === 'fake11') {
        expect([...open], 'adds open when the GC began').toEqual([]);
        gcOpen = true;
        order.push('gc');
      }
      if (l.verb === 'GC' && l.phase === 'end' && l.type === 'fake11b') gcOpen = false;
    }
    // the GC came between the two waves: after both first adds, before both later ones
    expect(order.indexOf('gc')).toBe(2);
    expect(order.slice(0, 2).sort()).toEqual(first.map((k) => `add ${k}`).sort());
    for (const k of [...first, ...later]) expect((await tapctl('release', k)).exitCode).toBe(0);
  });
});
