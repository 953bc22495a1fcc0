// The 77-byte fd-protocol header (docs/protocol.md). Go writes the struct with
// binary.Write(BigEndian), which packs the fields with no padding:
//   0 magic u32 | 4 command u8 | 5 dataSize u32 | 9 oobSize u32 | 13 key [64]byte
import { ErrorCode, VmpodError } from '../errors.js';
import { ERROR_COMMAND, HEADER_SIZE, KEY_SIZE, MAGIC } from './commands.js';

export interface Header {
  command: number;
  dataSize: number;
  oobSize: number;
  /** trimmed of surrounding whitespace and NUL bytes */
  key: string;
}

/** Where each field starts. native/protocol.h is generated from this and commands.ts (scripts/protocol-h.mjs). */
export const HEADER_LAYOUT = { magic: 0, command: 4, dataSize: 5, oobSize: 9, key: 13 } as const;
const {
  magic: OFF_MAGIC,
  command: OFF_COMMAND,
  dataSize: OFF_DATA_SIZE,
  oobSize: OFF_OOB_SIZE,
  key: OFF_KEY,
} = HEADER_LAYOUT;

/**
 * The bytes trimmed from both ends of a key: Go's strings.TrimSpace on ASCII (\t \n \v \f \r space) plus NUL, which
 * an error reply's key is made of. The addon trims the same (native/protocol.h).
 */
export const KEY_TRIM_BYTES = [0x00, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x20] as const;
const TRIMMED = new Uint8Array(256);
for (const b of KEY_TRIM_BYTES) TRIMMED[b] = 1;

const SPACE = 0x20;

function checkU32(name: string, n: number): void {
  if (!Number.isInteger(n) || n < 0 || n > 0xffff_ffff) {
    throw new VmpodError(ErrorCode.Protocol, `encode header: ${name} ${n} is not a u32`);
  }
}

/**
 * The key as it goes on the wire: ASCII, right-padded with spaces (Virtlet's fdKey). A key longer than
 * 64 bytes cannot be expressed (Virtlet truncated it silently; we refuse). Printable ASCII only:
 * the reader trims whitespace and NULs, so anything else would not come back unchanged.
 */
function keyBytes(key: string): Buffer {
  const bad = [...key].filter((c) => c < ' ' || c > '~');
  if (bad.length > 0) {
    throw new VmpodError(
      ErrorCode.BadKey,
      `bad key ${JSON.stringify(key)}: not printable ASCII (${JSON.stringify(bad.join(''))})`,
    );
  }
  if (key.length > KEY_SIZE) {
    throw new VmpodError(
      ErrorCode.BadKey,
      `bad key ${JSON.stringify(key)}: ${key.length} bytes, the header holds ${KEY_SIZE}`,
    );
  }
  const out = Buffer.alloc(KEY_SIZE, SPACE);
  out.write(key, 0, 'latin1');
  return out;
}

function pack(command: number, dataSize: number, oobSize: number, key: Buffer): Buffer {
  checkU32('dataSize', dataSize);
  checkU32('oobSize', oobSize);
  if (!Number.isInteger(command) || command < 0 || command > 0xff) {
    throw new VmpodError(ErrorCode.Protocol, `encode header: command ${command} is not a u8`);
  }
  const buf = Buffer.alloc(HEADER_SIZE);
  buf.writeUInt32BE(MAGIC, OFF_MAGIC);
  buf.writeUInt8(command, OFF_COMMAND);
  buf.writeUInt32BE(dataSize, OFF_DATA_SIZE);
  buf.writeUInt32BE(oobSize, OFF_OOB_SIZE);
  key.copy(buf, OFF_KEY);
  return buf;
}

export function encodeHeader(h: { command: number; dataSize: number; oobSize: number; key: string }): Buffer {
  return pack(h.command, h.dataSize, h.oobSize, keyBytes(h.key));
}

/** Virtlet's error reply header: command 0xFF, oobSize 0, and a zero-valued Key (64 NUL bytes, not spaces). */
export function encodeErrorHeader(dataSize: number): Buffer {
  return pack(ERROR_COMMAND, dataSize, 0, Buffer.alloc(KEY_SIZE, 0));
}

/** Decodes the first 77 bytes of buf. Throws Protocol on a short buffer or a bad magic. */
export function decodeHeader(buf: Buffer): Header {
  if (buf.length < HEADER_SIZE) {
    throw new VmpodError(ErrorCode.Protocol, `short header: ${buf.length} of ${HEADER_SIZE} bytes`);
  }
  const magic = buf.readUInt32BE(OFF_MAGIC);
  if (magic !== MAGIC) {
    throw new VmpodError(
      ErrorCode.Protocol,
      `bad magic 0x${magic.toString(16).padStart(8, '0')}, expected 0x${MAGIC.toString(16)}`,
    );
  }
  let start = OFF_KEY;
  let end = OFF_KEY + KEY_SIZE;
  while (start < end && TRIMMED[buf[start]!] === 1) start++;
  while (end > start && TRIMMED[buf[end - 1]!] === 1) end--;
  return {
    command: buf.readUInt8(OFF_COMMAND),
    dataSize: buf.readUInt32BE(OFF_DATA_SIZE),
    oobSize: buf.readUInt32BE(OFF_OOB_SIZE),
    // latin1 keeps every byte visible as one char, so validateKey can reject non-ASCII keys
    key: buf.toString('latin1', start, end),
  };
}
