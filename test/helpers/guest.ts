// The tiny e2e guest (test/guest/build.sh), the qemu accelerator to use here, and its serial-console protocol.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import { ErrorCode, VmpodError } from '../../src/errors.js';
import { normaliseIpv6 } from '../../src/net/ipv6.js';

export const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
export const GUEST_BUILD_SCRIPT = resolve(REPO_ROOT, 'test/guest/build.sh');
/** build.sh's default output directory (git-ignored through .cache/); VMPOD_GUEST_DIR overrides. */
export const GUEST_DIR = process.env['VMPOD_GUEST_DIR'] ?? resolve(REPO_ROOT, '.cache/guest');
export const QEMU_BINARY = '/usr/bin/qemu-system-x86_64';
/** Kernel command line: the init prints its VMPOD-* lines on ttyS0. */
export const GUEST_CMDLINE = 'console=ttyS0 quiet';

export interface GuestImages {
  kernel: string;
  initrd: string;
}

export const UDHCPC6_BUILD_SCRIPT = resolve(REPO_ROOT, 'test/guest/udhcpc6.sh');
/** udhcpc6.sh's output directory (git-ignored); VMPOD_UDHCPC6_DIR overrides (build.sh honours it too). */
export const UDHCPC6_DIR = process.env['VMPOD_UDHCPC6_DIR'] ?? resolve(REPO_ROOT, '.cache/udhcpc6');
// a cold build compiles busybox: minutes on a busy 2-core machine
export const UDHCPC6_BUILD_TIMEOUT_MS = 900_000;

// A cold build downloads the kernel package (about 27 MB) and takes 4 to 10 s; leave room for a slow mirror. The
// first build on a machine also compiles the busybox with udhcpc6 (test/guest/udhcpc6.sh, minutes).
const BUILD_TIMEOUT_MS = 300_000 + UDHCPC6_BUILD_TIMEOUT_MS;
/** How long a test's beforeAll gives ensureGuest (a cold build, udhcpc6 included, with a little room). */
export const GUEST_BUILD_TIMEOUT_MS = BUILD_TIMEOUT_MS + 30_000;

let guestPromise: Promise<GuestImages> | undefined;

/**
 * Builds the guest once per process (memoised promise). Across processes (vitest runs files in parallel forks)
 * build.sh serialises itself with flock(1) on OUTDIR/.lock, so the second caller waits and then finds the stamp;
 * the kernel releases a flock when its holder dies, which a mkdir lock would not.
 */
export function ensureGuest(): Promise<GuestImages> {
  guestPromise ??= buildGuest().catch((e: unknown) => {
    guestPromise = undefined; // let a later call retry
    throw e;
  });
  return guestPromise;
}

async function buildGuest(): Promise<GuestImages> {
  let stdout: string;
  try {
    ({ stdout } = await execa('bash', [GUEST_BUILD_SCRIPT, GUEST_DIR], { timeout: BUILD_TIMEOUT_MS, stdin: 'ignore' }));
  } catch (e) {
    const stderr = (e as { stderr?: unknown }).stderr;
    throw new VmpodError(
      ErrorCode.Internal,
      `build test guest into ${GUEST_DIR}${typeof stderr === 'string' && stderr ? `: ${stderr.trim().split('\n').slice(-5).join(' | ')}` : ''}`,
      { cause: e, op: 'build-guest' },
    );
  }
  const lines = stdout.trim().split('\n');
  const kernel = lines.find((l) => l.endsWith('/vmlinuz'));
  const initrd = lines.find((l) => l.endsWith('/initrd.gz'));
  if (kernel === undefined || initrd === undefined || !existsSync(kernel) || !existsSync(initrd)) {
    throw new VmpodError(ErrorCode.Internal, `build test guest: unexpected output ${JSON.stringify(stdout)}`, {
      op: 'build-guest',
    });
  }
  return { kernel, initrd };
}

/**
 * A static busybox with udhcpc6 (test/guest/udhcpc6.sh: Debian's busybox packages leave udhcpc6 out), built once
 * per machine; returns its path. Serialised across processes by the script's flock.
 */
export async function ensureUdhcpc6(): Promise<string> {
  try {
    const { stdout } = await execa('bash', [UDHCPC6_BUILD_SCRIPT, UDHCPC6_DIR], {
      timeout: UDHCPC6_BUILD_TIMEOUT_MS,
      stdin: 'ignore',
    });
    const path = stdout.trim().split('\n').pop() ?? '';
    if (!existsSync(path)) throw new Error(`unexpected output ${JSON.stringify(stdout)}`);
    return path;
  } catch (e) {
    const stderr = (e as { stderr?: unknown }).stderr;
    throw new VmpodError(
      ErrorCode.Internal,
      `build busybox udhcpc6 into ${UDHCPC6_DIR}${typeof stderr === 'string' && stderr ? `: ${stderr.trim().split('\n').slice(-5).join(' | ')}` : ''}`,
      {
        cause: e,
        op: 'build-udhcpc6',
      },
    );
  }
}

export const Accel = { Kvm: 'kvm', Tcg: 'tcg' } as const;
export type Accel = (typeof Accel)[keyof typeof Accel];

let accelCache: Accel | undefined;

/**
 * The accelerator for e2e VMs: VMPOD_E2E_ACCEL (kvm|tcg) if set; else tcg when the host's KVM is the nested PVM
 * backend (/sys/module/kvm_pvm: no vmx/svm, `-cpu host` aborts with "failed to set MSR 0x10a" and a stock guest hits
 * emulation failures), when /dev/kvm is missing, or when a 5 s probe (`-cpu host`, paused, quit at once) fails.
 */
export function detectAccel(): Accel {
  if (accelCache !== undefined) return accelCache;
  const forced = process.env['VMPOD_E2E_ACCEL'];
  if (forced !== undefined && forced !== '') {
    if (forced !== Accel.Kvm && forced !== Accel.Tcg) {
      throw new VmpodError(ErrorCode.Config, `VMPOD_E2E_ACCEL=${JSON.stringify(forced)}: expected "kvm" or "tcg"`);
    }
    accelCache = forced;
  } else if (existsSync('/sys/module/kvm_pvm') || !existsSync('/dev/kvm')) {
    accelCache = Accel.Tcg;
  } else {
    accelCache = probeKvm() ? Accel.Kvm : Accel.Tcg;
  }
  return accelCache;
}

function probeKvm(): boolean {
  const r = spawnSync(
    QEMU_BINARY,
    ['-accel', 'kvm', '-machine', 'q35', '-cpu', 'host', '-nodefaults', '-display', 'none', '-S', '-monitor', 'stdio'],
    { input: 'quit\n', timeout: 5_000, stdio: ['pipe', 'ignore', 'ignore'] },
  );
  return r.status === 0;
}

/** `-accel kvm` or `-accel tcg` (see detectAccel). */
export function qemuAccelArgs(): string[] {
  return ['-accel', detectAccel()];
}

/** libvirt's <domain type>: 'kvm' with KVM, 'qemu' for TCG. */
export function libvirtDomainType(): 'kvm' | 'qemu' {
  return detectAccel() === Accel.Kvm ? 'kvm' : 'qemu';
}

export interface WaitOptions {
  /** Poll period; default 25 ms. */
  intervalMs?: number;
  /** Stops the wait early (e.g. when qemu exits), with the signal's reason as the cause. */
  signal?: AbortSignal;
}

/**
 * Polls a serial log file (qemu `-serial file:` or libvirt's <serial type='file'>) until a line matches `re`
 * and returns that line. A missing file counts as empty. Throws a Timeout VmpodError with the log's tail.
 */
export async function waitForSerialLine(
  file: string,
  re: RegExp,
  timeoutMs: number,
  opts: WaitOptions = {},
): Promise<string> {
  const interval = opts.intervalMs ?? 25;
  const deadline = Date.now() + timeoutMs;
  let text = '';
  for (;;) {
    text = await readFile(file, 'latin1').catch((e: NodeJS.ErrnoException) => {
      if (e.code === 'ENOENT') return '';
      throw new VmpodError(ErrorCode.Internal, `read serial log ${file}`, { cause: e });
    });
    // Only complete lines: a line still being written could match a prefix of the regex.
    const lines = text.split(/\r?\n/).slice(0, -1);
    const hit = lines.find((l) => re.test(l));
    if (hit !== undefined) return hit;
    if (opts.signal?.aborted) {
      throw new VmpodError(ErrorCode.State, `waiting for ${re} in ${file}: aborted; log tail: ${tail(text)}`, {
        cause: opts.signal.reason,
      });
    }
    if (Date.now() >= deadline) {
      throw new VmpodError(
        ErrorCode.Timeout,
        `no line matching ${re} in ${file} after ${timeoutMs} ms; log tail: ${tail(text)}`,
      );
    }
    await new Promise((r) => setTimeout(r, interval));
  }
}

function tail(text: string): string {
  return JSON.stringify(text.split(/\r?\n/).slice(-8).join('\n'));
}

export const LeaseEvent = { Lease: 'VMPOD-LEASE', Renew: 'VMPOD-RENEW' } as const;
export type LeaseEvent = (typeof LeaseEvent)[keyof typeof LeaseEvent];

/** The key=value fields of a VMPOD-* line (values never contain spaces; an empty value means absent; lists are
 *  comma-joined). */
function lineFields(text: string): { opt(k: string): string | undefined; list(k: string): string[] } {
  const fields = new Map<string, string>();
  for (const tok of text
    .trim()
    .split(/ +/)
    .filter((t) => t !== '')) {
    const eq = tok.indexOf('=');
    fields.set(tok.slice(0, eq), tok.slice(eq + 1));
  }
  const opt = (k: string): string | undefined => {
    const v = fields.get(k);
    return v === undefined || v === '' ? undefined : v;
  };
  return { opt, list: (k) => (opt(k) ?? '').split(',').filter((s) => s !== '') };
}

/** Matches the guest's first-lease line (printed by test/guest/udhcpc.script on "bound"); not anchored, as
 *  console output without a newline (kernel messages despite `quiet`) can precede it on the same line. */
export const LEASE_LINE_RE = /VMPOD-LEASE /;

export interface GuestLease {
  event: LeaseEvent;
  ip: string;
  prefixLen: number;
  routers: string[];
  mtu?: number;
  hostname?: string;
  dns: string[];
  mac: string;
  serverId?: string;
  leaseSeconds?: number;
  iface?: string;
}

/**
 * Parses `VMPOD-LEASE ip=10.1.2.3/24 router=10.1.2.1 mtu=1400 hostname=h dns=a,b mac=52:54:.. serverid=.. lease=3600
 * iface=eth0` (or VMPOD-RENEW). Values never contain spaces; lists are comma-joined; an empty value means absent.
 * Leading bytes before the tag (console noise on the same line) are ignored.
 */
export function parseLeaseLine(line: string): GuestLease {
  const bad = (why: string): never => {
    throw new VmpodError(ErrorCode.Protocol, `guest lease line ${JSON.stringify(line)}: ${why}`);
  };
  const m = /(VMPOD-LEASE|VMPOD-RENEW)((?: \S+=\S*)*)\s*$/.exec(line);
  if (m === null) return bad('not a VMPOD-LEASE/VMPOD-RENEW line of key=value fields');
  const { opt, list } = lineFields(m[2] ?? '');
  const num = (k: string): number | undefined => {
    const v = opt(k);
    if (v === undefined) return undefined;
    if (!/^\d+$/.test(v)) return bad(`${k}=${v} is not a number`);
    return Number(v);
  };

  const ipField = opt('ip') ?? bad('no ip=');
  const ipm = /^(\d{1,3}(?:\.\d{1,3}){3})\/(\d{1,2})$/.exec(ipField) ?? bad(`ip=${ipField} is not a.b.c.d/len`);
  const prefixLen = Number(ipm[2]);
  if (prefixLen > 32) bad(`prefix length ${prefixLen} > 32`);
  const mac = (opt('mac') ?? bad('no mac=')).toLowerCase();
  if (!/^[0-9a-f]{2}(?::[0-9a-f]{2}){5}$/.test(mac)) bad(`mac=${mac} is not a MAC address`);

  const lease: GuestLease = {
    event: m[1] as LeaseEvent,
    ip: ipm[1] as string,
    prefixLen,
    routers: list('router'),
    dns: list('dns'),
    mac,
  };
  const mtu = num('mtu');
  if (mtu !== undefined) lease.mtu = mtu;
  const hostname = opt('hostname');
  if (hostname !== undefined) lease.hostname = hostname;
  const serverId = opt('serverid');
  if (serverId !== undefined) lease.serverId = serverId;
  const leaseSeconds = num('lease');
  if (leaseSeconds !== undefined) lease.leaseSeconds = leaseSeconds;
  const iface = opt('iface');
  if (iface !== undefined) lease.iface = iface;
  return lease;
}

export const Lease6Event = { Lease: 'VMPOD-LEASE6', Renew: 'VMPOD-RENEW6' } as const;
export type Lease6Event = (typeof Lease6Event)[keyof typeof Lease6Event];

/** Matches the guest's first DHCPv6 lease line (printed by test/guest/udhcpc6.script on "bound", once the address is
 *  out of duplicate address detection); not anchored, as LEASE_LINE_RE. */
export const LEASE6_LINE_RE = /VMPOD-LEASE6 /;

export interface GuestLease6 {
  event: Lease6Event;
  /** canonical text (RFC 5952) */
  ip: string;
  prefixLen: number;
  dns: string[];
  search: string[];
  iface?: string;
}

/**
 * Parses `VMPOD-LEASE6 ip=fd12:3456:789a::5/128 dns=fd53::53 search=a.example,b.example iface=eth0` (or VMPOD-RENEW6);
 * addresses come back in canonical text whatever the guest printed.
 */
export function parseLease6Line(line: string): GuestLease6 {
  const bad = (why: string): never => {
    throw new VmpodError(ErrorCode.Protocol, `guest IPv6 lease line ${JSON.stringify(line)}: ${why}`);
  };
  const m = /(VMPOD-LEASE6|VMPOD-RENEW6)((?: \S+=\S*)*)\s*$/.exec(line);
  if (m === null) return bad('not a VMPOD-LEASE6/VMPOD-RENEW6 line of key=value fields');
  const { opt, list } = lineFields(m[2] ?? '');
  const ipField = opt('ip') ?? bad('no ip=');
  const slash = ipField.lastIndexOf('/');
  const ip = slash > 0 ? normaliseIpv6(ipField.slice(0, slash)) : undefined;
  const lenText = ipField.slice(slash + 1);
  if (ip === undefined || !/^\d{1,3}$/.test(lenText)) return bad(`ip=${ipField} is not <IPv6 address>/<len>`);
  const prefixLen = Number(lenText);
  if (prefixLen > 128) bad(`prefix length ${prefixLen} > 128`);
  const dns = list('dns').map((a) => normaliseIpv6(a) ?? bad(`dns ${a} is not an IPv6 address`));
  const lease: GuestLease6 = { event: m[1] as Lease6Event, ip, prefixLen, dns, search: list('search') };
  const iface = opt('iface');
  if (iface !== undefined) lease.iface = iface;
  return lease;
}
