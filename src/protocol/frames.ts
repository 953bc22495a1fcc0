// Request framing for the server side and response framing (docs/protocol.md).
// Pure: bytes in, requests out. The socket loop lives in src/tapmanager/.
import { ErrorCode, VmpodError } from '../errors.js';
import { Command, HEADER_SIZE, MAGIC, MAX_PAYLOAD, cmsgSpace, commandName, isCommand, responseOf } from './commands.js';
import { escapeOutput } from '../escape.js';
import { decodeHeader, encodeErrorHeader, encodeHeader, type Header } from './header.js';

export interface Request {
  command: Command;
  /** trimmed, NOT validated: the dispatcher runs validateKey (list has an empty key) */
  key: string;
  /** the payload for add, recover and get (ours: {"queues": N}); an empty Buffer for the others (theirs is drained) */
  data: Buffer;
}

/** Commands whose payload we keep. Virtlet's server did not drain the others' and desynchronised. */
function keepsPayload(c: Command): boolean {
  return c === Command.Add || c === Command.Recover || c === Command.Get;
}

const MAGIC_BYTES = (() => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(MAGIC);
  return b;
})();

interface Body {
  header: Header;
  command: Command;
  /** the payload bytes received so far (copies of the reads); null when the payload is drained */
  parts: Buffer[] | null;
  /** payload bytes still to come */
  remaining: number;
}

/**
 * A push decoder: feed it whatever read() returned, get back every request completed by it.
 * Split and coalesced reads are both fine. Validation happens as early as the bytes allow:
 * a wrong magic byte fails as soon as it arrives; a bad command, an oobSize in a request or an
 * oversized dataSize fail as soon as the header is complete. A header's dataSize allocates nothing: the payload
 * is kept as the bytes arrive and joined once complete.
 * A failure makes the connection unusable (we cannot find the next frame): push() still returns the requests
 * completed before the bad bytes (they get their replies), `error` holds the failure, and every later push()
 * returns nothing. The server answers the queued requests, then the error, then closes.
 */
export class RequestReader {
  private readonly head = Buffer.alloc(HEADER_SIZE);
  private headFill = 0;
  private body: Body | null = null;
  private failed: VmpodError | null = null;

  push(chunk: Buffer): Request[] {
    if (this.failed) return [];
    const out: Request[] = [];
    try {
      this.consume(chunk, out);
    } catch (e) {
      this.failed = e as VmpodError;
    }
    return out;
  }

  /** The protocol error that ended the stream, or null. */
  get error(): VmpodError | null {
    return this.failed;
  }

  /** Bytes held for the frame in progress (header bytes plus kept payload bytes). */
  pending(): number {
    const body = this.body;
    const kept = body?.parts ? body.header.dataSize - body.remaining : 0;
    return this.headFill + kept;
  }

  /** True while a frame has started but not finished (for a header/payload timeout). */
  midFrame(): boolean {
    return this.headFill > 0 || this.body !== null;
  }

  private consume(chunk: Buffer, out: Request[]): void {
    let off = 0;
    while (off < chunk.length) {
      if (this.body === null) {
        const n = Math.min(HEADER_SIZE - this.headFill, chunk.length - off);
        chunk.copy(this.head, this.headFill, off, off + n);
        this.checkMagicPrefix(this.headFill, this.headFill + n);
        this.headFill += n;
        off += n;
        if (this.headFill < HEADER_SIZE) break;
        this.headFill = 0;
        const body = this.startBody(decodeHeader(this.head));
        if (body.remaining === 0) out.push(finish(body));
        else this.body = body;
      } else {
        const body = this.body;
        const n = Math.min(body.remaining, chunk.length - off);
        if (body.parts) body.parts.push(Buffer.from(chunk.subarray(off, off + n)));
        body.remaining -= n;
        off += n;
        if (body.remaining === 0) {
          out.push(finish(body));
          this.body = null;
        }
      }
    }
  }

  /** Checks the magic bytes in head[from..to) as they arrive, so garbage fails on its first byte. */
  private checkMagicPrefix(from: number, to: number): void {
    for (let i = from; i < Math.min(to, MAGIC_BYTES.length); i++) {
      if (this.head[i] !== MAGIC_BYTES[i]) {
        const got = this.head.subarray(0, Math.min(to, MAGIC_BYTES.length)).toString('hex');
        throw new VmpodError(
          ErrorCode.Protocol,
          `bad magic 0x${got}${i + 1 < 4 ? '...' : ''}, expected 0x${MAGIC.toString(16)}`,
        );
      }
    }
  }

  private startBody(h: Header): Body {
    const what = `${commandName(h.command)} request for key ${JSON.stringify(h.key)}`;
    if (!isCommand(h.command)) {
      throw new VmpodError(
        ErrorCode.Protocol,
        `bad command 0x${h.command.toString(16).padStart(2, '0')} (key ${JSON.stringify(h.key)})`,
        { key: h.key },
      );
    }
    // the client never sends fds: an oobSize in a request means a confused or hostile peer
    if (h.oobSize !== 0) {
      throw new VmpodError(ErrorCode.Protocol, `${what}: oobSize ${h.oobSize}, requests carry no fds`, { key: h.key });
    }
    if (h.dataSize > MAX_PAYLOAD) {
      throw new VmpodError(ErrorCode.Protocol, `${what}: payload of ${h.dataSize} bytes exceeds ${MAX_PAYLOAD}`, {
        key: h.key,
      });
    }
    return {
      header: h,
      command: h.command,
      parts: keepsPayload(h.command) ? [] : null,
      remaining: h.dataSize,
    };
  }
}

function finish(body: Body): Request {
  const data =
    body.parts === null ? Buffer.alloc(0) : body.parts.length === 1 ? body.parts[0]! : Buffer.concat(body.parts);
  return { command: body.command, key: body.header.key, data };
}

/**
 * A response: the header, then (when dataSize > 0 or fds are sent) the payload and the fds in ONE sendmsg.
 * oobSize is exactly CMSG_SPACE(4 * nfds). With fds and no payload, the sender adds one filler byte
 * (native trySendMsg does) while dataSize stays 0.
 */
export function encodeResponse(
  command: Command,
  key: string,
  payload: Buffer | null,
  nfds: number,
): { header: Buffer; data: Buffer } {
  const data = payload ?? Buffer.alloc(0);
  if (data.length > MAX_PAYLOAD) {
    throw new VmpodError(
      ErrorCode.Internal,
      `${commandName(command)} response for key ${JSON.stringify(key)}: payload of ${data.length} bytes exceeds ` +
        `${MAX_PAYLOAD}`,
      { key },
    );
  }
  const header = encodeHeader({ command: responseOf(command), dataSize: data.length, oobSize: cmsgSpace(nfds), key });
  return { header, data };
}

/** Cut text to at most max UTF-8 bytes without splitting a character. */
function utf8Prefix(text: string, max: number): Buffer {
  const b = Buffer.from(text, 'utf8');
  if (b.length <= max) return b;
  let end = max;
  // back off over continuation bytes (10xxxxxx) to the start of the cut character
  while (end > 0 && (b[end]! & 0xc0) === 0x80) end--;
  return b.subarray(0, end);
}

/** An error reply: header (command 0xFF, zero key) followed by the UTF-8 text, capped at MAX_PAYLOAD. */
export function encodeError(text: string): Buffer {
  // the text quotes requests and plugin output: controls are escaped, so a reply cannot forge lines
  const body = utf8Prefix(escapeOutput(text, MAX_PAYLOAD), MAX_PAYLOAD);
  return Buffer.concat([encodeErrorHeader(body.length), body]);
}
