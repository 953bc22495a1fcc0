// The pair end to end: a pod network from tapmanager, then qemu started THROUGH vmwrapper (node dist/bundle/vmwrapper.cjs
// with qemu's argv minus the network; vmwrapper fetches the tap fd, appends -netdev/-device and execve's qemu in place).
// Shared by test/e2e/vm-pair.test.ts, test/e2e/libvirt-vmwrapper.test.ts and bench/vm-start-pair.mjs (which bundles
// this file with esbuild, so it imports no vitest).
import { spawn } from 'node:child_process';
import { existsSync, readFileSync, readdirSync, readlinkSync, rmSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { ErrorCode, VmpodError } from '../../src/errors.js';
import { base64ToMac } from '../../src/protocol/mac.js';
import { readPgidRecords } from '../../src/cni/index.js';
import type { ContainerSideNetwork, PodNetworkDesc } from '../../src/protocol/payloads.js';
import { BIN, removeDir, type Daemon } from './daemon.js';
import type { FdClient } from '../../src/client/fdclient.js';
import type { CniTestNet, Leftovers as CniLeftovers } from './cniconf.js';
import {
  GUEST_CMDLINE,
  LEASE6_LINE_RE,
  LEASE_LINE_RE,
  QEMU_BINARY,
  parseLease6Line,
  parseLeaseLine,
  qemuAccelArgs,
  waitForSerialLine,
  type GuestImages,
  type GuestLease,
  type GuestLease6,
} from './guest.js';
import { listNetns, run } from './netns.js';

/** The DNS config the e2e pods carry (Kubernetes' ClusterFirst shape): it must reach the guest over DHCP. */
export const POD_DNS = { nameservers: ['10.96.0.10'], search: ['default.svc.cluster.local'] } as const;

/** A unique pod: key (also the netns name, <= 15 bytes) and pod name (the guest's DHCP hostname). */
export function newPod(prefix = 'vmpe2e'): { key: string; desc: PodNetworkDesc } {
  const r = randomBytes(3).toString('hex');
  const key = `${prefix}-${r}`;
  return {
    key,
    desc: {
      podId: `${key}-id`,
      podNs: 'default',
      podName: `vm-e2e-${r}`,
      DNS: { nameservers: [...POD_DNS.nameservers], search: [...POD_DNS.search] },
    },
  };
}

/** What the guest must receive, read from tapmanager's add reply (Virtlet's ContainerSideNetwork). */
export interface PodAddress {
  ip: string;
  prefixLen: number;
  gateway: string | undefined;
  /** the VM's MAC: interface 0's HardwareAddr (base64 on the wire) as colon-hex */
  mac: string;
  mtu: number;
}

export function podAddress(csn: ContainerSideNetwork): PodAddress {
  const nif = csn.Interfaces[0];
  const ipc = csn.Result?.ips?.find((i) => i.version === '4');
  if (nif === undefined || ipc === undefined) {
    throw new VmpodError(ErrorCode.Protocol, `add reply has no interface or no IPv4 address: ${JSON.stringify(csn)}`);
  }
  const [ip, len] = ipc.address.split('/');
  return {
    ip: ip as string,
    prefixLen: Number(len),
    gateway: ipc.gateway,
    mac: base64ToMac(nif.HardwareAddr),
    mtu: nif.MTU,
  };
}

/** The IPv6 address of a dual-stack or IPv6-only pod, from the add reply (what the guest must get by DHCPv6). */
export interface PodAddress6 {
  ip: string;
  prefixLen: number;
  gateway: string | undefined;
}

export function podAddress6(csn: ContainerSideNetwork): PodAddress6 {
  const ipc = csn.Result?.ips?.find((i) => i.version === '6');
  if (ipc === undefined)
    throw new VmpodError(ErrorCode.Protocol, `add reply has no IPv6 address: ${JSON.stringify(csn)}`);
  const [ip, len] = ipc.address.split('/');
  return { ip: ip as string, prefixLen: Number(len), gateway: ipc.gateway };
}

/** qemu's argv as libvirt would give it for a direct-kernel-boot VM, minus the network (vmwrapper appends it). */
export function qemuArgsWithoutNet(guest: GuestImages, serialLog: string, memoryMiB = 256): string[] {
  return [
    ...qemuAccelArgs(),
    '-m',
    String(memoryMiB),
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
  ];
}

/** The lease lines bootPairVm waits for: VMPOD-LEASE (the default), VMPOD-LEASE6 (an IPv6-only pod), or both. */
export type LeaseWait = 'ipv4' | 'ipv6' | 'dual';

export interface PairVmBase {
  /** PID spawned for vmwrapper, which is qemu's after the execve. */
  pid: number;
  serialLog: string;
  /** From spawning vmwrapper to the init's first line (VMPOD-BOOT) and to the (last) lease line waited for. */
  startToBootMs: number;
  startToLeaseMs: number;
  /** vmwrapper's log line and then qemu's stderr. */
  output(): string;
  alive(): boolean;
  /** SIGTERM (qemu quits on it), SIGKILL after 10 s; resolves when the process is gone. Idempotent. */
  stop(): Promise<void>;
}

/** A booted VM with the leases its LeaseWait asked for. */
export type PairVmOf<W extends LeaseWait> = PairVmBase &
  (W extends 'ipv6'
    ? { lease6: GuestLease6 }
    : W extends 'dual'
      ? { lease: GuestLease; lease6: GuestLease6 }
      : { lease: GuestLease });
export type PairVm = PairVmOf<'ipv4'>;

export interface BootPairOptions {
  socket: string;
  key: string;
  guest: GuestImages;
  /** scratch dir for the serial log */
  dir: string;
  /** serial log file name inside dir (default vm.serial.log) */
  name?: string;
  memoryMiB?: number;
  timeoutMs?: number;
  /** more qemu arguments, after the others (e.g. -smp 4) */
  qemuArgs?: string[];
  /** more environment for vmwrapper (e.g. VMPOD_NET_QUEUES) */
  env?: Record<string, string>;
}

export interface BootPairLeaseOptions<W extends LeaseWait> extends BootPairOptions {
  /** which lease lines to wait for (default 'ipv4') */
  leases?: W;
}

/**
 * Spawns `node dist/bundle/vmwrapper.cjs <qemu args>` as libvirt would run its <emulator>, with VIRTLET_EMULATOR,
 * VIRTLET_NET_KEY and VIRTLET_FD_SERVER_SOCKET_PATH, and waits for the guest's lease line(s) (o.leases, each within
 * the timeout). On a failure the process is stopped before the error (with its output and the serial tail) is thrown.
 */
export async function bootPairVm<W extends LeaseWait = 'ipv4'>(o: BootPairLeaseOptions<W>): Promise<PairVmOf<W>> {
  const serialLog = join(o.dir, o.name ?? 'vm.serial.log');
  const env = {
    PATH: process.env['PATH'] ?? '/usr/bin:/bin',
    VIRTLET_EMULATOR: QEMU_BINARY,
    VIRTLET_NET_KEY: o.key,
    VIRTLET_FD_SERVER_SOCKET_PATH: o.socket,
    ...o.env,
  };
  const t0 = performance.now();
  const child = spawn(
    process.execPath,
    [BIN.vmwrapper, ...qemuArgsWithoutNet(o.guest, serialLog, o.memoryMiB), ...(o.qemuArgs ?? [])],
    {
      stdio: ['ignore', 'pipe', 'pipe'],
      env,
    },
  );
  const pid = child.pid;
  if (pid === undefined) throw new VmpodError(ErrorCode.Internal, `spawn vmwrapper for pod ${o.key}`);
  let out = '';
  child.stdout.on('data', (d) => (out += d));
  child.stderr.on('data', (d) => (out += d));
  let exited = false;
  const gone = new AbortController();
  const exitP = new Promise<void>((resolve) => {
    child.on('exit', (code, signal) => {
      exited = true;
      gone.abort(
        new VmpodError(ErrorCode.State, `vmwrapper/qemu pid ${pid} exited (${code ?? signal}): ${out.trim()}`),
      );
      resolve();
    });
  });
  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> => {
    stopping ??= (async () => {
      if (!exited) child.kill('SIGTERM');
      const t = setTimeout(() => {
        if (!exited) child.kill('SIGKILL');
      }, 10_000);
      await exitP;
      clearTimeout(t);
    })();
    return stopping;
  };

  try {
    const timeoutMs = o.timeoutMs ?? 120_000;
    const waitOpts = { intervalMs: 10, signal: gone.signal };
    await waitForSerialLine(serialLog, /VMPOD-BOOT /, timeoutMs, waitOpts);
    const startToBootMs = performance.now() - t0;
    const wait: LeaseWait = o.leases ?? 'ipv4';
    // both lines are printed independently (init starts udhcpc6 in the background): wait for them together
    const [line4, line6] = await Promise.all([
      wait === 'ipv6' ? undefined : waitForSerialLine(serialLog, LEASE_LINE_RE, timeoutMs, waitOpts),
      wait === 'ipv4' ? undefined : waitForSerialLine(serialLog, LEASE6_LINE_RE, timeoutMs, waitOpts),
    ]);
    const startToLeaseMs = performance.now() - t0;
    const vm: PairVmBase & { lease?: GuestLease; lease6?: GuestLease6 } = {
      pid,
      serialLog,
      startToBootMs,
      startToLeaseMs,
      output: () => out,
      alive: () => !exited,
      stop,
    };
    if (line4 !== undefined) vm.lease = parseLeaseLine(line4);
    if (line6 !== undefined) vm.lease6 = parseLease6Line(line6);
    return vm as PairVmOf<W>;
  } catch (e) {
    await stop();
    throw new VmpodError(
      ErrorCode.State,
      `boot pod ${o.key} through vmwrapper; its output: ${JSON.stringify(out.trim())}`,
      { cause: e },
    );
  }
}

/** /proc/PID/exe: the program a process runs now (after an execve, the new one). */
export function processExe(pid: number): string {
  return readlinkSync(`/proc/${pid}/exe`);
}

/** /proc/PID/cmdline as argv. */
export function processArgv(pid: number): string[] {
  return readFileSync(`/proc/${pid}/cmdline`, 'latin1').split('\0').slice(0, -1);
}

/** One ICMP echo from the host netns: the CNI bridge there holds the pod subnet's gateway address. */
export async function pingFromHost(ip: string): Promise<void> {
  await run(['ping', '-c1', '-W2', ip], { timeoutMs: 5_000 });
}

/** HTTP GET from the host netns (curl bounds itself; the spawn timeout bounds curl). */
export function fetchFromHost(url: string): Promise<string> {
  return run(['curl', '-sS', '--fail', '--max-time', '5', url], { timeoutMs: 10_000 });
}

export interface PodLeftovers extends CniLeftovers {
  /** the pod's netns (named after the key) */
  netns: string[];
  /** state-dir entries naming the key */
  stateFiles: string[];
}

/** What a released pod could have left: its netns, host veths on the CNI bridge, IPAM files, CNI cache, state records. */
export async function podLeftovers(net: CniTestNet, stateDir: string, key: string): Promise<PodLeftovers> {
  const netns = (await listNetns()).filter((n) => n === key);
  const stateFiles = existsSync(stateDir) ? readdirSync(stateDir).filter((f) => f.includes(key)) : [];
  return { ...(await net.leftovers()), netns, stateFiles };
}

export const NOTHING_LEFT: PodLeftovers = { veths: [], allocations: [], cacheFiles: [], netns: [], stateFiles: [] };

/** A pair test's afterEach: the VMs still running are stopped, then the pods still held are released. */
export async function stopVmsAndRelease(
  vms: PairVmBase[],
  pods: Set<string>,
  client: () => FdClient,
  beforeRelease?: () => Promise<void>,
): Promise<void> {
  for (const vm of vms.splice(0)) await vm.stop();
  if (pods.size > 0) await beforeRelease?.();
  for (const key of pods) {
    try {
      client().release(key);
    } catch {
      // reported by the test's own assertions; keep cleaning up
    }
  }
  pods.clear();
}

/**
 * A pair test's afterAll: tapmanager stopped, what its state dir still holds (no pod record and no plugin record
 * may be left; the plugins dir stays, its slot file blank), then its dir, the CNI network and the scratch dir removed. The caller asserts on the exit code and what
 * was left.
 */
export async function endPairDaemon(
  d: Daemon | undefined,
  net: CniTestNet | undefined,
  dir: string | undefined,
): Promise<{ code: number | null | undefined; stateLeft: string[] }> {
  const code = await d?.stop();
  // the plugins dir and its slot file stay, with no record in any slot
  const kept = (n: string) =>
    n === 'plugins' || (n.startsWith('plugins/') && readPgidRecords(join(d!.stateDir, n)).length === 0);
  const stateLeft = d
    ? readdirSync(d.stateDir, { recursive: true })
        .map(String)
        .filter((n) => !kept(n))
    : [];
  if (d) removeDir(d.dir);
  await net?.cleanup();
  if (dir) rmSync(dir, { recursive: true, force: true });
  return { code, stateLeft };
}
