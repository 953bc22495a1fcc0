// One socket watched for the DHCPv4, DHCPv6 and RA servers: the fd, its uv_poll, a bounded burst of reads per wake-up,
// and an idempotent stop. The server gives the read (one datagram or frame, null when none is waiting) and the handler.
import { errorChain } from '../errors.js';
import type { Poller } from '../native.js';

export interface WatchIo {
  pollReadable(fd: number, cb: (err: Error | null) => void): Poller;
  close(fd: number): void;
  /**
   * close(fd) on a pool thread, for a socket whose close waits: a packet socket's waits for an RCU grace period
   * (packet_release's synchronize_net), milliseconds that would stall the event loop. Without it, stop closes at once.
   */
  closeOffLoop?(fd: number): Promise<void>;
}

export interface WatchLog {
  warn(obj: object, msg: string): void;
  error(obj: object, msg: string): void;
}

/** reads per wake-up: a flood cannot hold the event loop longer than this many packets */
const BURST = 64;

export class SocketWatch<T> {
  #fd: number;
  #poller: Poller | undefined;
  /** settles once the socket is closed after stop (never rejects: a failed close is logged) */
  closed: Promise<void> = Promise.resolve();

  /**
   * Watches `fd` (already open): on each wake-up, `read` packets (null: none left) and `handle` each. When the
   * poll cannot be set up, the fd is closed and the error thrown.
   */
  constructor(
    private readonly io: WatchIo,
    fd: number,
    private readonly read: (fd: number) => T | null,
    private readonly handle: (packet: T) => void,
    private readonly log: WatchLog,
    private readonly name: string,
  ) {
    this.#fd = fd;
    try {
      this.#poller = io.pollReadable(fd, (err) => this.onReadable(err));
    } catch (e) {
      io.close(fd);
      this.#fd = -1;
      throw e;
    }
  }

  /** the socket fd, -1 once stopped */
  get fd(): number {
    return this.#fd;
  }

  /**
   * Stops watching and closes the socket, off the event loop when the io can (`closed` settles then). Idempotent: true
   * only for the call that stopped it.
   */
  stop(): boolean {
    if (this.#fd < 0) return false;
    const fd = this.#fd;
    this.#fd = -1;
    this.#poller?.stop();
    this.#poller = undefined;
    const failed = (e: unknown): void =>
      this.log.warn({ err: errorChain(e), fd }, `${this.name}: closing the socket failed`);
    if (this.io.closeOffLoop) {
      this.closed = this.io.closeOffLoop(fd).catch(failed);
      return true;
    }
    try {
      this.io.close(fd);
    } catch (e) {
      failed(e);
    }
    return true;
  }

  private onReadable(err: Error | null): void {
    if (this.#fd < 0) return;
    if (err) {
      // the poll reports an error on the socket itself (e.g. the link went away); keep the server, log it
      this.log.error({ err: errorChain(err) }, `${this.name}: poll error on the socket`);
      return;
    }
    for (let n = 0; n < BURST && this.#fd >= 0; n++) {
      let packet: T | null;
      try {
        packet = this.read(this.#fd);
      } catch (e) {
        this.log.warn({ err: errorChain(e) }, `${this.name}: read failed`);
        return;
      }
      if (packet === null) return;
      this.handle(packet);
    }
  }
}
