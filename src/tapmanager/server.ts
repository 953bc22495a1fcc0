// The fd server: a Unix stream socket owned by the addon and driven from the event loop (uv_poll).
// Framing is Virtlet's (docs/protocol.md); what each command does is the Handler's business.
// With fastGets the addon accepts, and answers gets of the pods given to setGetReply without entering JS
// (docs/decisions.md, "Gets of ready pods are answered in the addon"); every other connection comes here, with the
// bytes it read (adopt), and is served as below.
//
// Why not node:net: libuv reads with read(), so it could carry our requests, but replies need sendmsg with
// SCM_RIGHTS on the same socket, and mixing libuv's writes with ours is a race. One owner of the fd is simpler.
//
// Nothing here blocks and every connection ends (docs/operations.md, "Limits"):
// - replies go through a per-connection write queue of non-blocking sendmsg calls; a peer whose queue stays
//   blocked for sendStallMs is dropped; at most 2 * maxPipelined chunks wait, then nothing more is served;
// - a request must be complete within requestTimeoutMs of its first byte (an absolute deadline: drip-feeding
//   does not extend it); an idle connection is closed after as long;
// - at most maxPipelined requests wait per connection, at most maxConnections connections are served;
// - a reserve fd turns EMFILE on accept into "accept and close the newcomer" instead of a busy loop.
import { chownSync, closeSync, openSync, readFileSync, unlinkSync } from 'node:fs';
import { native, PollEvent, type DuplexPoller, type FastGetServer, type PeerCred } from '../native.js';
import { lazyChild, type Logger } from '../log.js';
import { RequestReader, encodeResponse, encodeError, type Request } from '../protocol/frames.js';
import { Command } from '../protocol/commands.js';
import { errorChain } from '../errors.js';
import { groupsFromStatus, peerAllowed as allowedByRule } from '../protocol/peer.js';

export type { Request };

/** What a connection has to answer, in order: a request, or the protocol error that ends it. */
type Pending = { req: Request } | { error: string };

export interface Reply {
  payload: Buffer | null;
  /**
   * fds to pass with SCM_RIGHTS, owned by the reply: the server closes them once they are sent or the connection
   * is gone (so a handler hands over dup's of fds it keeps, and a later release cannot close them mid-send)
   */
  fds: number[];
}

export interface Handler {
  handle(req: Request, peer: PeerCred): Promise<Reply>;
}

export const SERVER_DEFAULTS = {
  requestTimeoutMs: 10_000,
  sendStallMs: 5_000,
  maxConnections: 256,
  maxPipelined: 16,
} as const;

export interface ServerOptions {
  socketPath: string;
  handler: Handler;
  log: Logger;
  /** besides uid 0, peers whose gid is here are served */
  allowedGids?: number[];
  /** gid given to the socket file (chown), so a configured group can connect */
  socketGid?: number;
  /** a request must be complete this long after its first byte; an idle connection is closed after as long */
  requestTimeoutMs?: number;
  /** a connection whose pending reply makes no progress for this long is dropped */
  sendStallMs?: number;
  /** connections served at once; a newcomer beyond it gets an error reply and is closed */
  maxConnections?: number;
  /** requests read ahead on one connection while an earlier one runs; more is a protocol error */
  maxPipelined?: number;
  /**
   * accept in the addon, which answers gets of the keys given to setGetReply itself (docs/performance.md, get);
   * every other connection and request is served here as without it
   */
  fastGets?: boolean;
}

type Limits = Required<Pick<ServerOptions, keyof typeof SERVER_DEFAULTS>>;

const READ_CHUNK = 64 * 1024;
/** after an accept failure the reserve fd could not absorb, accepting pauses this long (no busy loop) */
const ACCEPT_BACKOFF_MS = 100;

export class FdServer {
  private listenFd = -1;
  private poller: DuplexPoller | undefined;
  private fast: FastGetServer | undefined;
  private readonly conns = new Set<Connection>();
  private stopping = false;
  private reserveFd = -1;
  private readonly limits: Limits;
  private backoff: NodeJS.Timeout | undefined;
  /** When each kind of refusal was last logged: one line per kind per second, one kind never hides another. */
  private readonly lastRefusalLog = new Map<string, number>();

  constructor(private readonly opts: ServerOptions) {
    this.limits = {
      requestTimeoutMs: opts.requestTimeoutMs ?? SERVER_DEFAULTS.requestTimeoutMs,
      sendStallMs: opts.sendStallMs ?? SERVER_DEFAULTS.sendStallMs,
      maxConnections: opts.maxConnections ?? SERVER_DEFAULTS.maxConnections,
      maxPipelined: opts.maxPipelined ?? SERVER_DEFAULTS.maxPipelined,
    };
  }

  /** Binds and listens (refusing a socket another server still listens on); accepts when this returns. */
  start(): void {
    const n = native();
    this.reserveFd = openReserve();
    this.listenFd = n.listenUnix(this.opts.socketPath, 0o660, 128);
    // the addon chmod'ed the socket 0660 before listen; give it the configured group
    if (this.opts.socketGid !== undefined) chownSync(this.opts.socketPath, 0, this.opts.socketGid);
    if (this.opts.fastGets) {
      this.fast = n.fastGetServer(
        this.listenFd,
        {
          allowedGids: this.opts.allowedGids ?? [],
          maxConnections: this.limits.maxConnections,
          idleMs: this.limits.requestTimeoutMs,
        },
        (fd, prefix, peer, held) => this.adopt(fd, prefix, peer, held),
        (err) => this.acceptFailed(err),
      );
      this.poller = this.fast;
    } else {
      this.poller = n.pollReadable(this.listenFd, (err) => this.onAcceptable(err));
    }
  }

  /**
   * With fastGets: the addon answers a get of key with this payload and dup's of these fds (taken now) until
   * forgetGetReply; the caller makes sure they stay what a get would answer. Without fastGets: nothing.
   */
  setGetReply(key: string, payload: Buffer, fds: number[]): void {
    if (!this.fast || this.stopping) return;
    const { header, data } = encodeResponse(Command.Get, key, payload, fds.length);
    this.fast.register(key, Buffer.concat([header, data]), fds);
  }

  forgetGetReply(key: string): void {
    if (!this.stopping) this.fast?.unregister(key);
  }

  /** gets the addon answered since the start (0 without fastGets): they never reach the handler */
  get fastGetsAnswered(): number {
    return this.fast?.stats().gets ?? 0;
  }

  private onAcceptable(err: Error | null): void {
    if (err) {
      this.opts.log.error({ err }, 'listening socket error');
      return;
    }
    // one accept per wake-up: the poll is level-triggered, so another pending connection wakes us again, and no
    // accept ends in EAGAIN (a drained backlog costs that syscall on every get otherwise)
    const n = native();
    let fd: number;
    try {
      fd = n.accept(this.listenFd);
    } catch (e) {
      this.acceptFailed(e);
      return;
    }
    if (fd < 0) return;
    if (this.stopping) {
      n.close(fd);
      return;
    }
    this.adopt(fd, null, null, 0);
  }

  /** A new connection (accepted here or by the addon, which may have read its first bytes and its peer). */
  private adopt(fd: number, prefix: Buffer | null, peer: PeerCred | null, held: number): void {
    if (this.stopping) {
      native().close(fd);
      return;
    }
    const served = this.conns.size + held;
    if (served >= this.limits.maxConnections) {
      this.refuseNewcomer(
        fd,
        `too many connections: ${served} are being served (--max-connections ${this.limits.maxConnections}); try again`,
      );
      return;
    }
    const conn = new Connection(fd, this.opts, this.limits, (c) => this.forget(c), prefix, peer);
    if (conn.open) this.conns.add(conn);
    this.fast?.setJsConnections(this.conns.size);
  }

  private forget(c: Connection): void {
    this.conns.delete(c);
    this.fast?.setJsConnections(this.conns.size);
  }

  /**
   * EMFILE/ENFILE: the pending connection stays in the backlog and the listening socket stays readable, so
   * a plain retry spins. Give the reserve fd back, take the newcomer and close it (its client sees EOF), then
   * take the reserve again. Whatever else fails pauses accepting briefly.
   */
  private acceptFailed(e: unknown): void {
    const n = native();
    const code = (e as { code?: string }).code;
    if ((code === 'EMFILE' || code === 'ENFILE') && this.reserveFd >= 0) {
      closeSync(this.reserveFd);
      this.reserveFd = -1;
      try {
        const fd = n.accept(this.listenFd);
        if (fd >= 0) n.close(fd);
      } catch {
        /* reported below */
      }
      try {
        this.reserveFd = openReserve();
      } catch {
        /* retried after the pause */
      }
      this.logRefusal({ err: e }, 'out of file descriptors: a new connection was closed unserved');
      if (this.reserveFd >= 0) return;
    } else {
      this.opts.log.error({ err: e }, 'accept failed');
    }
    this.pauseAccepting();
  }

  private pauseAccepting(): void {
    if (this.backoff || this.stopping) return;
    this.poller?.want(false, false);
    this.backoff = setTimeout(() => {
      this.backoff = undefined;
      if (this.stopping) return;
      if (this.reserveFd < 0) {
        try {
          this.reserveFd = openReserve();
        } catch {
          /* still out of fds: accept absorbs nothing, the next failure pauses again */
        }
      }
      this.poller?.want(true, false);
    }, ACCEPT_BACKOFF_MS);
  }

  private refuseNewcomer(fd: number, text: string): void {
    const n = native();
    try {
      n.trySendMsg(fd, encodeError(text), []); // best effort, never waits
    } catch {
      /* gone already */
    }
    n.close(fd);
    this.logRefusal(
      { connections: this.conns.size, max: this.limits.maxConnections },
      'connection limit reached: a new connection was refused',
    );
  }

  /** At most one line a second for each kind of refusal (they come in floods). */
  private logRefusal(fields: object, msg: string): void {
    const now = Date.now();
    if (now - (this.lastRefusalLog.get(msg) ?? -Infinity) < 1000) return;
    this.lastRefusalLog.set(msg, now);
    this.opts.log.warn(fields, msg);
  }

  /** Stops listening, lets running requests finish (their replies are sent) and closes every connection. */
  async stop(): Promise<void> {
    if (this.stopping) return;
    this.stopping = true;
    this.poller?.stop();
    if (this.backoff) clearTimeout(this.backoff);
    if (this.listenFd >= 0) {
      native().close(this.listenFd);
      this.listenFd = -1;
      try {
        unlinkSync(this.opts.socketPath);
      } catch {
        /* already gone */
      }
    }
    if (this.reserveFd >= 0) closeSync(this.reserveFd);
    this.reserveFd = -1;
    await Promise.all([...this.conns].map((c) => c.finish()));
  }

  /** True between start() and stop(): the listening socket is open. */
  get listening(): boolean {
    return this.listenFd >= 0 && !this.stopping;
  }

  get connectionCount(): number {
    return this.conns.size;
  }
}

function openReserve(): number {
  return openSync('/dev/null', 'r');
}

/**
 * The peer rule (protocol/peer.ts), its supplementary groups read from /proc only when its credentials do not decide.
 */
export function peerAllowed(peer: PeerCred, allowedGids: number[]): boolean {
  return allowedByRule(peer, allowedGids, () => {
    try {
      return groupsFromStatus(readFileSync(`/proc/${peer.pid}/status`, 'utf8'));
    } catch {
      return []; // the peer is gone
    }
  });
}

/** One sendmsg's worth of a reply: bytes, and the fds that go with the first of them (owned until sent). */
interface OutChunk {
  data: Buffer;
  fds: number[];
}

function closeAll(fds: number[]): void {
  for (const fd of fds) {
    try {
      native().close(fd);
    } catch {
      /* already closed */
    }
  }
}

class Connection {
  private readonly reader = new RequestReader();
  private readonly poller: DuplexPoller;
  private peer: PeerCred = { pid: 0, uid: -1, gid: -1 };
  private queue: Pending[] = [];
  private busy: Promise<void> | undefined;
  private readonly out: OutChunk[] = [];
  /** closes the connection once the write queue is empty (after an error reply) */
  private endAfterFlush = false;
  /** a request's absolute deadline, from its first byte */
  private frameTimer: NodeJS.Timeout | undefined;
  /** nothing to do and nothing coming: the connection is closed when this fires */
  private idleTimer: NodeJS.Timeout | undefined;
  /** the write queue has been blocked (socket full) since this timer was armed */
  private stallTimer: NodeJS.Timeout | undefined;
  private closed = false;
  private readonly closedP: Promise<void>;
  private resolveClosed!: () => void;
  /** no more reading: EOF, a protocol error, a stop */
  private eof = false;
  /** a peer without the right to be served: it gets the reason, its first request is dropped, then it is closed */
  private refused = false;
  /** the connection's logger, made at its first line (most write none); the server's until the peer is known */
  private log: Logger;

  constructor(
    private readonly fd: number,
    private readonly opts: ServerOptions,
    private readonly limits: Limits,
    private readonly onClose: (c: Connection) => void,
    /** bytes the addon read before handing the connection over */
    prefix: Buffer | null = null,
    /** the peer, when the addon read it already */
    peer: PeerCred | null = null,
  ) {
    const n = native();
    this.log = opts.log;
    this.closedP = new Promise((r) => (this.resolveClosed = r));
    this.poller = n.pollReadable(fd, (err, events) => this.onEvent(err, events));
    try {
      this.peer = peer ?? n.peerCred(fd);
      this.log = lazyChild(opts.log, { peerPid: this.peer.pid, peerUid: this.peer.uid });
    } catch (e) {
      this.sendErrorAndEnd(`cannot read peer credentials: ${errorChain(e)}`);
      return;
    }
    if (!peerAllowed(this.peer, opts.allowedGids ?? [])) {
      this.log.warn('refused a peer that is neither uid 0 nor in the socket group');
      // say why, then serve nothing: the connection closes once its first request is in (closing before it would make
      // the peer's write fail with EPIPE before it reads the reason), at a bad frame, or at the request timeout
      this.refused = true;
      this.enqueueError(`permission denied: uid ${this.peer.uid} gid ${this.peer.gid} may not use this socket`);
      this.flush();
      this.armIdle();
      if (prefix) this.take(prefix);
      return;
    }
    this.armIdle();
    if (prefix) {
      // the bytes the addon read, then whatever else came with them, queued before the first is served (the
      // pipelining bound counts them as one read would have)
      if (this.take(prefix)) this.readAll();
      else this.afterRead();
    }
  }

  get open(): boolean {
    return !this.closed;
  }

  // ------------------------------------------------------------ timers

  private armIdle(): void {
    if (this.idleTimer || this.closed) return;
    this.idleTimer = setTimeout(() => {
      this.idleTimer = undefined;
      this.close();
    }, this.limits.requestTimeoutMs);
    this.idleTimer.unref();
  }

  private clearIdle(): void {
    if (this.idleTimer) clearTimeout(this.idleTimer);
    this.idleTimer = undefined;
  }

  /** Starts the deadline of the request whose first byte just arrived; a running deadline is never extended. */
  private trackFrame(): void {
    if (this.eof || !this.reader.midFrame()) {
      if (this.frameTimer) clearTimeout(this.frameTimer);
      this.frameTimer = undefined;
      return;
    }
    if (this.frameTimer) return;
    const ms = this.limits.requestTimeoutMs;
    this.frameTimer = setTimeout(() => {
      this.frameTimer = undefined;
      const got = this.reader.pending();
      this.log.warn({ bytes: got }, 'incomplete request timed out');
      this.stopReading();
      this.queue.push({
        error: `incomplete request: got ${got} bytes, no complete request within ${ms} ms of its first byte`,
      });
      this.pump();
    }, ms);
    this.frameTimer.unref();
  }

  private armStall(): void {
    if (this.stallTimer) clearTimeout(this.stallTimer);
    this.stallTimer = setTimeout(() => {
      this.stallTimer = undefined;
      this.log.warn(
        { pendingBytes: this.out.reduce((s, c) => s + c.data.length, 0), stallMs: this.limits.sendStallMs },
        'dropping a connection whose peer does not read its reply',
      );
      this.close();
    }, this.limits.sendStallMs);
    this.stallTimer.unref();
  }

  // ------------------------------------------------------------ reading

  private onEvent(err: Error | null, events: number): void {
    if (this.closed) return;
    if (err) {
      this.log.warn({ err }, 'connection error');
      this.close();
      return;
    }
    if (events & PollEvent.Writable) this.flush();
    if (!this.closed && !this.eof && events & (PollEvent.Readable | PollEvent.Disconnect)) this.readAll();
  }

  private readAll(): void {
    const n = native();
    for (;;) {
      let chunk: Buffer | null;
      try {
        chunk = n.read(this.fd, READ_CHUNK);
      } catch (e) {
        this.log.warn({ err: e }, 'read failed');
        this.close();
        return;
      }
      if (chunk === null) break;
      if (chunk.length === 0) {
        this.stopReading();
        break;
      }
      // a short read took all there was: the level-triggered poll wakes us for more (or for EOF), so no read
      // ends in EAGAIN here
      if (!this.take(chunk) || chunk.length < READ_CHUNK) break;
    }
    this.afterRead();
  }

  /** One chunk of the peer's bytes into the request queue; false when reading stops (a bad request, a flood). */
  private take(chunk: Buffer): boolean {
    if (this.refused) return this.takeRefused(chunk);
    this.clearIdle();
    const reqs = this.reader.push(chunk);
    this.queue.push(...reqs.map((req) => ({ req })));
    const bad = this.reader.error;
    if (bad) {
      this.log.warn({ err: bad }, 'bad request');
      // requests completed before the bad bytes still get their answers, then the error, then the close
      this.queue.push({ error: errorChain(bad) });
      this.stopReading();
      return false;
    }
    if (this.queue.length > this.limits.maxPipelined) {
      this.log.warn({ queued: this.queue.length }, 'too many pipelined requests');
      this.queue.splice(this.limits.maxPipelined);
      this.queue.push({
        error: `more than ${this.limits.maxPipelined} requests pipelined on one connection; wait for the replies`,
      });
      this.stopReading();
      return false;
    }
    return true;
  }

  /**
   * A refused peer's bytes: parsed only to find where its first request ends (at most one frame, MAX_PAYLOAD, is
   * read), then the connection closes once the reason is out. Its idle timer stands: dripping does not extend it.
   */
  private takeRefused(chunk: Buffer): boolean {
    if (this.reader.push(chunk).length === 0 && this.reader.error === null) return true;
    this.endAfterFlush = true;
    this.stopReading();
    this.flush();
    return false;
  }

  private afterRead(): void {
    if (this.refused) {
      // nothing is served; the idle timer armed at refusal stands, a hang-up ends it sooner
      if (this.eof && this.out.length === 0) this.close();
      return;
    }
    this.trackFrame();
    this.pump();
  }

  private stopReading(): void {
    this.eof = true;
    if (this.frameTimer) clearTimeout(this.frameTimer);
    this.frameTimer = undefined;
    this.poller.want(false, this.out.length > 0);
  }

  // ------------------------------------------------------------ serving

  private pump(): void {
    if (this.busy || this.closed || this.endAfterFlush) return;
    // replies waiting for a slow reader: serve on (a get's reply holds its own fds), up to a bound
    if (this.out.length >= 2 * this.limits.maxPipelined) return;
    const next = this.queue.shift();
    if (!next) {
      if (this.eof) {
        if (this.out.length === 0) this.close();
      } else if (this.out.length === 0 && !this.reader.midFrame()) this.armIdle();
      return;
    }
    this.clearIdle();
    if ('error' in next) {
      this.queue = [];
      this.sendErrorAndEnd(next.error);
      return;
    }
    this.busy = this.serve(next.req).finally(() => {
      this.busy = undefined;
      this.flush();
    });
  }

  private async serve(req: Request): Promise<void> {
    let reply: Reply;
    try {
      reply = await this.opts.handler.handle(req, this.peer);
    } catch (e) {
      this.enqueueError(errorChain(e));
      return;
    }
    if (this.closed) {
      closeAll(reply.fds);
      return;
    }
    try {
      const { header, data } = encodeResponse(req.command, req.key, reply.payload, reply.fds.length);
      if (reply.fds.length === 0) {
        // one send: the client reads the header, then the payload, from one stream (two sends wake it twice)
        this.out.push({ data: data.length > 0 ? Buffer.concat([header, data]) : header, fds: [] });
      } else {
        // the header alone (the client reads it with a plain read, which would drop fds sent with it), then payload
        // and fds in ONE sendmsg
        this.out.push({ data: header, fds: [] }, { data, fds: reply.fds });
      }
    } catch (e) {
      closeAll(reply.fds);
      this.enqueueError(errorChain(e));
    }
  }

  // ------------------------------------------------------------ writing

  private enqueueError(text: string): void {
    if (this.closed) return;
    this.out.push({ data: encodeError(text), fds: [] });
  }

  private sendErrorAndEnd(text: string): void {
    this.enqueueError(text);
    this.endAfterFlush = true;
    this.stopReading();
    this.flush();
  }

  /** Writes what the socket takes now; the rest waits for writability. Then serves the next request. */
  private flush(): void {
    if (this.closed) return;
    const n = native();
    while (this.out.length > 0) {
      const c = this.out[0]!;
      let sent: number;
      try {
        sent = n.trySendMsg(this.fd, c.data, c.fds);
      } catch (e) {
        this.log.warn({ err: e }, 'sending the reply failed');
        this.close();
        return;
      }
      if (sent < 0) break;
      if (c.fds.length > 0) {
        closeAll(c.fds); // the peer has its own copies now
        c.fds = [];
        if (c.data.length === 0) sent = 0; // the filler byte is not ours to count
      }
      c.data = c.data.subarray(sent);
      if (c.data.length === 0) this.out.shift();
    }
    if (this.out.length > 0) {
      // an absolute bound: the queue must drain within sendStallMs of blocking, slow trickles included
      if (!this.stallTimer) this.armStall();
      this.poller.want(!this.eof, true);
    } else {
      if (this.stallTimer) clearTimeout(this.stallTimer);
      this.stallTimer = undefined;
      this.poller.want(!this.eof, false);
      if (this.endAfterFlush || (this.refused && this.eof)) {
        this.close();
        return;
      }
    }
    if (!this.refused) this.pump();
  }

  /**
   * Stop: reads nothing more, answers what is queued with an error, lets the running request finish and its reply go.
   */
  async finish(): Promise<void> {
    if (this.closed) return;
    this.stopReading();
    const dropped = this.queue.filter((p) => 'req' in p).length;
    this.queue = dropped > 0 ? [{ error: 'tapmanager is stopping: request not served' }] : [];
    this.clearIdle();
    if (!this.busy) this.flush();
    if (!this.busy && this.out.length === 0 && this.queue.length === 0) this.close();
    else this.pump();
    await this.closedP;
  }

  private close(): void {
    if (this.closed) return;
    this.closed = true;
    this.clearIdle();
    for (const t of [this.frameTimer, this.stallTimer]) if (t) clearTimeout(t);
    this.frameTimer = this.stallTimer = undefined;
    this.poller.stop();
    for (const c of this.out.splice(0)) closeAll(c.fds);
    try {
      native().close(this.fd);
    } catch {
      /* already closed */
    }
    this.onClose(this);
    this.resolveClosed();
  }
}
