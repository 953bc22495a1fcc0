import { describe, expect, it } from 'vitest';
import { encodeErrorHeader, encodeHeader, decodeHeader } from '../../src/protocol/header.js';
import {
  Command,
  ERROR_COMMAND,
  HEADER_SIZE,
  KEY_SIZE,
  MAGIC,
  MAX_PAYLOAD,
  RESPONSE_BIT,
  cmsgSpace,
  commandFromName,
  commandName,
  isCommand,
  responseOf,
} from '../../src/protocol/commands.js';
import { isVmpodError } from '../../src/errors.js';

/** Hex written out by hand, whitespace ignored. */
function hex(s: string): Buffer {
  return Buffer.from(s.replace(/\s+/g, ''), 'hex');
}

function codeOf(f: () => unknown): string | undefined {
  try {
    f();
  } catch (e) {
    if (isVmpodError(e)) return e.code;
    throw e;
  }
  return undefined;
}

describe('commands', () => {
  it('has Virtlet codes and constants', () => {
    expect(Command).toEqual({
      Add: 0,
      Release: 1,
      Get: 2,
      Recover: 3,
      List: 4,
      ReleaseForce: 5,
      Status: 6,
      Gc: 7,
      Check: 8,
    });
    expect([RESPONSE_BIT, ERROR_COMMAND, MAGIC, HEADER_SIZE, KEY_SIZE, MAX_PAYLOAD]).toEqual([
      0x80, 0xff, 0x42424242, 77, 64, 1048576,
    ]);
    expect(responseOf(Command.Get)).toBe(0x82);
  });

  it('cmsgSpace is CMSG_SPACE(4n) on 64-bit Linux', () => {
    expect([0, 1, 2, 3, 4, 5, 253].map(cmsgSpace)).toEqual([0, 24, 24, 32, 32, 40, 16 + 1016]);
    expect(() => cmsgSpace(-1)).toThrow(RangeError);
    expect(() => cmsgSpace(1.5)).toThrow(RangeError);
  });

  it('names commands', () => {
    expect([0, 1, 2, 3, 4].map(commandName)).toEqual(['add', 'release', 'get', 'recover', 'list']);
    expect(commandName(0x82)).toBe('get-response');
    expect(commandName(0xff)).toBe('error');
    expect(commandName(5)).toBe('release-force');
    expect(commandName(6)).toBe('status');
    expect(commandName(9)).toBe('unknown(0x09)');
    expect(commandName(0x85)).toBe('release-force-response');
    expect(commandName(0x86)).toBe('status-response');
    expect(commandName(0x89)).toBe('unknown(0x89)');
    expect(commandFromName('recover')).toBe(3);
    expect(commandFromName('nope')).toBeUndefined();
    expect([0, 4, 5, 6, 7, 8, 9, -1, 0x80].map(isCommand)).toEqual([
      true,
      true,
      true,
      true,
      true,
      true,
      false,
      false,
      false,
    ]);
  });
});

describe('header', () => {
  it('encodes an add request byte for byte', () => {
    // add, 300 payload bytes, key "abc"
    const golden = hex(`
      42 42 42 42
      00
      00 00 01 2c
      00 00 00 00
      61 62 63 20 20 20 20 20 20 20 20 20 20 20 20 20
      20 20 20 20 20 20 20 20 20 20 20 20 20 20 20 20
      20 20 20 20 20 20 20 20 20 20 20 20 20 20 20 20
      20 20 20 20 20 20 20 20 20 20 20 20 20 20 20 20
    `);
    expect(golden.length).toBe(77);
    expect(encodeHeader({ command: Command.Add, dataSize: 300, oobSize: 0, key: 'abc' })).toEqual(golden);
    expect(decodeHeader(golden)).toEqual({ command: 0, dataSize: 300, oobSize: 0, key: 'abc' });
  });

  it('encodes the error reply header byte for byte (key of 64 NUL bytes)', () => {
    const golden = hex(`
      42 42 42 42
      ff
      00 00 00 05
      00 00 00 00
      00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
      00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
      00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
      00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
    `);
    expect(encodeErrorHeader(5)).toEqual(golden);
    expect(decodeHeader(golden)).toEqual({ command: 0xff, dataSize: 5, oobSize: 0, key: '' });
  });

  it('encodes big-endian sizes and the response command', () => {
    const h = encodeHeader({ command: 0x82, dataSize: 0x01020304, oobSize: 24, key: 'k' });
    expect(h.subarray(4, 13)).toEqual(hex('82 01020304 00000018'));
    expect(decodeHeader(h)).toEqual({ command: 0x82, dataSize: 0x01020304, oobSize: 24, key: 'k' });
  });

  it('pads the key with spaces and takes exactly 64 bytes', () => {
    const k64 = 'x'.repeat(64);
    const h = encodeHeader({ command: 0, dataSize: 0, oobSize: 0, key: k64 });
    expect(h.length).toBe(77);
    expect(h.subarray(13).toString('latin1')).toBe(k64);
    expect(decodeHeader(h).key).toBe(k64);
    const empty = encodeHeader({ command: 4, dataSize: 0, oobSize: 0, key: '' });
    expect(empty.subarray(13)).toEqual(Buffer.alloc(64, 0x20));
    expect(decodeHeader(empty).key).toBe('');
  });

  it('rejects keys that do not fit or are not printable ASCII', () => {
    expect(codeOf(() => encodeHeader({ command: 0, dataSize: 0, oobSize: 0, key: 'x'.repeat(65) }))).toBe('BAD_KEY');
    expect(codeOf(() => encodeHeader({ command: 0, dataSize: 0, oobSize: 0, key: 'é' }))).toBe('BAD_KEY');
    expect(codeOf(() => encodeHeader({ command: 0, dataSize: 0, oobSize: 0, key: 'a\u0000' }))).toBe('BAD_KEY');
    expect(() => encodeHeader({ command: 0, dataSize: 0, oobSize: 0, key: 'x'.repeat(65) })).toThrow(/65 bytes/);
  });

  it('rejects out-of-range numbers', () => {
    expect(codeOf(() => encodeHeader({ command: 256, dataSize: 0, oobSize: 0, key: '' }))).toBe('PROTOCOL');
    expect(codeOf(() => encodeHeader({ command: 0, dataSize: 2 ** 32, oobSize: 0, key: '' }))).toBe('PROTOCOL');
    expect(codeOf(() => encodeHeader({ command: 0, dataSize: 0, oobSize: -1, key: '' }))).toBe('PROTOCOL');
  });

  it('trims surrounding whitespace and NULs from the key, keeps inner bytes', () => {
    const h = encodeHeader({ command: 0, dataSize: 0, oobSize: 0, key: '' });
    h.write('\t\u0000 ab c\r\n\u0000', 13, 'latin1');
    expect(decodeHeader(h).key).toBe('ab c');
    const nul = encodeHeader({ command: 0, dataSize: 0, oobSize: 0, key: '' });
    nul.fill(0, 13);
    nul.write('pod1', 13, 'latin1');
    expect(decodeHeader(nul).key).toBe('pod1');
    const high = encodeHeader({ command: 0, dataSize: 0, oobSize: 0, key: '' });
    high[13] = 0xe9;
    expect(decodeHeader(high).key).toBe('\u00e9');
  });

  it('rejects a bad magic and a short header', () => {
    const h = encodeHeader({ command: 0, dataSize: 0, oobSize: 0, key: 'a' });
    h[0] = 0x41;
    expect(() => decodeHeader(h)).toThrow('bad magic 0x41424242');
    expect(codeOf(() => decodeHeader(h))).toBe('PROTOCOL');
    expect(() => decodeHeader(Buffer.alloc(76))).toThrow(/short header: 76 of 77/);
  });
});
