// Small file-system helpers shared by the stores (state records, the CNI cache, plugin process-group records), and the
// close of an fd on a pool thread.
import { close, readdirSync } from 'node:fs';

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
 * close(fd) on one of libuv's pool threads (node:fs close), for an fd whose last close waits: a tap's and a packet
 * socket's wait for an RCU grace period, milliseconds that would stall the event loop.
 */
export const closeOffLoop = (fd: number): Promise<void> =>
  new Promise((resolve, reject) => close(fd, (e) => (e ? reject(e) : resolve())));
