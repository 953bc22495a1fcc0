// The plugins' process-group records (PID records): which plugin groups run, so that a daemon started after a kill -9
// finds the plugins its predecessor left running and kills them (killOrphanPlugins), with /proc read to tell a group
// from a later one that reuses its number.
import {
  closeSync,
  constants,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  rmdirSync,
  rmSync,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import { constants as osConstants } from 'node:os';
import { ErrorCode, VmpodError } from '../errors.js';
import { listDir } from '../files.js';
import { native } from '../native.js';

/** What a PID record holds: enough to tell the plugin's group from a later one that reuses the number. */
export interface PgidRecord {
  pgid: number;
  plugin: string;
  verb: string;
  containerId: string;
  /**
   * /proc/<pid>/stat starttime (clock ticks since boot) of the group leader, or a lower bound of it taken just
   * before its spawn: the group's processes started no earlier
   */
  startTicks: number;
  /** the daemon that ran it: a plugin whose parent is still this live daemon is not an orphan */
  daemonPid?: number;
}

/** Fields of /proc/<pid>/stat we use; undefined when the process is gone. */
function procStat(pid: number): { ppid: number; pgrp: number; session: number; startTicks: number } | undefined {
  let text: string;
  try {
    text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  } catch {
    return undefined;
  }
  // "pid (comm) state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime cutime
  // cstime priority nice num_threads itrealvalue starttime ...": comm may hold spaces and parens
  const f = text.slice(text.lastIndexOf(')') + 2).split(' ');
  return { ppid: Number(f[1]), pgrp: Number(f[2]), session: Number(f[3]), startTicks: Number(f[19]) };
}

/**
 * Now, in /proc/<pid>/stat's starttime unit (USER_HZ ticks, 100 a second, since boot), rounded down: taken just before
 * a spawn, it is at most the child's starttime (the monotonic clock never runs ahead of the boot-time clock that
 * starttime counts), without reading /proc, which costs the event loop a fraction of a millisecond per plugin.
 */
export function ticksSinceBoot(): number {
  return Number(process.hrtime.bigint() / 10_000_000n);
}

/** Pids of the processes in process group `pgid` started no earlier than `sinceTicks`. */
function groupMembers(pgid: number, sinceTicks: number): number[] {
  const out: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    const st = procStat(Number(name));
    if (st && st.pgrp === pgid && st.startTicks >= sinceTicks) out.push(Number(name));
  }
  return out;
}

/**
 * Daemon start: SIGKILL every plugin process group recorded in `pgidDir` that still has members (plugins a
 * killed daemon left running: they would otherwise go on changing a pod network nobody tracks), and remove the
 * files. A pgid reused by an unrelated later process is told apart by its start time. Returns what was killed.
 */
export function killOrphanPlugins(pgidDir: string): (PgidRecord & { pids: number[] })[] {
  const killed: (PgidRecord & { pids: number[] })[] = [];
  for (const name of listDir(pgidDir)) {
    const path = join(pgidDir, name);
    let othersLive = false;
    for (const rec of readPgidRecords(path)) {
      const leader = procStat(rec.pgid);
      // a plugin of a daemon that is still alive (another tapmanager on this state dir) is not ours to kill
      if (leader && rec.daemonPid !== undefined && leader.ppid === rec.daemonPid && rec.daemonPid !== process.pid) {
        othersLive = true;
        continue;
      }
      if (rec.pgid === process.pid) continue;
      const pids = groupMembers(rec.pgid, rec.startTicks);
      if (pids.length > 0) {
        killGroup(rec.pgid, 'SIGKILL');
        killed.push({ ...rec, pids });
      }
    }
    if (!othersLive) rmSync(path, { force: true });
  }
  return killed;
}

/** The records in a slot file, slot by slot; blank, torn or foreign slots hold nothing to kill by. */
export function readPgidRecords(path: string): PgidRecord[] {
  let buf: Buffer;
  try {
    buf = readFileSync(path);
  } catch {
    return [];
  }
  const out: PgidRecord[] = [];
  for (let off = 0; off < buf.length; off += SLOT_BYTES) {
    const rec = parseSlot(buf.subarray(off, off + SLOT_BYTES).toString('utf8'));
    if (rec) out.push(rec);
  }
  return out;
}

function parseSlot(text: string): PgidRecord | undefined {
  try {
    const v = JSON.parse(text) as PgidRecord;
    if (Number.isSafeInteger(v.pgid) && v.pgid > 1 && Number.isSafeInteger(v.startTicks)) return v;
  } catch {
    // blank, torn or foreign
  }
  return undefined;
}

/** A slot's size: a record is written over the whole of it, padded with spaces (JSON ignores them). */
const SLOT_BYTES = 512;
const BLANK = Buffer.alloc(SLOT_BYTES, 0x20);

/**
 * The PID records of the running plugins: one file per daemon, `<dir>/<daemon pid>`, with a slot of SLOT_BYTES per
 * plugin running at once, written when a plugin starts and blanked when its run ends, so that it holds the running
 * plugins' records only. Slots in one file, not a file per run: creating an inode right after many were freed is slow
 * on some filesystems (docs/performance.md), and a plugin runs per add and per release. The writes are synchronous:
 * opening an existing file and writing 512 bytes costs less than a hop to the pool. Bookkeeping only: a slot that
 * cannot be written leaves the run unrecorded.
 */
export class PgidSlots {
  #slots = 0;
  readonly #free: number[] = [];
  readonly #path: string;

  constructor(readonly dir: string) {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    this.#path = join(dir, String(process.pid));
  }

  /** Writes the record into a free slot (a new one when none is free); the slot, or undefined when it could not. */
  put(rec: PgidRecord): number | undefined {
    let text = JSON.stringify(rec);
    // only pgid, startTicks and daemonPid tell the group: the names give way to a record that would not fit
    if (Buffer.byteLength(text) >= SLOT_BYTES) text = JSON.stringify({ ...rec, plugin: '', containerId: '' });
    const buf = Buffer.from(BLANK);
    buf.write(text);
    const slot = this.#free.pop() ?? this.#slots++;
    if (this.#write(slot, buf)) return slot;
    this.#free.push(slot);
    return undefined;
  }

  /**
   * Blanks the slot and frees it (a record left behind names a group whose members are gone, or are told apart by start
   * time).
   */
  clear(slot: number): void {
    this.#write(slot, BLANK);
    this.#free.push(slot);
  }

  /**
   * Daemon stop: with no plugin running, the file goes, and the dir when no other daemon's file is in it, so that a
   * stopped daemon leaves nothing of its own in the state dir. A plugin still running keeps them (the next start's
   * killOrphanPlugins ends it and removes the file).
   */
  close(): void {
    if (this.#free.length < this.#slots) return;
    try {
      rmSync(this.#path, { force: true });
      rmdirSync(this.dir);
    } catch {
      // another daemon's file in it (ENOTEMPTY), or gone already: the next start sweeps what is left
    }
  }

  #write(slot: number, buf: Buffer): boolean {
    try {
      const fd = openSync(this.#path, constants.O_WRONLY | constants.O_CREAT, 0o600);
      try {
        writeSync(fd, buf, 0, SLOT_BYTES, slot * SLOT_BYTES);
      } finally {
        closeSync(fd);
      }
      return true;
    } catch {
      return false;
    }
  }
}

/** kill(2) on a whole process group; ESRCH (already gone) is the expected case and ignored. */
export function killGroup(pgid: number | undefined, sig: NodeJS.Signals): void {
  if (pgid === undefined || pgid <= 1) return;
  const err = native().killGroup(pgid, osConstants.signals[sig]);
  if (err !== 0 && err !== osConstants.errno.ESRCH)
    throw new VmpodError(ErrorCode.Syscall, `kill process group ${pgid} with ${sig}: errno ${err}`);
}
