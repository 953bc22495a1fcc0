// The fds a pod hands to its VM (get): our own one per interface (openFds), and the queues a get asks for (queueFds),
// opened through the addon (a tap must be opened inside the pod netns: openTap, openTapQueues), closed through it.
import { openSync } from 'node:fs';
import { closeOffLoop } from '../files.js';
import { ErrorCode, VmpodError } from '../errors.js';
import { MAX_FDS } from '../protocol/commands.js';
import type { Logger } from '../log.js';
import { native } from '../native.js';
import type { PodInterface } from '../state/types.js';

/** How add opens the taps it made a moment ago (see openFds); restore and get open them with neither. */
export interface OpenFdsOptions {
  /** a tap made a moment ago: EBUSY is a forked process's passing hold, waited out (for up to 255 ms) */
  justMade?: boolean;
  /** on a libuv pool thread: TUNSETIFF may wait for rtnl_lock behind other pods' plugins and link changes */
  offLoop?: boolean;
  /**
   * EBUSY, without an open, for a tap that has queues attached: a running VM's (restore, recover, get's reopen); a tap
   * that is gone is ENODEV (a plain TUNSETIFF would make a new, unbridged one)
   */
  exclusive?: boolean;
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
export async function openFds(
  nsPath: string,
  interfaces: PodInterface[],
  log: Logger,
  opts: OpenFdsOptions = {},
): Promise<number[]> {
  const fds: number[] = [];
  try {
    for (const i of interfaces) fds.push(i.type === 'vf' ? openNull(i) : await openTap(nsPath, i, log, opts));
  } catch (e) {
    await closeFds(fds, log);
    throw e;
  }
  return fds;
}

/**
 * TUNSETIFF's flags for the pod's tap: IFF_VNET_HDR (the persistent tap's flags, src/podnet/plan.ts), and
 * IFF_MULTI_QUEUE when the tap was made with it (every tap since multiqueue taps; more queues attach by opening it
 * again).
 */
function tapOpts(i: PodInterface): { vnetHdr: boolean; multiQueue: boolean } {
  return { vnetHdr: true, multiQueue: i.multiQueue === true };
}

/** What queueFds needs of a pod network (PodNetworkState). */
export interface QueueSource {
  nsPath: string;
  interfaces: PodInterface[];
  /** our own fd of each interface (openFds) */
  fds: number[];
}

/**
 * The fds a get hands out, owned by the caller (the reply closes them once sent, so the VM holds the only copies
 * of the extra queues, which go when it exits): per interface in order, `queues` fds for a multi-queue tap (a dup of
 * our own fd as the first queue, then new opens of the tap, each a new queue of it), one (a dup) for a single-queue tap
 * or a VF. queueFdIndices[i]: interface i's places in the fd list.
 */
export async function queueFds(
  st: QueueSource,
  queues: number,
  log: Logger,
): Promise<{ fds: number[]; queueFdIndices: number[][] }> {
  const counts = st.interfaces.map((i) => (i.type === 'tap' && i.multiQueue === true ? queues : 1));
  const total = counts.reduce((a, b) => a + b, 0);
  if (total > MAX_FDS) {
    throw new VmpodError(
      ErrorCode.BadRequest,
      `get: ${queues} queues on each of ${counts.filter((c) => c > 1).length} taps need ${total} fds; one reply ` +
        `carries at most ${MAX_FDS}`,
      { op: 'get' },
    );
  }
  const fds: number[] = [];
  const queueFdIndices: number[][] = [];
  try {
    for (const [k, i] of st.interfaces.entries()) {
      const first = fds.length;
      fds.push(native().dupCloexec(st.fds[k]!, 3));
      if (counts[k]! > 1) fds.push(...(await openQueues(st.nsPath, i, counts[k]! - 1)));
      queueFdIndices.push(fds.slice(first).map((_, q) => first + q));
    }
  } catch (e) {
    await closeFds(fds, log);
    throw e;
  }
  return { fds, queueFdIndices };
}

/**
 * n more queues of a multi-queue tap, in one visit of the netns (E2BIG past the kernel's MAX_TAP_QUEUES), on a pool
 * thread: each attach takes rtnl_lock, which other pods' plugins and link changes hold at times, and the event loop
 * (the other gets, DHCP) need not wait for it.
 */
async function openQueues(nsPath: string, i: PodInterface, n: number): Promise<number[]> {
  try {
    return await native().openTapQueues(nsPath, i.tapName, n, { ...tapOpts(i), offLoop: true });
  } catch (e) {
    throw tapError(nsPath, i.tapName, e);
  }
}

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

/**
 * The addon's openTap, on the calling thread or (offLoop) on a pool thread; this is its one call site. The tap opens
 * with the flags it was made with (IFF_MULTI_QUEUE must match: EINVAL otherwise). A record made before multiqueue taps,
 * or rebuilt by recover, may not know them: then the other kind is tried, and the interface (in memory; the record's
 * next write keeps it) says what the tap is.
 */
async function openTap(nsPath: string, i: PodInterface, log: Logger, opts: OpenFdsOptions): Promise<number> {
  const { tapName } = i;
  let flipped = false;
  for (let n = 0; ; n++) {
    try {
      return await native().openTap(nsPath, tapName, {
        ...tapOpts(i),
        offLoop: opts.offLoop === true,
        exclusive: opts.exclusive === true,
      });
    } catch (e) {
      if (!flipped && errnoOf(e) === 'EINVAL') {
        flipped = true;
        i.multiQueue = i.multiQueue !== true;
        n--;
        continue;
      }
      if (flipped && errnoOf(e) === 'EINVAL') i.multiQueue = i.multiQueue !== true; // neither kind: as recorded
      const ms = opts.justMade === true ? NEW_TAP_BUSY_WAITS_MS[n] : undefined;
      if (!isBusy(e) || ms === undefined) throw tapError(nsPath, tapName, e);
      log.debug(
        { nsPath, waitMs: ms },
        'a new tap is busy (a process forked meanwhile still holds the fd that made it): waiting',
      );
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
  await Promise.all(all.map((fd) => closeOffLoop(fd).catch((e: unknown) => failed(e, fd))));
}

/**
 * EBUSY from TUNSETIFF (native errors carry the errno name as code), anywhere in the cause chain: a
 * single-queue tap takes one open file at a time, and a running VM holds it.
 */
export function isBusy(e: unknown): boolean {
  return errnoOf(e) === 'EBUSY';
}

/** The first errno code in the cause chain (native errors carry the errno name as code). */
function errnoOf(e: unknown): string | undefined {
  for (let c: unknown = e, d = 0; c instanceof Error && d < 5; c = c.cause, d++) {
    const code = (c as NodeJS.ErrnoException).code;
    if (typeof code === 'string' && /^E[A-Z0-9]+$/.test(code)) return code;
  }
  return undefined;
}
