// The kernel's fd table sized once for the pods a start restores. It doubles each time an fd past its end is taken,
// and in a process with threads each doubling waits for an RCU grace period in the thread that took the fd: the event
// loop, at 256, 512 and 1024 fds, when a daemon restores hundreds of pods or adds them in a burst
// (docs/performance.md, "the fd table"). The addon takes one fd at the size wanted on a pool thread and closes it.
import type { Logger } from '../log.js';
import { native } from '../native.js';

/**
 * fds a pod holds at most: its tap, its DHCP socket, the fast get's copy of the tap, the RA and DHCPv6 sockets, and
 * one more
 */
const FDS_PER_POD = 6;
/** the least the table is grown to: a node's usual pod count (kubelet's default max-pods is 110) */
const FD_TABLE_MIN = 1024;

/** The fd table's size for `pods` recorded pods (and as many added after them as a usual node runs). */
export function fdTableSize(pods: number): number {
  return Math.max(FD_TABLE_MIN, FD_TABLE_MIN / 4 + FDS_PER_POD * pods);
}

/** Grows the fd table for `pods` recorded pods, off the event loop; a failure only means it grows later, as needed. */
export function reserveFdTable(pods: number, log: Logger): void {
  const want = fdTableSize(pods);
  native()
    .reserveFds(want)
    .then(
      (size) => log.debug({ want, size }, 'fd table reserved'),
      (e: unknown) => log.debug({ err: e, want }, 'reserving the fd table failed: it grows as fds are taken'),
    );
}
