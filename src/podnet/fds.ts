// The fds a pod hands to its VM (get): one per interface, opened through the addon (a tap must be opened inside
// the pod netns: openFds is the one caller of openTap), closed through it.
import { close, openSync } from 'node:fs';
import { ErrorCode, VmpodError } from '../errors.js';
import type { Logger } from '../log.js';
import { native } from '../native.js';
import type { PodInterface } from '../state/types.js';

/** How add opens the taps it made a moment ago (see openFds); restore and get open them with neither. */
export interface OpenFdsOptions {
  /** a tap made a moment ago: EBUSY is a forked process's passing hold, waited out (for up to 255 ms) */
  justMade?: boolean;
  /** on a libuv pool thread: TUNSETIFF may wait for rtnl_lock behind other pods' plugins and link changes */
  offLoop?: boolean;
}

/**
 * One fd per interface, in interface order (get's fdIndex). A tap: opened in the pod netns. A VF: /dev/null,
 * read-only and close-on-exec (libuv opens every file with O_CLOEXEC), only so that get hands one fd per
 * interface, as Virtlet did; vmwrapper passes the VF by its PCI address and never gives that fd to qemu.
 * justMade: the addon makes a persistent tap on a pool thread with an fd it closes at once; a CNI plugin of another
 * pod spawned at that moment (by the event loop's thread) holds a copy of the fd table until it execs (close-on-exec),
 * and meanwhile the tap is attached and TUNSETIFF answers EBUSY. Nothing else can hold a tap of a netns made for this
 * add, so EBUSY is waited out. On a failure the fds already opened are closed.
 */
export async function openFds(nsPath: string, interfaces: PodInterface[], log: Logger, opts: OpenFdsOptions = {}): Promise<number[]> {
  const fds: number[] = [];
  try {
    for (const i of interfaces) fds.push(i.type === 'vf' ? openNull(i) : await openTap(nsPath, i.tapName, log, opts));
  } catch (e) {
    await closeFds(fds, log);
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

/** how long a new tap may stay busy before add gives up: one plugin fork's time to exec, with room (see openFds) */
const NEW_TAP_BUSY_WAITS_MS = [1, 2, 4, 8, 16, 32, 64, 128];

/** The addon's openTap, on the calling thread or (offLoop) on a pool thread; this is its one call site. */
async function openTap(nsPath: string, tapName: string, log: Logger, opts: OpenFdsOptions): Promise<number> {
  for (let n = 0; ; n++) {
    try {
      return await native().openTap(nsPath, tapName, { ...TAP_OPTS, offLoop: opts.offLoop === true });
    } catch (e) {
      const ms = opts.justMade === true ? NEW_TAP_BUSY_WAITS_MS[n] : undefined;
      if (!isBusy(e) || ms === undefined) throw tapError(nsPath, tapName, e);
      log.debug({ nsPath, waitMs: ms }, 'a new tap is busy (a process forked meanwhile still holds the fd that made it): waiting');
      await new Promise((r) => setTimeout(r, ms));
    }
  }
}

/**
 * Closes and empties `fds` (in place, at once); a failing close is logged, the rest still closed. offLoop: all at once
 * on the libuv pool, as the last close of a tap detaches it, which waits for an RCU grace period (the kernel's
 * tun_detach: synchronize_net), which the event loop and the caller need not wait out one by one. Resolves when every
 * close is over.
 */
export async function closeFds(fds: number[], log: Logger, opts: { offLoop?: boolean } = {}): Promise<void> {
  const all = fds.splice(0);
  const failed = (e: unknown, fd: number): void => log.error({ err: e, fd }, 'closing a tap fd failed');
  if (opts.offLoop !== true) {
    for (const fd of all) {
      try {
        native().close(fd);
      } catch (e) {
        failed(e, fd);
      }
    }
    return;
  }
  await Promise.all(all.map((fd) => new Promise<void>((resolve) => close(fd, (e) => (e ? failed(e, fd) : undefined, resolve())))));
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
