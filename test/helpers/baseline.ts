// The baseline guest network WITHOUT any vmpod code: a throwaway netns with a bridge, a tap made by `ip tuntap`,
// dnsmasq serving one static lease, and qemu started inside the netns on that tap. Shared by
// test/e2e/guest-baseline.test.ts and bench/vm-start-baseline.mjs (which bundles this file with esbuild).
import { mkdtemp, rm } from 'node:fs/promises';
import { readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { execa, type ResultPromise } from 'execa';
import { ErrorCode, VmpodError } from '../../src/errors.js';
import {
  GUEST_CMDLINE,
  LEASE_LINE_RE,
  QEMU_BINARY,
  parseLeaseLine,
  qemuAccelArgs,
  waitForSerialLine,
  type GuestImages,
  type GuestLease,
} from './guest.js';
import { addNetns, delNetns, ipArgv, leftovers, run, type Leftovers } from './netns.js';

/** Teardown record: steps run in reverse, every step runs even when an earlier one fails, failures are reported together. */
export class Teardown {
  private readonly steps: Array<{ what: string; undo: () => Promise<unknown> }> = [];

  push(what: string, undo: () => Promise<unknown>): void {
    this.steps.push({ what, undo });
  }

  async run(): Promise<void> {
    const errors: unknown[] = [];
    for (let s = this.steps.pop(); s !== undefined; s = this.steps.pop()) {
      try {
        await s.undo();
      } catch (e) {
        errors.push(new VmpodError(ErrorCode.Internal, `teardown: ${s.what}`, { cause: e }));
      }
    }
    if (errors.length > 0) throw new AggregateError(errors, `teardown: ${errors.length} step(s) failed`);
  }
}

export interface BaselineNetOptions {
  /** Name prefix; each run adds 6 random hex chars: netns `<prefix><r>`, bridge `<prefix><r>b`, tap `<prefix><r>t`. */
  prefix?: string;
  mac?: string;
  hostname?: string;
  mtu?: number;
}

export interface BaselineNet {
  /** Prefix shared by every kernel object of this run (pass to leftovers()). */
  namePrefix: string;
  ns: string;
  bridge: string;
  tap: string;
  /** The bridge's address: DHCP server id, router and DNS option. */
  serverIp: string;
  guestIp: string;
  prefixLen: number;
  mac: string;
  hostname: string;
  mtu: number;
  dnsmasqPid: number;
  /** Scratch directory for pid file and serial logs; removed by teardown. */
  dir: string;
  teardown: Teardown;
}

const TEST_NET = { first: 10, second: 251 } as const; // 10.251.x.0/24, x chosen per run and checked against the host

function ipToInt(ip: string): number {
  return ip.split('.').reduce((acc, o) => acc * 256 + Number(o), 0);
}

/** Two prefixes overlap when they agree on the shorter prefix length (division keeps the math in doubles). */
function overlaps(a: string, alen: number, b: string, blen: number): boolean {
  const block = 2 ** (32 - Math.min(alen, blen));
  return Math.floor(ipToInt(a) / block) === Math.floor(ipToInt(b) / block);
}

/** A 10.251.x.0/24 that overlaps no IPv4 address or route of the host netns (the test net lives in its own netns,
 *  but an overlap would still confuse anyone reading the host's state). */
export async function pickTestSubnet(): Promise<string> {
  const [addrs, routes] = await Promise.all([
    run(['ip', '-j', '-4', 'addr', 'show'], { code: ErrorCode.Netlink }),
    run(['ip', '-j', '-4', 'route', 'show', 'table', 'all'], { code: ErrorCode.Netlink }),
  ]);
  const used: Array<[string, number]> = [];
  for (const l of JSON.parse(addrs || '[]') as Array<{ addr_info?: Array<{ local: string; prefixlen: number }> }>) {
    for (const a of l.addr_info ?? []) used.push([a.local, a.prefixlen]);
  }
  for (const r of JSON.parse(routes || '[]') as Array<{ dst: string }>) {
    if (r.dst === 'default') continue; // 0.0.0.0/0 overlaps everything and says nothing about on-link use
    const [net, len] = r.dst.split('/');
    if (net !== undefined && /^\d+\.\d+\.\d+\.\d+$/.test(net)) used.push([net, len === undefined ? 32 : Number(len)]);
  }
  for (let attempt = 0; attempt < 64; attempt++) {
    const x = randomBytes(1)[0] as number;
    const subnet = `${TEST_NET.first}.${TEST_NET.second}.${x}.0`;
    if (!used.some(([n, len]) => overlaps(subnet, 24, n, len))) return `${TEST_NET.first}.${TEST_NET.second}.${x}`;
  }
  throw new VmpodError(ErrorCode.Conflict, `no free 10.251.x.0/24 test subnet: the host uses ${JSON.stringify(used)}`);
}

/** 52:54:00 is qemu's OUI; the rest is random. */
export function randomMac(): string {
  return ['52', '54', '00', ...[...randomBytes(3)].map((b) => b.toString(16).padStart(2, '0'))].join(':');
}

/**
 * Makes netns + bridge (with the server address) + tap, and starts dnsmasq in the netns with one static lease for
 * `mac`. dnsmasq sends option 26 only to clients that ask for it (the guest asks with `-O mtu`).
 * On any failure the steps already done are undone before the error is thrown.
 */
export async function setupBaselineNet(opts: BaselineNetOptions = {}): Promise<BaselineNet> {
  const prefix = opts.prefix ?? 'vme';
  const namePrefix = prefix + randomBytes(3).toString('hex');
  if (Buffer.byteLength(namePrefix) + 1 > 15) {
    throw new VmpodError(
      ErrorCode.BadRequest,
      `baseline prefix ${JSON.stringify(prefix)} too long for 15-byte link names`,
    );
  }
  const ns = namePrefix;
  const bridge = `${namePrefix}b`;
  const tap = `${namePrefix}t`;
  const mac = opts.mac ?? randomMac();
  const hostname = opts.hostname ?? `guest-${namePrefix}`;
  const mtu = opts.mtu ?? 1400;
  const teardown = new Teardown();
  try {
    const dir = await mkdtemp(join(tmpdir(), `${namePrefix}-`));
    teardown.push(`remove ${dir}`, () => rm(dir, { recursive: true, force: true }));
    const net = await pickTestSubnet();
    const serverIp = `${net}.1`;
    const guestIp = `${net}.5`;

    await addNetns(ns);
    teardown.push(`delete netns ${ns}`, () => delNetns(ns));
    const ip = (...args: string[]) => run(ipArgv(ns, ...args), { code: ErrorCode.Netlink });
    await ip('link', 'set', 'lo', 'up');
    await ip('link', 'add', bridge, 'type', 'bridge');
    teardown.push(`delete bridge ${bridge} in ${ns}`, () => ip('link', 'del', bridge));
    await ip('addr', 'add', `${serverIp}/24`, 'dev', bridge);
    await ip('link', 'set', bridge, 'up');
    // A persistent tap owned by nobody in particular: qemu attaches to it by name (TUNSETIFF on ifname=).
    await ip('tuntap', 'add', 'mode', 'tap', 'name', tap);
    teardown.push(`delete tap ${tap} in ${ns}`, () => ip('link', 'del', tap));
    await ip('link', 'set', tap, 'master', bridge);
    await ip('link', 'set', tap, 'up');

    const pidFile = join(dir, 'dnsmasq.pid');
    const dnsmasq = execa(
      'ip',
      [
        'netns',
        'exec',
        ns,
        'dnsmasq',
        '--no-daemon',
        '--conf-file=/dev/null',
        '--port=0',
        '--log-facility=-',
        `--interface=${bridge}`,
        '--bind-interfaces',
        '--except-interface=lo',
        `--dhcp-range=${net}.5,${net}.5,255.255.255.0,1h`,
        `--dhcp-host=${mac},${guestIp},${hostname}`,
        `--dhcp-option=option:router,${serverIp}`,
        `--dhcp-option=option:dns-server,${serverIp}`,
        `--dhcp-option=option:mtu,${mtu}`,
        '--leasefile-ro',
        `--pid-file=${pidFile}`,
      ],
      { reject: false, stdin: 'ignore', buffer: true, forceKillAfterDelay: 3_000 },
    );
    const dnsmasqPid = dnsmasq.pid;
    if (dnsmasqPid === undefined) throw new VmpodError(ErrorCode.Internal, `spawn dnsmasq in ${ns}`);
    // `ip netns exec` execs dnsmasq in place, so this PID is dnsmasq's own.
    teardown.push(`stop dnsmasq pid ${dnsmasqPid}`, () => stopChild(dnsmasq));
    await waitForOutput(dnsmasq, /DHCP, IP range/, 5_000, `dnsmasq in ${ns}`);

    return {
      namePrefix,
      ns,
      bridge,
      tap,
      serverIp,
      guestIp,
      prefixLen: 24,
      mac,
      hostname,
      mtu,
      dnsmasqPid,
      dir,
      teardown,
    };
  } catch (e) {
    await teardown.run().catch(() => undefined);
    throw e;
  }
}

/** SIGTERM, then (execa's forceKillAfterDelay) SIGKILL; resolves when the child is gone. */
async function stopChild(child: ResultPromise): Promise<void> {
  if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
  await child.catch(() => undefined);
}

/** Resolves when the child's stderr or stdout has matched `re`; rejects when it exits first or after `timeoutMs`. */
function waitForOutput(child: ResultPromise, re: RegExp, timeoutMs: number, what: string): Promise<void> {
  return new Promise((resolve, reject) => {
    let seen = '';
    const onData = (b: Buffer): void => {
      seen += b.toString();
      if (re.test(seen)) done();
    };
    const timer = setTimeout(
      () =>
        fail(
          new VmpodError(ErrorCode.Timeout, `${what}: no ${re} after ${timeoutMs} ms; output ${JSON.stringify(seen)}`),
        ),
      timeoutMs,
    );
    const onExit = (): void =>
      fail(new VmpodError(ErrorCode.State, `${what} exited before ${re}: ${JSON.stringify(seen)}`));
    child.stderr?.on('data', onData);
    child.stdout?.on('data', onData);
    child.once('exit', onExit);
    function cleanup(): void {
      clearTimeout(timer);
      child.stderr?.off('data', onData);
      child.stdout?.off('data', onData);
      child.off('exit', onExit);
    }
    function done(): void {
      cleanup();
      resolve();
    }
    function fail(e: Error): void {
      cleanup();
      reject(e);
    }
  });
}

export interface BaselineVm {
  qemuPid: number;
  serialLog: string;
  lease: GuestLease;
  /** From spawning qemu to the VMPOD-LEASE line in the serial log (polled every 10 ms). */
  startToLeaseMs: number;
  /** From spawning qemu to the init's first line (VMPOD-BOOT). */
  startToBootMs: number;
  stop(): Promise<void>;
}

/**
 * Starts qemu inside the netns on the hand-made tap (`ip netns exec NS qemu ... -netdev tap,ifname=TAP`), waits for
 * the guest's lease line and parses it. qemu's stop is registered on net.teardown too.
 */
export async function bootBaselineVm(
  net: BaselineNet,
  guest: GuestImages,
  opts: { memoryMiB?: number; timeoutMs?: number; name?: string } = {},
): Promise<BaselineVm> {
  const serialLog = join(net.dir, `${opts.name ?? 'vm'}.serial.log`);
  const argv = [
    'netns',
    'exec',
    net.ns,
    QEMU_BINARY,
    ...qemuAccelArgs(),
    '-m',
    String(opts.memoryMiB ?? 256),
    '-nodefaults',
    '-no-user-config',
    '-display',
    'none',
    '-serial',
    `file:${serialLog}`,
    '-kernel',
    guest.kernel,
    '-initrd',
    guest.initrd,
    '-append',
    GUEST_CMDLINE,
    '-netdev',
    `tap,id=n0,ifname=${net.tap},script=no,downscript=no`,
    '-device',
    `virtio-net-pci,netdev=n0,mac=${net.mac}`,
  ];
  const t0 = performance.now();
  const qemu = execa('ip', argv, { reject: false, stdin: 'ignore', buffer: true, forceKillAfterDelay: 3_000 });
  const qemuPid = qemu.pid;
  if (qemuPid === undefined) throw new VmpodError(ErrorCode.Internal, `spawn qemu in ${net.ns}`);
  let stopped = false;
  const stop = async (): Promise<void> => {
    if (stopped) return;
    stopped = true;
    await stopChild(qemu);
  };
  net.teardown.push(`stop qemu pid ${qemuPid}`, stop);

  const exited = new AbortController();
  void qemu.then((r) =>
    exited.abort(new VmpodError(ErrorCode.State, `qemu exited (${r.exitCode ?? r.signal}): ${r.stderr}`)),
  );
  const timeoutMs = opts.timeoutMs ?? 30_000;
  const waitOpts = { intervalMs: 10, signal: exited.signal };
  await waitForSerialLine(serialLog, /VMPOD-BOOT /, timeoutMs, waitOpts);
  const startToBootMs = performance.now() - t0;
  const line = await waitForSerialLine(serialLog, LEASE_LINE_RE, timeoutMs, waitOpts);
  const startToLeaseMs = performance.now() - t0;
  return { qemuPid, serialLog, lease: parseLeaseLine(line), startToLeaseMs, startToBootMs, stop };
}

/** One ICMP echo from inside the netns (the guest is on the netns' bridge: no traffic leaves it). */
export async function pingFromNetns(ns: string, ip: string): Promise<void> {
  await run(['ip', 'netns', 'exec', ns, 'ping', '-c1', '-W2', ip], { timeoutMs: 5_000 });
}

/** HTTP GET from inside the netns with busybox wget (1.35's `wget -T` segfaults: the spawn timeout bounds it). */
/** HTTP GET from a netns. The guest's httpd may start a moment after its lease line: a refused connection is tried again (5 tries, 1 s apart). */
export async function fetchFromNetns(ns: string, url: string): Promise<string> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await run(['ip', 'netns', 'exec', ns, 'busybox', 'wget', '-qO-', url], { timeoutMs: 10_000 });
    } catch (e) {
      if (attempt >= 5 || !/Connection refused/.test(String((e as Error & { cause?: unknown }).cause ?? e))) throw e;
      await new Promise((r) => setTimeout(r, 1000));
    }
  }
}

/** The pids of the processes whose command line holds `text` (a script's interpreter names the script there). */
export function processesNaming(text: string): string[] {
  return readdirSync('/proc')
    .filter((d) => /^\d+$/.test(d))
    .filter((d) => {
      try {
        return readFileSync(`/proc/${d}/cmdline`, 'utf8').includes(text);
      } catch {
        return false;
      }
    });
}

export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** What is left of a run: its kernel objects in the host netns, and whether its processes still live. */
export async function baselineLeftovers(net: BaselineNet, pids: number[]): Promise<Leftovers & { pids: number[] }> {
  return { ...(await leftovers(net.namePrefix)), pids: pids.filter(processAlive) };
}
