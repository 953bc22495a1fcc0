// A raw fd-protocol peer for tests that must misbehave or speak byte for byte as Virtlet's client does:
// header and payload written as given, replies read and split by hand. Blocking (the daemon is another process).
import { native, type RecvMsgResult } from '../../src/native.js';
import { encodeHeader } from '../../src/protocol/header.js';

export const HEADER = 77;

export interface RawReply {
  command: number;
  key: string;
  dataSize: number;
  oobSize: number;
  data: Buffer;
  fds: number[];
}

/** The bytes of one request: header (key space-padded as Go's client does) then payload. */
export function requestBytes(command: number, key: string, payload?: object | Buffer): Buffer {
  const data =
    payload === undefined ? Buffer.alloc(0) : Buffer.isBuffer(payload) ? payload : Buffer.from(JSON.stringify(payload));
  return Buffer.concat([encodeHeader({ command, dataSize: data.length, oobSize: 0, key }), data]);
}

export function connect(socket: string, timeoutMs = 180_000): number {
  const n = native();
  const fd = n.connectUnix(socket);
  n.setTimeouts(fd, timeoutMs);
  return fd;
}

/** Reads exactly len bytes with plain reads (no control buffer), as Go's binary.Read does; fewer at EOF. */
export function readFull(fd: number, len: number): Buffer {
  const n = native();
  let buf = Buffer.alloc(0);
  while (buf.length < len) {
    const r = n.recvMsg(fd, len - buf.length, 0);
    if (r.data.length === 0) break;
    buf = Buffer.concat([buf, r.data]);
  }
  return buf;
}

/**
 * One reply read as Virtlet's FDClient reads it: the 77-byte header with plain reads, then, if dataSize or oobSize
 * is non-zero, ONE recvmsg with a data buffer of exactly dataSize (at least 1) and a control buffer of exactly
 * oobSize. Throws what Virtlet's client would report. null at EOF before a header.
 */
export function readReply(fd: number): RawReply | null {
  const h = readFull(fd, HEADER);
  if (h.length === 0) return null;
  if (h.length < HEADER) throw new Error(`error reading response header: got ${h.length} bytes`);
  if (h.readUInt32BE(0) !== 0x42424242) throw new Error('bad magic');
  const reply: RawReply = {
    command: h[4]!,
    dataSize: h.readUInt32BE(5),
    oobSize: h.readUInt32BE(9),
    key: h
      .subarray(13, 77)
      .toString('latin1')
      .replace(/[\s\0]+$/, ''),
    data: Buffer.alloc(0),
    fds: [],
  };
  if (reply.dataSize > 0 || reply.oobSize > 0) {
    const r: RecvMsgResult = native().recvMsg(fd, Math.max(reply.dataSize, 1), reply.oobSize);
    if (r.data.length !== reply.dataSize && (reply.dataSize !== 0 || r.data.length !== 1)) {
      throw new Error(`bad data size: ${r.data.length} instead of ${reply.dataSize}`);
    }
    if (r.ctrunc) throw new Error('control message truncated');
    reply.data = reply.dataSize === 0 ? Buffer.alloc(0) : r.data;
    reply.fds = r.fds;
  }
  return reply;
}

/** A new connection, one request, one reply, close: Virtlet's way. */
export function exchange(socket: string, command: number, key: string, payload?: object | Buffer): RawReply {
  const fd = connect(socket);
  try {
    native().writeAll(fd, requestBytes(command, key, payload));
    const r = readReply(fd);
    if (!r) throw new Error('connection closed before a reply');
    return r;
  } finally {
    native().close(fd);
  }
}

/** Reads replies until EOF (the server closed the connection). */
export function readUntilEof(fd: number): RawReply[] {
  const out: RawReply[] = [];
  for (;;) {
    const r = readReply(fd);
    if (!r) return out;
    out.push(r);
  }
}
