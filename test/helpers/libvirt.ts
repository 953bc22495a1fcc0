// A libvirtd for e2e tests on a machine without systemd (docs/operations.md): accounts, qemu.conf, virtlogd and
// libvirtd started by hand, shared by every test process through a small state directory, and stopped (with
// qemu.conf restored) by the last user. Daemons this harness did not start are used but never stopped.
import { constants as fsConstants, readFileSync } from 'node:fs';
import { copyFile, mkdir, readFile, readdir, rename, rm, unlink, writeFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { join } from 'node:path';
import { execa } from 'execa';
import { ErrorCode, VmpodError } from '../../src/errors.js';
import { run, runStatus } from './netns.js';
import { libvirtDomainType } from './guest.js';

export const LIBVIRT_URI = 'qemu:///system';
export const QEMU_CONF = '/etc/libvirt/qemu.conf';
const STATE_DIR = process.env['VMPOD_E2E_LIBVIRT_STATE'] ?? '/run/vmpod-e2e-libvirt';
const LIBVIRT_SOCK = '/run/libvirt/libvirt-sock';
const VIRTLOGD_SOCK = '/run/libvirt/virtlogd-sock';
const LOG_DIR = '/var/log/libvirt';
/** A cold capability cache costs libvirtd about 8 s at start (two emulator probes); leave room. */
const READY_TIMEOUT_MS = 60_000;
const LOCK_TIMEOUT_MS = 60_000;

const TEST_QEMU_CONF = `# Written by vmpod-node's e2e harness (test/helpers/libvirt.ts); the original comes back when it stops libvirtd.
# root/root + no security driver: the tests run as root and hand qemu files under /tmp and /work.
user = "root"
group = "root"
security_driver = "none"
# No private /dev per domain, so /dev/net/tun stays reachable for a plain qemu on a tap.
namespaces = [ ]
`;

interface HarnessState {
  kind: 'vmpodE2eLibvirtV1';
  /** PIDs of the daemons this harness started (any test process), to stop when the last user leaves. */
  started: { libvirtd?: number; virtlogd?: number };
  /** qemu.conf before the harness wrote it: a backup path, or null when there was none. Absent: not replaced. */
  qemuConfBackup?: string | null;
}

export interface Libvirt {
  uri: string;
  /** Whether this harness (this or another test process) started the daemons, so the last stop() ends them. */
  startedByHarness: { libvirtd: boolean; virtlogd: boolean };
  /** `virsh -c qemu:///system ARGS` -> stdout; throws with stderr. */
  virsh(args: string[], timeoutMs?: number): Promise<string>;
  /** Leaves; the last user stops what the harness started and restores qemu.conf. Idempotent. */
  stop(): Promise<void>;
}

let userSeq = 0;

/**
 * Makes sure a libvirtd answers on qemu:///system and returns a handle on it. Starts virtlogd and libvirtd (each only
 * when its socket does not answer), after creating the accounts the daemon looks up before it reads its config
 * (Debian builds the qemu driver with user libvirt-qemu and group libvirt-qemu; group kvm is the device group),
 * /var/log/libvirt, and the tests' qemu.conf.
 */
export async function startLibvirtd(opts: { timeoutMs?: number } = {}): Promise<Libvirt> {
  const userId = `${process.pid}-${++userSeq}`;
  let started: HarnessState['started'] = {};
  await withLock(async () => {
    await mkdir(join(STATE_DIR, 'users'), { recursive: true });
    await writeFile(join(STATE_DIR, 'users', userId), '');
    const state = await readState();
    if (!(await socketAnswers(LIBVIRT_SOCK)) && !isDaemonAlive(state.started.libvirtd, 'libvirtd')) {
      await ensureAccounts();
      await mkdir(LOG_DIR, { recursive: true });
      if (state.qemuConfBackup === undefined) state.qemuConfBackup = await backupQemuConf();
      await writeFileAtomic(QEMU_CONF, TEST_QEMU_CONF);
      if (!(await socketAnswers(VIRTLOGD_SOCK)) && !isDaemonAlive(state.started.virtlogd, 'virtlogd')) {
        state.started.virtlogd = await startDaemon('virtlogd', []);
        await writeState(state);
      }
      state.started.libvirtd = await startDaemon('libvirtd', [], {
        // Warnings and errors to a file: without systemd/journald the daemon's log would go nowhere.
        LIBVIRT_LOG_OUTPUTS: `3:file:${LOG_DIR}/libvirtd.log`,
      });
    }
    await writeState(state);
    started = { ...state.started };
  });

  const virsh = (args: string[], timeoutMs = 60_000): Promise<string> =>
    run(['virsh', '-c', LIBVIRT_URI, ...args], { timeoutMs, code: ErrorCode.Device });
  let stopped = false;
  const handle: Libvirt = {
    uri: LIBVIRT_URI,
    startedByHarness: { libvirtd: started.libvirtd !== undefined, virtlogd: started.virtlogd !== undefined },
    virsh,
    stop: async () => {
      if (stopped) return;
      stopped = true;
      await leave(userId);
    },
  };
  try {
    await waitReady(opts.timeoutMs ?? READY_TIMEOUT_MS);
  } catch (e) {
    await handle.stop().catch(() => undefined);
    throw e;
  }
  return handle;
}

async function leave(userId: string): Promise<void> {
  await withLock(async () => {
    await rm(join(STATE_DIR, 'users', userId), { force: true });
    if ((await liveUsers()).length > 0) return;
    const state = await readState();
    const errors: unknown[] = [];
    for (const name of ['libvirtd', 'virtlogd'] as const) {
      const pid = state.started[name];
      if (pid === undefined) continue;
      try {
        await stopDaemon(pid, name);
        delete state.started[name];
      } catch (e) {
        errors.push(e);
      }
    }
    if (state.qemuConfBackup !== undefined) {
      try {
        await restoreQemuConf(state.qemuConfBackup);
        delete state.qemuConfBackup;
      } catch (e) {
        errors.push(new VmpodError(ErrorCode.Config, `restore ${QEMU_CONF}`, { cause: e }));
      }
    }
    if (errors.length > 0) {
      await writeState(state);
      throw new AggregateError(errors, 'stop the e2e libvirtd');
    }
    await rm(join(STATE_DIR, 'state.json'), { force: true });
  });
}

async function liveUsers(): Promise<string[]> {
  const dir = join(STATE_DIR, 'users');
  const names = await readdir(dir).catch(() => [] as string[]);
  const live: string[] = [];
  for (const n of names) {
    if (pidAlive(Number(n.split('-')[0]))) live.push(n);
    else await rm(join(dir, n), { force: true }); // a test process that died without stop()
  }
  return live;
}

async function readState(): Promise<HarnessState> {
  try {
    const s = JSON.parse(await readFile(join(STATE_DIR, 'state.json'), 'utf8')) as HarnessState;
    if (s.kind !== 'vmpodE2eLibvirtV1') throw new Error(`unknown kind ${JSON.stringify(s.kind)}`);
    return s;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return { kind: 'vmpodE2eLibvirtV1', started: {} };
    throw new VmpodError(ErrorCode.State, `read ${join(STATE_DIR, 'state.json')}`, { cause: e });
  }
}

function writeState(s: HarnessState): Promise<void> {
  return writeFileAtomic(join(STATE_DIR, 'state.json'), `${JSON.stringify(s, null, 2)}\n`, 0o600);
}

async function writeFileAtomic(path: string, data: string, mode = 0o644): Promise<void> {
  const tmp = `${path}.tmp-${process.pid}`;
  await writeFile(tmp, data, { mode });
  await rename(tmp, path);
}

async function backupQemuConf(): Promise<string | null> {
  const backup = join(STATE_DIR, 'qemu.conf.orig');
  try {
    await copyFile(QEMU_CONF, backup, fsConstants.COPYFILE_FICLONE);
    return backup;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw new VmpodError(ErrorCode.Config, `back up ${QEMU_CONF}`, { cause: e });
  }
}

async function restoreQemuConf(backup: string | null): Promise<void> {
  if (backup === null) {
    await unlink(QEMU_CONF).catch((e: NodeJS.ErrnoException) => {
      if (e.code !== 'ENOENT') throw e;
    });
    return;
  }
  await copyFile(backup, `${QEMU_CONF}.tmp-${process.pid}`);
  await rename(`${QEMU_CONF}.tmp-${process.pid}`, QEMU_CONF);
  await rm(backup, { force: true });
}

async function ensureAccounts(): Promise<void> {
  for (const group of ['kvm', 'libvirt-qemu']) {
    if ((await runStatus(['getent', 'group', group])) !== 0)
      await run(['groupadd', '-r', group], { code: ErrorCode.Config });
  }
  if ((await runStatus(['id', '-u', 'libvirt-qemu'])) !== 0) {
    await run(
      [
        'useradd',
        '-r',
        '-g',
        'libvirt-qemu',
        '-G',
        'kvm',
        '-M',
        '-d',
        '/var/lib/libvirt',
        '-s',
        '/usr/sbin/nologin',
        'libvirt-qemu',
      ],
      { code: ErrorCode.Config },
    );
  }
}

/** `<daemon> -d -p <pidfile>`: the daemon forks, and its child writes the pid file. Returns that PID. */
async function startDaemon(
  name: 'libvirtd' | 'virtlogd',
  args: string[],
  env: Record<string, string> = {},
): Promise<number> {
  const pidFile = join(STATE_DIR, `${name}.pid`);
  await rm(pidFile, { force: true });
  try {
    await execa(name, ['-d', '-p', pidFile, ...args], {
      timeout: 10_000,
      stdin: 'ignore',
      env,
      // The daemonised child keeps no pipe of ours open (it redirects stdio to /dev/null), so the parent's exit ends this.
    });
  } catch (e) {
    throw new VmpodError(ErrorCode.Device, `start ${name} -d -p ${pidFile}`, { cause: e });
  }
  const deadline = Date.now() + 10_000;
  for (;;) {
    const text = await readFile(pidFile, 'utf8').catch(() => '');
    const pid = Number.parseInt(text.trim(), 10);
    if (Number.isInteger(pid) && pid > 0) return pid;
    if (Date.now() > deadline) throw new VmpodError(ErrorCode.Timeout, `${name}: no pid in ${pidFile} after 10 s`);
    await sleep(50);
  }
}

/** SIGTERM a daemon the harness started (after checking the PID still is that daemon), SIGKILL after 10 s. */
async function stopDaemon(pid: number, name: string): Promise<void> {
  if (!isDaemonAlive(pid, name)) return;
  process.kill(pid, 'SIGTERM');
  const deadline = Date.now() + 10_000;
  while (pidAlive(pid)) {
    if (Date.now() > deadline) {
      process.kill(pid, 'SIGKILL');
      await sleep(200);
      if (pidAlive(pid)) throw new VmpodError(ErrorCode.Timeout, `stop ${name} pid ${pid}: still alive after SIGKILL`);
      return;
    }
    await sleep(50);
  }
}

/** Alive and not a zombie (the daemons are re-parented to PID 1, which may reap them late). */
export function pidAlive(pid: number): boolean {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'EPERM') return false;
  }
  return procStat(pid)?.state !== 'Z';
}

function procStat(pid: number): { comm: string; state: string } | undefined {
  try {
    // /proc/PID/stat: "pid (comm) state ..." — comm may contain spaces and parentheses, so split at the last ')'.
    const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const open = s.indexOf('(');
    const close = s.lastIndexOf(')');
    return { comm: s.slice(open + 1, close), state: s.slice(close + 2, close + 3) };
  } catch {
    return undefined;
  }
}

function isDaemonAlive(pid: number | undefined, name: string): boolean {
  return pid !== undefined && pidAlive(pid) && procStat(pid)?.comm === name.slice(0, 15);
}

function socketAnswers(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const s = connect(path);
    const done = (ok: boolean): void => {
      s.destroy();
      resolve(ok);
    };
    s.once('connect', () => done(true));
    s.once('error', () => done(false));
    s.setTimeout(2_000, () => done(false));
  });
}

async function waitReady(timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (;;) {
    if (await socketAnswers(LIBVIRT_SOCK)) {
      try {
        await run(['virsh', '-c', LIBVIRT_URI, 'version'], { timeoutMs: 15_000 });
        return;
      } catch (e) {
        last = e;
      }
    }
    if (Date.now() > deadline) {
      throw new VmpodError(
        ErrorCode.Timeout,
        `libvirtd did not answer on ${LIBVIRT_URI} within ${timeoutMs} ms (see ${LOG_DIR}/libvirtd.log)`,
        {
          cause: last,
        },
      );
    }
    await sleep(100);
  }
}

/**
 * Cross-process mutex: mkdir is atomic. The owner writes its PID inside; a lock whose owner is dead is broken.
 */
async function withLock<T>(fn: () => Promise<T>): Promise<T> {
  const lock = join(STATE_DIR, 'lock');
  await mkdir(STATE_DIR, { recursive: true, mode: 0o700 });
  const deadline = Date.now() + LOCK_TIMEOUT_MS;
  for (;;) {
    try {
      await mkdir(lock);
      await writeFile(join(lock, 'owner'), String(process.pid));
      break;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw e;
      const owner = Number.parseInt(await readFile(join(lock, 'owner'), 'utf8').catch(() => ''), 10);
      // No owner file yet: the owner is between mkdir and writeFile; only break it when an owner is known dead.
      if (Number.isInteger(owner) && !pidAlive(owner)) {
        await rm(lock, { recursive: true, force: true });
        continue;
      }
      if (Date.now() > deadline)
        throw new VmpodError(ErrorCode.Timeout, `lock ${lock} held by pid ${owner} for ${LOCK_TIMEOUT_MS} ms`);
      await sleep(50);
    }
  }
  try {
    return await fn();
  } finally {
    await rm(lock, { recursive: true, force: true });
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

// ---- domain XML ---------------------------------------------------------------------------------------------------

export interface DomainXmlOptions {
  name: string;
  /** The domain's <emulator>: qemu itself, or later vmwrapper. */
  emulator: string;
  kernel: string;
  initrd: string;
  cmdline: string;
  /** Environment for the emulator, through <qemu:commandline><qemu:env/> (taints the domain 'custom-argv'). */
  env?: Record<string, string>;
  memoryMiB?: number;
  vcpus?: number;
  /** The guest's ttyS0 goes to this file (libvirt opens it and hands qemu the fd). */
  serialLog: string;
  /** 'qemu' for TCG, 'kvm' with KVM; default from detectAccel(). */
  type?: 'qemu' | 'kvm';
  /** Machine type; default 'pc' (i440fx: fewer devices to set up than q35). */
  machine?: string;
}

function esc(s: string): string {
  return s
    .replace(/&/g, '&amp;')
    .replace(/</g, '&lt;')
    .replace(/>/g, '&gt;')
    .replace(/"/g, '&quot;')
    .replace(/'/g, '&apos;');
}

/**
 * A direct-kernel-boot domain with no <interface> (the emulator wrapper brings the network), the serial console in a
 * file, and the emulator's environment in the qemu namespace (https://libvirt.org/drvqemu.html#pass-through-of-arbitrary-qemu-commands).
 */
export function domainXml(o: DomainXmlOptions): string {
  const env = Object.entries(o.env ?? {});
  for (const [k] of env) {
    if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k))
      throw new VmpodError(ErrorCode.BadRequest, `domain ${o.name}: bad env name ${JSON.stringify(k)}`);
  }
  const lines = [
    `<domain type='${o.type ?? libvirtDomainType()}' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>`,
    `  <name>${esc(o.name)}</name>`,
    `  <memory unit='MiB'>${o.memoryMiB ?? 256}</memory>`,
    `  <vcpu>${o.vcpus ?? 1}</vcpu>`,
    `  <os>`,
    `    <type arch='x86_64' machine='${esc(o.machine ?? 'pc')}'>hvm</type>`,
    `    <kernel>${esc(o.kernel)}</kernel>`,
    `    <initrd>${esc(o.initrd)}</initrd>`,
    `    <cmdline>${esc(o.cmdline)}</cmdline>`,
    `  </os>`,
    `  <features><acpi/></features>`,
    `  <on_poweroff>destroy</on_poweroff>`,
    `  <on_reboot>destroy</on_reboot>`,
    `  <on_crash>destroy</on_crash>`,
    `  <devices>`,
    `    <emulator>${esc(o.emulator)}</emulator>`,
    `    <controller type='usb' model='none'/>`,
    `    <serial type='file'><source path='${esc(o.serialLog)}'/><target port='0'/></serial>`,
    `    <console type='file'><source path='${esc(o.serialLog)}'/><target type='serial' port='0'/></console>`,
    `    <memballoon model='none'/>`,
    `  </devices>`,
  ];
  if (env.length > 0) {
    lines.push(`  <qemu:commandline>`);
    for (const [k, v] of env) lines.push(`    <qemu:env name='${esc(k)}' value='${esc(v)}'/>`);
    lines.push(`  </qemu:commandline>`);
  }
  lines.push(`</domain>`, '');
  return lines.join('\n');
}
