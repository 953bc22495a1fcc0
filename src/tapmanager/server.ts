// The fd server: a Unix stream socket owned by the addon and driven from the event loop (uv_poll).
// Framing is Virtlet's (reference/fd-protocol.md); what each command does is the Handler's business.
//
// Why not node:net: libuv reads with read(), so it could carry our requests, but replies need sendmsg with
// SCM_RIGHTS on the same socket, and mixing libuv's writes with ours is a race. One owner of the fd is simpler.
import { chownSync, readFileSync, unlinkSync } from 'node:fs';
import { native, type PeerCred, type Poller } from '../native.js';
import type { Logger } from '../log.js';
import { RequestReader, encodeResponse, encodeError, type Request } from '../protocol/frames.js';
import { errorChain } from '../errors.js';

export type { Request };

/** What a connection has to answer, in order: a request, or the protocol error that ends it. */
type Pending = { req: Request } | { error: string };

export interface Reply {
  payload: Buffer | null;
  /** fds to pass with SCM_RIGHTS; the server does not close them (they stay with their owner) */
  fds: number[];
}

export interface Handler {
  handle(req: Request, peer: PeerCred): Promise<Reply>;
}

export interface ServerOptions {
  socketPath: string;
  handler: Handler;
  log: Logger;
  /** besides uid 0, peers whose gid is here are served */
  allowedGids?: number[];
  /** gid given to the socket file (chown), so a configured group can connect */
  socketGid?: number;
  /** a complete request must arrive within this long of the connection becoming idle (default 5000) */
  frameTimeoutMs?: number;
  /** how long a reply may wait for a full socket buffer (default 5000) */
  sendTimeoutMs?: number;
}

const READ_CHUNK = 64 * 1024;

export class FdServer {
  private listenFd = -1;
  private poller: Poller | undefined;
  private readonly conns = new Set<Connection>();
  private stopping = false;

  constructor(private readonly opts: ServerOptions) {}

  /** Binds and listens; the socket accepts connections when this returns. */
  start(): void {
    const n = native();
    this.listenFd = n.listenUnix(this.opts.socketPath, 0o660, 128);
    // the addon chmod'ed the socket 0660 before listen; give it the configured group
    if (this.opts.socketGid !== undefined) chownSync(this.opts.socketPath, 0, this.opts.socketGid);
    this.poller = n.pollReadable(this.listenFd, (err) => this.onAcceptable(err));
  }

  private onAcceptable(err: Error | null): void {
    if (err) {
      this.opts.log.error({ err }, 'listening socket error');
      return;
    }
    const n = native();
    for (;;) {
      let fd: number;
      try {
        fd = n.accept(this.listenFd);
      } catch (e) {
        // EMFILE and friends: log and try again on the next readiness
        this.opts.log.error({ err: e }, 'accept failed');
        return;
      }
      if (fd < 0) return;
      if (this.stopping) {
        n.close(fd);
        continue;
      }
      const conn = new Connection(fd, this.opts, (c) => this.conns.delete(c));
      if (conn.open) this.conns.add(conn);
    }
  }

  /** Stops listening, lets running requests finish and closes every connection. */
  async stop(): Promise<void> {
    if (this.stopping) return;
    this.stopping = true;
    this.poller?.stop();
    if (this.listenFd >= 0) {
      native().close(this.listenFd);
      this.listenFd = -1;
      try {
        unlinkSync(this.opts.socketPath);
      } catch {
        /* already gone */
      }
    }
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

/** Supplementary groups of a process, from the "Groups:" line of /proc/<pid>/status (pure). */
export function groupsFromStatus(status: string): number[] {
  const m = /^Groups:[ \t]*(.*)$/m.exec(status);
  return m ? m[1]!.trim().split(/\s+/).filter(Boolean).map(Number) : [];
}

/** uid 0, or a member of an allowed group: primary gid (SO_PEERCRED) or a supplementary one of the peer's process. */
function peerAllowed(peer: PeerCred, allowedGids: number[]): boolean {
  if (peer.uid === 0) return true;
  if (allowedGids.length === 0) return false;
  if (allowedGids.includes(peer.gid)) return true;
  try {
    return groupsFromStatus(readFileSync(`/proc/${peer.pid}/status`, 'utf8')).some((g) => allowedGids.includes(g));
  } catch {
    return false; // the peer is gone
  }
}

class Connection {
  private readonly reader = new RequestReader();
  private readonly poller: Poller;
  private peer: PeerCred = { pid: 0, uid: -1, gid: -1 };
  private queue: Pending[] = [];
  private busy: Promise<void> | undefined;
  private timer: NodeJS.Timeout | undefined;
  private closed = false;
  private eof = false;
  /** a peer without the right to be served: its bytes are dropped */
  private refused = false;
  private readonly log: Logger;

  constructor(
    private readonly fd: number,
    private readonly opts: ServerOptions,
    private readonly onClose: (c: Connection) => void,
  ) {
    const n = native();
    this.log = opts.log;
    this.poller = n.pollReadable(fd, (err) => this.onReadable(err));
    try {
      this.peer = n.peerCred(fd);
    } catch (e) {
      this.reject(`cannot read peer credentials: ${errorChain(e)}`);
      return;
    }
    this.log = opts.log.child({ peerPid: this.peer.pid, peerUid: this.peer.uid });
    if (!peerAllowed(this.peer, opts.allowedGids ?? [])) {
      this.log.warn('refused a peer that is neither uid 0 nor in the socket group');
      // say why, then serve nothing: the peer's request is read and dropped until it hangs up or the frame
      // timeout ends it (closing at once would make its write fail with EPIPE before it reads the reason)
      this.sendError(`permission denied: uid ${this.peer.uid} gid ${this.peer.gid} may not use this socket`);
      this.refused = true;
      this.armTimer();
      return;
    }
    this.armTimer();
  }

  private reject(text: string): void {
    this.sendError(text);
    this.close();
  }

  private armTimer(): void {
    this.clearTimer();
    const ms = this.opts.frameTimeoutMs ?? 5000;
    this.timer = setTimeout(() => {
      const got = this.reader.pending();
      if (got > 0) {
        this.log.warn({ bytes: got }, 'incomplete request timed out');
        this.reject(`incomplete request: got ${got} bytes, no complete request within ${ms} ms`);
      } else {
        this.close();
      }
    }, ms);
    this.timer.unref();
  }

  private clearTimer(): void {
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
  }

  private onReadable(err: Error | null): void {
    if (this.closed) return;
    if (err) {
      this.log.warn({ err }, 'connection error');
      this.close();
      return;
    }
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
        this.eof = true;
        this.poller.stop();
        break;
      }
      if (this.refused) continue;
      let reqs: Request[];
      try {
        reqs = this.reader.push(chunk);
      } catch (e) {
        this.log.warn({ err: e }, 'bad request');
        // requests already queued still get their answers before the error and the close
        this.queue.push({ error: errorChain(e) });
        this.poller.stop();
        this.eof = true;
        break;
      }
      this.queue.push(...reqs.map((req) => ({ req })));
    }
    if (this.refused) {
      // nothing is served; the timer armed at refusal stands, a hang-up ends it sooner
      if (this.eof) this.close();
      return;
    }
    this.pump();
  }

  private pump(): void {
    if (this.busy || this.closed) return;
    const next = this.queue.shift();
    if (!next) {
      if (this.eof) this.close();
      else this.armTimer();
      return;
    }
    this.clearTimer();
    this.busy = this.serve(next).finally(() => {
      this.busy = undefined;
      this.pump();
    });
  }

  private async serve(next: Pending): Promise<void> {
    if ('error' in next) {
      this.sendError(next.error);
      this.queue = [];
      this.close();
      return;
    }
    const { req } = next;
    let reply: Reply;
    try {
      reply = await this.opts.handler.handle(req, this.peer);
    } catch (e) {
      this.sendError(errorChain(e));
      return;
    }
    if (this.closed) return;
    try {
      const { header, data } = encodeResponse(req.command, req.key, reply.payload, reply.fds.length);
      const n = native();
      const t = this.opts.sendTimeoutMs ?? 5000;
      n.sendMsg(this.fd, header, [], t);
      // payload and fds in ONE sendmsg, after the header (the client reads the header with a plain read)
      if (data.length > 0 || reply.fds.length > 0) n.sendMsg(this.fd, data, reply.fds, t);
    } catch (e) {
      this.log.warn({ err: e }, 'sending the reply failed');
      this.close();
    }
  }

  private sendError(text: string): void {
    if (this.closed) return;
    try {
      native().sendMsg(this.fd, encodeError(text), [], this.opts.sendTimeoutMs ?? 5000);
    } catch (e) {
      this.log.debug({ err: e }, 'sending an error reply failed');
    }
  }

  get open(): boolean {
    return !this.closed;
  }

  /** Waits for the request in progress, then closes. */
  async finish(): Promise<void> {
    this.eof = true;
    this.poller.stop();
    this.queue = [];
    if (this.busy) await this.busy;
    this.close();
  }

  private close(): void {
    if (this.closed) return;
    this.closed = true;
    this.clearTimer();
    this.poller.stop();
    try {
      native().close(this.fd);
    } catch {
      /* already closed */
    }
    this.onClose(this);
  }
}
