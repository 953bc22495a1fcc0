// Small file-system helpers shared by the stores (state records, the CNI cache, plugin process-group records).
import { existsSync, mkdirSync, readdirSync, renameSync } from 'node:fs';
import { rename } from 'node:fs/promises';
import { join } from 'node:path';

/** The names in a directory; a directory that does not exist has none. Other errors are thrown. */
export function listDir(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw e;
  }
}

export const errCode = (e: unknown): string | undefined => (e as NodeJS.ErrnoException | undefined)?.code;

/**
 * Spare files: files done with, kept in one directory (mode 0700) to be taken again under a new name, so that a store
 * writes into an inode that exists already instead of creating one, and gives it back instead of deleting it. A new
 * inode costs more than a rename: ext4 without a journal (this project's CI machine) finds one by a scan that skips
 * every inode freed in the last minutes, and freeing a file's blocks waits for the device on a filesystem mounted with
 * discard; in a burst of 250 adds, creating files was a quarter of the daemon's CPU. A spare holds whatever its last
 * user wrote: a taker writes over it from the start and cuts it to length. Renames only work within one filesystem:
 * a path on another one is never taken or given (the caller creates or deletes it as before).
 */
export class Spares {
  #free: string[] | undefined;
  #seq = 0;
  #pending = 0;

  constructor(
    readonly dir: string,
    private readonly max = 1024,
  ) {}

  /** Renames a spare to `path`; false when there is none here (or it cannot go there): the caller creates the file. */
  take(path: string): boolean {
    const free = this.#pool();
    const name = free.pop();
    if (name === undefined) return false;
    const spare = join(this.dir, name);
    try {
      renameSync(spare, path);
      return true;
    } catch (e) {
      // EXDEV, or path's dir is gone (ENOENT too): the spare stays; a spare gone from the pool's dir does not
      if (errCode(e) !== 'ENOENT' || existsSync(spare)) free.push(name);
      return false;
    }
  }

  /**
   * Moves `path` into the pool instead of deleting it, off the event loop. true when it is there now or `path` does
   * not exist; false when the pool is full or `path` is on another filesystem: the caller deletes it.
   */
  async give(path: string): Promise<boolean> {
    const free = this.#pool();
    if (free.length + this.#pending >= this.max) return false;
    const name = this.#name();
    this.#pending++;
    try {
      await rename(path, join(this.dir, name));
      free.push(name);
      return true;
    } catch (e) {
      return errCode(e) === 'ENOENT';
    } finally {
      this.#pending--;
    }
  }

  /** give, synchronously. */
  giveSync(path: string): boolean {
    const free = this.#pool();
    if (free.length + this.#pending >= this.max) return false;
    const name = this.#name();
    try {
      renameSync(path, join(this.dir, name));
      free.push(name);
      return true;
    } catch (e) {
      return errCode(e) === 'ENOENT';
    }
  }

  /** The spares on hand; the dir is made and read on first use. */
  #pool(): string[] {
    if (this.#free === undefined) {
      mkdirSync(this.dir, { recursive: true, mode: 0o700 });
      this.#free = listDir(this.dir);
      this.#seq = this.#free.reduce((m, n) => Math.max(m, Number(n) + 1 || 0), 0);
    }
    return this.#free;
  }

  #name(): string {
    return String(this.#seq++);
  }
}
