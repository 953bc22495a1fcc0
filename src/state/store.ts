// Per-pod records on disk: <dir>/<key>.json, mode 0600 in a 0700 dir. Writes are atomic: a temporary file
// in the same dir, rename over the old one (rename is atomic within one filesystem): a crashed or killed tapmanager
// leaves the old record or the new one, never half. A durable write also fsyncs the file before the rename and the
// dir after it, so that the record survives a crash of the machine; only what outlives a reboot needs that (an IPAM
// allocation, a VF's PF settings), as netns, links and taps vanish with the kernel (docs/decisions.md).
// Synchronous on purpose: records are small, and a record must be written before the step it announces runs.
import { closeSync, fsyncSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, chmodSync, writeSync, constants } from 'node:fs';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { ErrorCode, VmpodError } from '../errors.js';
import { listDir } from '../files.js';
import { validateKey } from '../identity.js';
import { parseRecord, type PodRecord } from './record.js';

const SUFFIX = '.json';
/** temporary files start with "." so keys() never sees them ("." is not a valid first key char for a record name we write) */
const TMP_PREFIX = '.tmp-';

function errno(e: unknown): string | undefined {
  return (e as NodeJS.ErrnoException | undefined)?.code;
}

export class StateStore {
  private dirReady = false;

  constructor(readonly dir: string) {}

  pathOf(key: string): string {
    validateKey(key);
    return join(this.dir, key + SUFFIX);
  }

  /** The record, undefined when there is none; a corrupt record throws VmpodError(State). */
  read(key: string): PodRecord | undefined {
    const path = this.pathOf(key);
    let text: string;
    try {
      text = readFileSync(path, 'utf8');
    } catch (e) {
      if (errno(e) === 'ENOENT') return undefined;
      throw new VmpodError(ErrorCode.State, `read state record ${path}`, { cause: e, key, op: 'state-read' });
    }
    return parseRecord(text, key, path);
  }

  /** Temp file (0600) + rename; durable: + fsync of the file before the rename and of the dir after it. */
  write(rec: PodRecord, durable = true): void {
    const path = this.pathOf(rec.key);
    this.ensureDir();
    const tmp = join(this.dir, `${TMP_PREFIX}${rec.key}-${process.pid}-${randomBytes(4).toString('hex')}`);
    // one line (jq reads it): indented, a record is 70 % larger, and a restart reads every record before it serves
    const data = Buffer.from(JSON.stringify(rec) + '\n');
    try {
      const fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL, 0o600);
      try {
        let off = 0;
        while (off < data.length) off += writeSync(fd, data, off, data.length - off);
        if (durable) fsyncSync(fd);
      } finally {
        closeSync(fd);
      }
      renameSync(tmp, path);
      if (durable) this.fsyncDir();
    } catch (e) {
      rmSync(tmp, { force: true });
      throw new VmpodError(ErrorCode.State, `write state record ${path}`, { cause: e, key: rec.key, op: 'state-write' });
    }
  }

  /** Removes the record; a missing one is fine. durable: + fsync of the dir. */
  remove(key: string, durable = true): void {
    const path = this.pathOf(key);
    try {
      rmSync(path, { force: true });
      if (durable) this.fsyncDir();
    } catch (e) {
      throw new VmpodError(ErrorCode.State, `remove state record ${path}`, { cause: e, key, op: 'state-remove' });
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
   * temporary file never holds the only copy of anything). Returns the names removed.
   */
  sweepTemps(): string[] {
    const gone = this.names().filter((n) => n.startsWith(TMP_PREFIX));
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
