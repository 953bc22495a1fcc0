// Per-pod records on disk: <dir>/<key>.json, mode 0600 in a 0700 dir. Writes are atomic: the record is written whole
// into a scratch file in the same dir, which then takes the record's name (a swap of the two names, or a rename: both
// atomic within one filesystem): a crashed or killed tapmanager leaves the old record or the new one, never half. A
// durable write also fsyncs the file before the rename and the dir after it, so that the record survives a crash of the
// machine; only what outlives a reboot needs that (an IPAM allocation, a VF's PF settings), as netns, links and taps
// vanish with the kernel (docs/decisions.md). The dir holds the records of live pods only (and their scratch files).
// Synchronous on purpose: records are small, and a record must be written before the step it announces runs (a durable
// one may finish its fsyncs on the pool while what does not outlive a reboot goes on: writeThenSync).
import {
  closeSync,
  existsSync,
  fsync,
  fsyncSync,
  ftruncateSync,
  mkdirSync,
  openSync,
  readFileSync,
  renameSync,
  rmSync,
  chmodSync,
  writeSync,
  constants,
} from 'node:fs';
import { unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { native } from '../native.js';
import { ErrorCode, VmpodError } from '../errors.js';
import { listDir } from '../files.js';
import { validateKey } from '../identity.js';
import { parseRecord, type PodRecord } from './record.js';

const SUFFIX = '.json';
/**
 * temporary files start with "." so keys() never sees them ("." is not a valid first key char for a record name we
 * write)
 */
const TMP_PREFIX = '.tmp-';

/** fsync of a file or dir on the libuv pool (opened and closed here, which costs the loop no wait). */
async function fsyncPath(path: string): Promise<void> {
  const fd = openSync(path, constants.O_RDONLY);
  try {
    await new Promise<void>((resolve, reject) => fsync(fd, (e) => (e ? reject(e) : resolve())));
  } finally {
    closeSync(fd);
  }
}

function errno(e: unknown): string | undefined {
  return (e as NodeJS.ErrnoException | undefined)?.code;
}

export class StateStore {
  private dirReady = false;
  /** renameat2 RENAME_EXCHANGE works in this dir (until it says otherwise) */
  private canSwap = true;
  /** the keys whose scratch file exists (the old record after a swap) */
  readonly #scratches = new Set<string>();

  constructor(readonly dir: string) {}

  pathOf(key: string): string {
    validateKey(key);
    return join(this.dir, key + SUFFIX);
  }

  /** The record, undefined when there is none; a corrupt record throws VmpodError(State). */
  read(key: string): PodRecord | undefined {
    const path = this.pathOf(key);
    // the usual answer of an add (no record yet) without an exception
    if (!existsSync(path)) return undefined;
    let text: string;
    try {
      text = readFileSync(path, 'utf8');
    } catch (e) {
      if (errno(e) === 'ENOENT') return undefined;
      throw new VmpodError(ErrorCode.State, `read state record ${path}`, { cause: e, key, op: 'state-read' });
    }
    return parseRecord(text, key, path);
  }

  /**
   * Atomic: the record is written whole into the key's scratch file (0600), which then takes the record's name. When
   * a record is there already the two files swap names (renameat2 RENAME_EXCHANGE): the old record becomes the next
   * write's scratch, so rewriting a record creates and frees no inode (each one costs the filesystem a journal entry;
   * a pod's add writes its record three times). Without a record, or on a filesystem that cannot swap, a rename.
   * durable: + fsync of the file before it takes the name and of the dir after.
   */
  write(rec: PodRecord, durable = true): void {
    const path = this.pathOf(rec.key);
    this.ensureDir();
    const scratch = this.scratchOf(rec.key);
    // one line (jq reads it): indented, a record is 70 % larger, and a restart reads every record before it serves
    const data = Buffer.from(`${JSON.stringify(rec)}\n`);
    try {
      // into the key's scratch when it exists (a new inode otherwise). Written over from the start and cut to length,
      // not truncated first: truncating frees the file's blocks, which the write takes again at once
      const fd = openSync(scratch, constants.O_WRONLY | constants.O_CREAT, 0o600);
      try {
        let off = 0;
        while (off < data.length) off += writeSync(fd, data, off, data.length - off, off);
        ftruncateSync(fd, data.length);
        if (durable) fsyncSync(fd);
      } finally {
        closeSync(fd);
      }
      if (this.swap(scratch, path)) this.#scratches.add(rec.key);
      else {
        renameSync(scratch, path);
        this.#scratches.delete(rec.key);
      }
      if (durable) this.fsyncDir();
    } catch (e) {
      this.#scratches.delete(rec.key);
      // best effort: on a filesystem gone read-only the scratch stays, and the write's error is the one to tell
      try {
        rmSync(scratch, { force: true });
      } catch {
        /* sweepTemps takes it at the next start */
      }
      throw new VmpodError(ErrorCode.State, `write state record ${path}`, {
        cause: e,
        key: rec.key,
        op: 'state-write',
      });
    }
  }

  /**
   * write, atomic at once and durable once the promise resolves: the fsyncs of the file and of the dir run on the
   * pool meanwhile. For a record whose durability only what comes later needs: add makes the netns meanwhile (a
   * reboot takes it anyway), and runs the CNI ADD, whose IPAM allocation outlives a reboot, only after.
   */
  writeThenSync(rec: PodRecord): Promise<void> {
    this.write(rec, false);
    const path = this.pathOf(rec.key);
    return Promise.all([fsyncPath(path), fsyncPath(this.dir)]).then(
      () => undefined,
      (e: unknown) => {
        throw new VmpodError(ErrorCode.State, `write state record ${path}: fsync`, {
          cause: e,
          key: rec.key,
          op: 'state-write',
        });
      },
    );
  }

  /** Removes the record (and its scratch file); a missing one is fine. durable: + fsync of the dir. */
  remove(key: string, durable = true): void {
    const path = this.pathOf(key);
    try {
      this.#scratches.delete(key);
      for (const p of [path, this.scratchOf(key)]) rmSync(p, { force: true });
      if (durable) this.fsyncDir();
    } catch (e) {
      throw new VmpodError(ErrorCode.State, `remove state record ${path}`, { cause: e, key, op: 'state-remove' });
    }
  }

  /**
   * remove, not durable, off the event loop: a release's last step (freeing the inodes can wait on the filesystem's
   * journal, milliseconds under a burst of releases on ext4 with discard).
   */
  async removeAsync(key: string): Promise<void> {
    const path = this.pathOf(key);
    try {
      this.#scratches.delete(key);
      // unlink, not rm: rm stats each path first (it could be a dir); these are files, and may be missing
      const gone = (p: string): Promise<void> =>
        unlink(p).catch((e: unknown) => (errno(e) === 'ENOENT' ? undefined : Promise.reject(e)));
      await Promise.all([gone(path), gone(this.scratchOf(key))]);
    } catch (e) {
      throw new VmpodError(ErrorCode.State, `remove state record ${path}`, { cause: e, key, op: 'state-remove' });
    }
  }

  /** The file a record is written into before it takes the record's name: a temporary file (sweepTemps). */
  private scratchOf(key: string): string {
    return join(this.dir, `${TMP_PREFIX}${key}`);
  }

  /** scratch and path swap names; false when there is no record yet or the filesystem cannot (then: rename). */
  private swap(scratch: string, path: string): boolean {
    if (!this.canSwap) return false;
    try {
      native().exchangePaths(scratch, path);
      return true;
    } catch (e) {
      if (errno(e) === 'ENOENT') return false;
      if (errno(e) === 'EINVAL' || errno(e) === 'ENOSYS' || errno(e) === 'EOPNOTSUPP') {
        this.canSwap = false;
        return false;
      }
      throw e;
    }
  }

  /** Keys of all records, sorted. A missing dir has none. */
  keys(): string[] {
    return this.names()
      .filter((n) => n.endsWith(SUFFIX) && !n.startsWith('.'))
      .map((n) => n.slice(0, -SUFFIX.length))
      .filter((k) => k !== '' && k !== '.' && k !== '..')
      .sort();
  }

  /**
   * Daemon start: removes the temporary files a killed writer left (a record is renamed into place whole, so a
   * temporary file never holds the only copy of anything). A record's own scratch file stays: its next write reuses
   * it, written over from the start and cut to length, and a restart with many pods does not unlink one per pod.
   * Returns the names removed.
   */
  sweepTemps(): string[] {
    const names = this.names();
    const scratches = new Set(
      names.filter((n) => n.endsWith(SUFFIX)).map((n) => TMP_PREFIX + n.slice(0, -SUFFIX.length)),
    );
    const gone = names.filter((n) => n.startsWith(TMP_PREFIX) && !scratches.has(n));
    for (const n of gone) rmSync(join(this.dir, n), { force: true });
    return gone;
  }

  /** The names in the state dir; a missing dir has none. */
  private names(): string[] {
    try {
      return listDir(this.dir);
    } catch (e) {
      throw new VmpodError(ErrorCode.State, `list state dir ${this.dir}`, { cause: e, op: 'state-list' });
    }
  }

  private ensureDir(): void {
    if (this.dirReady) return;
    try {
      mkdirSync(this.dir, { recursive: true, mode: 0o700 });
      // mkdir's mode is masked by the umask and a dir that existed keeps its mode: set it explicitly
      chmodSync(this.dir, 0o700);
    } catch (e) {
      throw new VmpodError(ErrorCode.State, `create state dir ${this.dir}`, { cause: e, op: 'state-write' });
    }
    this.dirReady = true;
  }

  private fsyncDir(): void {
    let fd: number;
    try {
      fd = openSync(this.dir, constants.O_RDONLY | constants.O_DIRECTORY);
    } catch (e) {
      if (errno(e) === 'ENOENT') return;
      throw e;
    }
    try {
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
  }
}
