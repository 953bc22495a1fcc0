// One socket watched for the DHCPv4, DHCPv6 and RA servers: the fd, its uv_poll, a bounded burst of reads per wake-up,
// and an idempotent stop. The server gives the read (one datagram or frame, handled; false when none is left).
import { errorChain } from '../errors.js';
import type { Poller } from '../native.js';

export interface WatchIo {
  pollReadable(fd: number, cb: (err: Error | null) => void): Poller;
  close(fd: number): void;
}

interface WatchLog {
  warn(obj: object, msg: string): void;
  error(obj: object, msg: string): void;
}

/** reads per wake-up: a flood cannot hold the event loop longer than this many packets */
const BURST = 64;

export class SocketWatch {
  #fd: number;
  #poller: Poller | undefined;

  /**
   * Watches `fd` (already open); `readOne` reads and handles one packet and says whether there was one. When the
   * poll cannot be set up, the fd is closed and the error thrown.
   */
  constructor(
    private readonly io: WatchIo,
    fd: number,
    private readonly readOne: (fd: number) => boolean,
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

  /** Stops watching and closes the socket. Idempotent: true only for the call that stopped it. */
  stop(): boolean {
    if (this.#fd < 0) return false;
    const fd = this.#fd;
    this.#fd = -1;
    this.#poller?.stop();
    this.#poller = undefined;
    try {
      this.io.close(fd);
    } catch (e) {
      this.log.warn({ err: errorChain(e), fd }, `${this.name}: closing the socket failed`);
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
      try {
        if (!this.readOne(this.#fd)) return;
      } catch (e) {
        this.log.warn({ err: errorChain(e) }, `${this.name}: read failed`);
        return;
      }
    }
  }
}
