// What the RA and DHCPv6 servers need of a packet socket, their listening half, and their flood guard.
import { closeOffLoop } from '../files.js';
import { native, type Poller, type RecvFrameResult } from '../native.js';
import { SocketWatch, type WatchLog } from './watch.js';

/** The socket calls the servers make; native() by default, a recording fake in unit tests. */
export interface PacketIo {
  packetSocketInNetns(nsPath: string, ifname: string, filter: Buffer): number;
  pollReadable(fd: number, cb: (err: Error | null) => void): Poller;
  /** a frame and whether its checksum is still to be filled in (a guest with checksum offload); null: none waiting */
  recvFrame(fd: number, max: number): RecvFrameResult | null;
  writeAll(fd: number, data: Buffer): void;
  close(fd: number): void;
  /** close(fd) on a pool thread: a packet socket's close waits for an RCU grace period (watch.ts WatchIo) */
  closeOffLoop(fd: number): Promise<void>;
}

/** The addon's packet socket calls, and close on libuv's pool (node:fs close). */
export function nativePacketIo(): PacketIo {
  const n = native();
  return {
    packetSocketInNetns: (nsPath, ifname, filter) => n.packetSocketInNetns(nsPath, ifname, filter),
    pollReadable: (fd, cb) => n.pollReadable(fd, cb),
    recvFrame: (fd, max) => n.recvFrame(fd, max),
    writeAll: (fd, data) => n.writeAll(fd, data),
    close: (fd) => n.close(fd),
    closeOffLoop,
  };
}

/** The most a frame read takes. */
const RECV_MAX = 65536;

/**
 * A packet socket on `tap` inside the pod netns at nsPath, watched: each frame `filter` (classic BPF) passes goes to
 * onFrame with whether its checksum is still to be filled in. `name` says which server in the watch's log lines.
 */
export function watchTapFrames(
  io: PacketIo,
  nsPath: string,
  tap: string,
  filter: Buffer,
  onFrame: (data: Buffer, csumNotReady: boolean) => void,
  log: WatchLog,
  name: string,
): SocketWatch<RecvFrameResult> {
  const fd = io.packetSocketInNetns(nsPath, tap, filter);
  return new SocketWatch(
    io,
    fd,
    (f) => io.recvFrame(f, RECV_MAX),
    (r) => onFrame(r.data, r.csumNotReady),
    log,
    name,
  );
}

/** A token bucket: `burst` at once, then `perSecond`. */
export class RateLimit {
  private tokens: number;
  private last: number;
  constructor(
    private readonly burst: number,
    private readonly perSecond: number,
    private readonly now: () => number = () => performance.now(),
  ) {
    this.tokens = burst;
    this.last = now();
  }
  take(): boolean {
    const t = this.now();
    this.tokens = Math.min(this.burst, this.tokens + ((t - this.last) / 1000) * this.perSecond);
    this.last = t;
    if (this.tokens < 1) return false;
    this.tokens -= 1;
    return true;
  }
}
