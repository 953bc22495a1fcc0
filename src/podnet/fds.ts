// The fds a pod hands to its VM (get): one per interface, opened through the addon (a tap must be opened inside
// the pod netns: openTap on the calling thread, openTapAsync on a pool thread), closed through it.
import { close, openSync } from 'node:fs';
import { ErrorCode, VmpodError } from '../errors.js';
import type { Logger } from '../log.js';
import { native } from '../native.js';
import type { PodInterface } from '../state/types.js';

/**
 * One fd per interface, in interface order (get's fdIndex). A tap: opened in the pod netns. A VF: /dev/null,
 * read-only and close-on-exec (libuv opens every file with O_CLOEXEC), only so that get hands one fd per
 * interface, as Virtlet did; vmwrapper passes the VF by its PCI address and never gives that fd to qemu.
 * On a failure the fds already opened are closed.
 */
export function openFds(nsPath: string, interfaces: PodInterface[], log: Logger): number[] {
  const fds: number[] = [];
  try {
    for (const i of interfaces) {
      if (i.type === 'vf') fds.push(openNull(i));
      else {
        try {
          fds.push(native().openTap(nsPath, i.tapName, TAP_OPTS));
        } catch (e) {
          throw tapError(nsPath, i.tapName, e);
        }
      }
    }
  } catch (e) {
    closeFds(fds, log);
    throw e;
  }
  return fds;
}

/** IFF_VNET_HDR must match the persistent tap's flags (src/net/rtnl.ts); single queue */
const TAP_OPTS = { vnetHdr: true };

function tapError(nsPath: string, tapName: string, cause: unknown): VmpodError {
  return new VmpodError(ErrorCode.Syscall, `open tap ${tapName} in ${nsPath}`, { cause, op: 'open-tap' });
}

/** A VF's fd: /dev/null, read-only and close-on-exec (see openFds). */
function openNull(i: PodInterface): number {
  try {
    return openSync('/dev/null', 'r');
  } catch (e) {
    throw new VmpodError(ErrorCode.Syscall, `open /dev/null for VF ${i.cniName}`, { cause: e, op: 'open-tap' });
  }
}

/** how long a new tap may stay busy before add gives up: one plugin fork's time to exec, with room (see below) */
const NEW_TAP_BUSY_WAITS_MS = [1, 2, 4, 8, 16, 32, 64, 128];

/**
 * openFds for taps made a moment ago (add); offLoop: each tap opened on a libuv pool thread (openTapAsync), for when
 * TUNSETIFF may wait for rtnl_lock behind other pods' plugins and link changes, and the event loop should not wait with
 * it (the pool trip costs an add alone 0.2 ms). The addon makes a persistent tap on a pool thread with an fd it closes
 * at once; a CNI plugin of another pod spawned at that moment (by the event loop's thread) holds a copy of the fd
 * table until it execs (close-on-exec), and meanwhile the tap is attached and TUNSETIFF answers EBUSY. Nothing else can
 * hold a tap of a netns made for this add, so EBUSY is waited out, for up to 255 ms. On a failure the fds already
 * opened are closed.
 */
export async function openNewFds(nsPath: string, interfaces: PodInterface[], log: Logger, offLoop = false): Promise<number[]> {
  const fds: number[] = [];
  try {
    for (const i of interfaces) fds.push(i.type === 'vf' ? openNull(i) : await openNewTap(nsPath, i.tapName, log, offLoop));
  } catch (e) {
    closeFds(fds, log);
    throw e;
  }
  return fds;
}

async function openNewTap(nsPath: string, tapName: string, log: Logger, offLoop: boolean): Promise<number> {
  for (let n = 0; ; n++) {
    try {
      return offLoop ? await native().openTapAsync(nsPath, tapName, TAP_OPTS) : native().openTap(nsPath, tapName, TAP_OPTS);
    } catch (e) {
      const ms = NEW_TAP_BUSY_WAITS_MS[n];
      if (!isBusy(e) || ms === undefined) throw tapError(nsPath, tapName, e);
      log.debug({ nsPath, waitMs: ms }, 'a new tap is busy (a process forked meanwhile still holds the fd that made it): waiting');
      await new Promise((r) => setTimeout(r, ms));
    }
  }
}

/** Closes and empties `fds` (in place); a failing close is logged, the rest still closed. */
export function closeFds(fds: number[], log: Logger): void {
  for (const fd of fds.splice(0)) {
    try {
      native().close(fd);
    } catch (e) {
      log.error({ err: e, fd }, 'closing a tap fd failed');
    }
  }
}

/**
 * closeFds on the libuv pool, all at once: the last close of a tap detaches it, which waits for an RCU grace period
 * (the kernel's tun_detach: synchronize_net), some milliseconds that the event loop and the caller need not wait out
 * one by one. Empties `fds` at once; resolves when every close is over (a failure is logged).
 */
export async function closeFdsOffLoop(fds: number[], log: Logger): Promise<void> {
  await Promise.all(
    fds.splice(0).map(
      (fd) =>
        new Promise<void>((resolve) => {
          close(fd, (e) => {
            if (e) log.error({ err: e, fd }, 'closing a tap fd failed');
            resolve();
          });
        }),
    ),
  );
}

/**
 * EBUSY from TUNSETIFF (native errors carry the errno name as code), anywhere in the cause chain: a
 * single-queue tap takes one open file at a time, and a running VM holds it.
 */
export function isBusy(e: unknown): boolean {
  for (let c: unknown = e, d = 0; c instanceof Error && d < 5; c = c.cause, d++) {
    if ((c as NodeJS.ErrnoException).code === 'EBUSY') return true;
  }
  return false;
}
