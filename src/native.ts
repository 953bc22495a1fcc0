// Typed loader of the C N-API addon (native/*.c): the only place that makes raw syscalls.
// Every function is one synchronous call unless its type says Promise or it takes a callback.
//
// Errors: every error the addon throws, or rejects a promise with, has `code`, the errno name ("ENOENT", "EBUSY"),
// and `errno`, its positive number (2, 16), so callers match `err.code === 'ENOENT'`, never the message. The message
// names the operation and the object, e.g. "TUNSETIFF tap0 in /var/run/netns/x: EBUSY (Device or resource busy)".
// Bad arguments (a wrong type, a name too long, a relative path) throw a TypeError with code EINVAL at once, also from
// the functions that return a promise; a failure inside N-API itself is EINVAL (a value of the wrong kind) or ENOMEM.
// A poller's callback gets libuv's errors the same way (code "EBADF", errno 9).
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export interface PeerCred {
  pid: number;
  uid: number;
  gid: number;
}

export interface RecvMsgResult {
  /** bytes received; length 0 means EOF */
  data: Buffer;
  /** fds received with SCM_RIGHTS, already close-on-exec (MSG_CMSG_CLOEXEC) */
  fds: number[];
  /** MSG_CTRUNC was set: the control buffer was too small and the kernel dropped fds */
  ctrunc: boolean;
}

export interface RecvFromResult {
  data: Buffer;
  address: string;
  port: number;
  /** index of the interface the datagram arrived on (IP_PKTINFO) */
  ifindex: number;
}

export interface RecvFrameResult {
  /** the whole Ethernet frame */
  data: Buffer;
  /**
   * PACKET_AUXDATA's TP_STATUS_CSUMNOTREADY: the sender left the transport checksum to be filled in (CHECKSUM_PARTIAL,
   * as a virtio-net guest with checksum offload sends): the packet is correct, its checksum field is only a seed.
   */
  csumNotReady: boolean;
}

export interface Poller {
  /** stop watching; idempotent. Does not close the fd. */
  stop(): void;
}

/** The poller pollReadable returns: it can watch writability too. */
export interface DuplexPoller extends Poller {
  /** change what is watched: readable (with hang-up) and/or writable; both false pauses. No-op once stopped. */
  want(readable: boolean, writable: boolean): void;
}

/**
 * The fd server's accept loop in the addon (fastGetServer): gets of registered keys are answered without entering
 * JS; every other connection is handed to JS. want() pauses or resumes accepting.
 */
export interface FastGetServer extends DuplexPoller {
  /** reply: the get's 77-byte response header then its payload; the fds are dup'ed and kept until unregister */
  register(key: string, reply: Buffer, fds: number[]): void;
  unregister(key: string): void;
  /** connections JS serves now (the limit counts both) */
  setJsConnections(n: number): void;
  /** gets answered by the addon since the start, connections it holds now */
  stats(): { gets: number; connections: number };
}

/** A connection the addon hands to JS: the bytes it read already, its peer (null: not read) and how many it holds. */
export type AdoptFn = (fd: number, prefix: Buffer | null, peer: PeerCred | null, held: number) => void;

/** Bits of the second argument of a poller's callback. */
export const PollEvent = { Readable: 1, Writable: 2, Disconnect: 4 } as const;

/** The first argument of spawnChild's callback. */
export const ChildEvent = { Overflow: 1, Done: 2 } as const;

/** How a child of spawnChild ended: exactly one of code and signal is a number. */
export interface ChildResult {
  code: number | null;
  /** the signal number that killed it */
  signal: number | null;
  stdout: Buffer;
  stderr: Buffer;
}

export interface TapOptions {
  /** IFF_VNET_HDR */
  vnetHdr?: boolean;
  /** IFF_MULTI_QUEUE */
  multiQueue?: boolean;
  /**
   * open it on a libuv pool thread: TUNSETIFF takes rtnl_lock, which CNI plugins running at the same time contend
   * for, and the event loop need not wait for it. Without it the tap is opened before openTap returns.
   */
  offLoop?: boolean;
  /**
   * EBUSY, without opening it, when the tap has queues attached (IFLA_TUN_NUM_QUEUES, asked in the netns first): a
   * multi-queue tap would take the open as one more queue
   */
  exclusive?: boolean;
}

export interface Native {
  // ---- Unix stream sockets (daemon side: nonblocking, driven from the event loop) ----
  /**
   * socket(AF_UNIX, SOCK_STREAM|NONBLOCK|CLOEXEC), unlink a stale socket file, bind, chmod(mode), listen(backlog).
   * A socket file someone still listens on (a connect to it succeeds) is left alone: throws code EADDRINUSE.
   */
  listenUnix(path: string, mode: number, backlog: number): number;
  /** accept4(NONBLOCK|CLOEXEC); returns -1 when there is nothing to accept (EAGAIN). */
  accept(fd: number): number;
  /** SO_PEERCRED of a connected Unix socket. */
  peerCred(fd: number): PeerCred;
  /** read up to max bytes; null on EAGAIN; an empty Buffer on EOF. */
  read(fd: number, max: number): Buffer | null;
  /**
   * ONE non-blocking sendmsg(data, SCM_RIGHTS(fds)) with MSG_NOSIGNAL (one filler byte 0x00 when data is empty and
   * fds are given). Returns the bytes written (the fds went with them), or -1 when the socket is full and nothing
   * was written. Other errors (EPIPE, ECONNRESET) throw.
   */
  trySendMsg(fd: number, data: Buffer, fds: number[]): number;
  /**
   * uv_poll on fd for readability (and hangup/error); cb runs on the main loop with the events seen
   * (PollEvent bits). Keep the returned object referenced. want() adds writability.
   */
  pollReadable(fd: number, cb: (err: Error | null, events: number) => void): DuplexPoller;
  /**
   * posix_spawn(path) (vfork: the loop waits only for the exec) with argv [path], exactly `env` ("K=V"), stdio on
   * pipes, in a new session (its pgid is its pid), every signal at its default. stdin is written as the pipe
   * takes it, then closed; null holds it (open, empty) until childStdin gives it. cb(ChildEvent.Overflow) once when
   * stdout or stderr passes maxOutputBytes (the rest is dropped), then cb(ChildEvent.Done, result) once it has
   * exited and both pipes are at EOF. The child is watched with a pidfd and reaped here. Returns its pid; an exec
   * that fails throws its errno (ENOENT, EACCES, ENOEXEC, ETXTBSY).
   */
  spawnChild(
    path: string,
    env: string[],
    stdin: Uint8Array | null,
    maxOutputBytes: number,
    cb: (event: number, result?: ChildResult) => void,
  ): number;
  /**
   * The stdin of a child spawned with it held (spawnChild's stdin null): written as the pipe takes it, then closed (a
   * child that is done already gets nothing). Throws ESRCH when no child of ours with this pid waits for its stdin.
   */
  childStdin(pid: number, stdin: Uint8Array): void;
  /** kill(-pgid, signal): 0, or the errno (ESRCH: the group is gone) without an exception. pgid >= 2. */
  killGroup(pgid: number, signal: number): number;
  /**
   * open(path) and flock(LOCK_EX|LOCK_NB): the lock lives as long as the returned fd (CLOEXEC). Held elsewhere: throws
   * code EAGAIN.
   */
  lockExclusive(path: string): number;
  /** close(fd); EBADF throws. */
  close(fd: number): void;
  /**
   * renameat2(a, b, RENAME_EXCHANGE): the two names swap their files atomically. Throws ENOENT when either is
   * missing, EINVAL where the filesystem cannot.
   */
  exchangePaths(a: string, b: string): void;
  /**
   * At most n glibc malloc arenas from now on (mallopt M_ARENA_MAX, as MALLOC_ARENA_MAX=n sets at exec; 1-64): threads
   * that have an arena keep it, later ones share. tapmanager calls it first thing.
   */
  mallocArenaMax(n: number): void;
  /**
   * The kernel's fd table grown at once to hold n fds (at most the soft RLIMIT_NOFILE), on a pool thread: each growth
   * waits for an RCU grace period in the thread that takes the fd past the table's end, and the table only doubles
   * (1 - 2^24). Resolves with how many fds it holds at least (0: a limit below 4, nothing done).
   */
  reserveFds(n: number): Promise<number>;

  // ---- Unix stream sockets (client side: blocking, used by vmwrapper and tapctl) ----
  /** socket + connect (blocking, CLOEXEC). */
  connectUnix(path: string): number;
  /** write all of data (blocking, MSG_NOSIGNAL). */
  writeAll(fd: number, data: Buffer): void;
  /**
   * one recvmsg(MSG_CMSG_CLOEXEC) with a data buffer of maxData bytes and a control buffer of
   * exactly oobSize bytes (0 = none). Blocking.
   */
  recvMsg(fd: number, maxData: number, oobSize: number): RecvMsgResult;
  /** set SO_RCVTIMEO and SO_SNDTIMEO on a socket (ms, 0 = none). */
  setTimeouts(fd: number, ms: number): void;

  // ---- fds and processes ----
  /** dup with F_DUPFD_CLOEXEC at or above minFd. */
  dupCloexec(fd: number, minFd: number): number;
  /**
   * execve(path, argv, env). Before exec: fds 0..2 blocking and inheritable; every fd in keepFds inheritable;
   * every other fd >= 3 close-on-exec; SIGPIPE and SIGXFSZ back to SIG_DFL; signal mask emptied.
   * Only returns by throwing.
   */
  execve(path: string, argv: string[], env: string[], keepFds: number[]): never;
  /** The open fds >= 3 without FD_CLOEXEC, ascending (what this process inherited to pass on). */
  inheritableFds(): number[];

  // ---- named netns (the files `ip netns` makes and reads): netnsMake makes, netnsBind names, netnsAdd both ----
  /**
   * A new netns, on a libuv pool thread (unshare moves that thread only, and it goes back at once), with the sysctls
   * ("name=value", e.g. "net.ipv4.conf.all.rp_filter=0", name [a-z0-9_.-]) written inside it, mounted nowhere: resolves
   * with an fd (close-on-exec) that holds it; closing the fd lets it go. `/proc/self/fd/<fd>` names it for the calls
   * that take a netns path. A sysctl that fails rejects with its errno, the message saying `sysctl -w <setting>`, and
   * leaves nothing.
   */
  netnsMake(sysctls?: readonly string[]): Promise<number>;
  /**
   * The netns of fd (netnsMake's) bind-mounted on the new file dir/name, as `ip netns add` mounts one: dir made a
   * shared mount first (bound on itself when it is no mount point) so the netns mounts propagate. Rejects with EEXIST
   * when the name is taken; a failure leaves no file. fd stays the caller's.
   */
  netnsBind(fd: number, dir: string, name: string): Promise<void>;
  /**
   * `ip netns del`, on a libuv pool thread: detach the netns mount at path and remove the file (a path that is no
   * mount is removed too). A relative path throws TypeError at once.
   */
  netnsDel(path: string): Promise<void>;
  /**
   * rtnetlink in the netns at nsPath, on a libuv pool thread (offLoop false: on the event loop's thread, settled
   * before the call returns): the batch of requests (src/net/rtnl.ts encodeBatch: netlink messages with link names
   * to resolve to ifindexes there, persistent taps, nf_tables transactions, sysctls) runs in order; resolves with the
   * answers (decodeAnswers: per request run, errno, a dump's messages, the kernel's reason). Stops at the first
   * failure unless force. Rejects only when the netns or the socket cannot be had.
   */
  netlinkInNetns(nsPath: string, requests: Buffer, force: boolean, offLoop?: boolean): Promise<Buffer>;

  // ---- netns-bound operations (each enters the netns, does its work and returns to the caller's netns) ----
  /**
   * open /dev/net/tun inside the netns at nsPath and TUNSETIFF(name, IFF_TAP|IFF_NO_PI[|VNET_HDR][|MULTI_QUEUE]);
   * resolves with the fd (CLOEXEC). On the calling thread, or with opts.offLoop on a pool thread.
   */
  openTap(nsPath: string, name: string, opts?: TapOptions): Promise<number>;
  /**
   * openTap `count` times (1 to 256) in one visit of the netns: `count` more queues of a multi-queue tap (CLOEXEC),
   * all or none; on the calling thread, or with opts.offLoop on a pool thread.
   */
  openTapQueues(nsPath: string, name: string, count: number, opts?: TapOptions): Promise<number[]>;
  /**
   * a UDP socket created inside the netns at nsPath, NONBLOCK|CLOEXEC, SO_REUSEADDR, SO_BROADCAST, IP_PKTINFO,
   * SO_BINDTODEVICE(ifname), bound to 0.0.0.0:port.
   */
  udpSocketInNetns(nsPath: string, ifname: string, port: number): number;
  /**
   * an AF_PACKET socket (SOCK_RAW, bound with ETH_P_ALL: on a bridge port that is the only way to see received frames)
   * made inside the netns at nsPath and bound to ifname there, NONBLOCK|CLOEXEC, PACKET_IGNORE_OUTGOING, with the
   * classic BPF program `filter` (struct sock_filter[]) attached before the bind: read() gives the whole Ethernet
   * frames the link receives that the filter passes, writeAll() transmits one frame on it (on a tap: to the VM).
   * PACKET_AUXDATA is on, for recvFrame. opts.vnetHdr (PACKET_VNET_HDR): every frame read or written is preceded by a
   * struct virtio_net_hdr (10 bytes), as on a tap fd opened with vnetHdr.
   */
  packetSocketInNetns(nsPath: string, ifname: string, filter: Buffer, opts?: { vnetHdr?: boolean }): number;
  /**
   * One frame from a packetSocketInNetns socket, with whether its checksum is still to be filled in; null on EAGAIN.
   */
  recvFrame(fd: number, max: number): RecvFrameResult | null;
  /** recvfrom on a nonblocking UDP socket; null on EAGAIN. */
  recvFrom(fd: number, max: number): RecvFromResult | null;
  /** sendto(address:port) on a UDP socket. */
  sendTo(fd: number, data: Buffer, address: string, port: number): number;

  /**
   * Takes over accepting on listenFd (its own uv_poll: do not poll it elsewhere): a connection from uid 0 or a
   * primary gid of allowedGids stays in the addon while it sends complete gets of registered keys; everything else
   * goes to adopt. acceptError gets accept's errors (EMFILE...). Connections idle for idleMs are closed.
   */
  fastGetServer(
    listenFd: number,
    opts: { allowedGids: number[]; maxConnections: number; idleMs: number },
    adopt: AdoptFn,
    acceptError: (err: Error) => void,
  ): FastGetServer;

  // ---- systemd ----
  /** one datagram to a Unix datagram socket: a path, or "@name" (abstract namespace), as sd_notify sends it. */
  notifyDatagram(path: string, data: Buffer): number;
}

function addonPath(): string {
  const env = process.env.VMPOD_NATIVE_ADDON;
  if (env) return env;
  // this module's dir: __dirname in vmwrapper's CommonJS bundles, where parsing import.meta.url (a file: URL made
  // from __filename, then read back) is measurable on every VM start and probe (docs/performance.md)
  const here = typeof __dirname === 'string' ? __dirname : dirname(fileURLToPath(import.meta.url));
  // src/native.ts -> ../build, dist/native.js -> ../build, bin bundle (dist/bundle/x.js) -> ../../build
  for (const rel of ['../build/Release/vmpod_native.node', '../../build/Release/vmpod_native.node']) {
    const p = join(here, rel);
    if (existsSync(p)) return p;
  }
  throw new Error(`vmpod native addon not found near ${here}: run "npm ci" (it builds native/ with node-gyp)`);
}

let cached: Native | undefined;
/** where the addon's exports are kept for every copy of this module in the process (vmwrapper's two bundles) */
const LOADED = Symbol.for('vmpod-node.native');

/**
 * Loads the addon once per process: `process.dlopen` of its path (what require() of a .node file ends in, without
 * the module resolution and package.json reads on the way, which cost vmwrapper's every start).
 */
export function native(): Native {
  if (!cached) {
    const g = globalThis as unknown as Record<symbol, Native | undefined>;
    if (!g[LOADED]) {
      const m = { exports: {} as Native };
      process.dlopen(m, addonPath());
      g[LOADED] = m.exports;
    }
    cached = g[LOADED];
  }
  return cached;
}

/**
 * `ip netns add`: a new netns with its sysctls (netnsMake), named dir/name (netnsBind); the fd that held it meanwhile
 * is closed either way (the mount holds the netns). Rejects with the errno of the step that failed.
 */
export async function netnsAdd(dir: string, name: string, sysctls?: readonly string[]): Promise<void> {
  const n = native();
  const fd = await n.netnsMake(sysctls);
  try {
    await n.netnsBind(fd, dir, name);
  } finally {
    n.close(fd);
  }
}
