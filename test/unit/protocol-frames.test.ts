import { describe, expect, it } from 'vitest';
import { RequestReader, encodeError, encodeResponse, type Request } from '../../src/protocol/frames.js';
import { encodeHeader, decodeHeader } from '../../src/protocol/header.js';
import { Command, MAX_PAYLOAD } from '../../src/protocol/commands.js';

/** The error a fresh reader records for these bytes. */
function errorOfPush(bytes: Buffer): Error & { code?: string } {
  const r = new RequestReader();
  expect(r.push(bytes)).toEqual([]);
  expect(r.error).not.toBeNull();
  return r.error!;
}

function req(command: number, key: string, data: Buffer = Buffer.alloc(0), oobSize = 0): Buffer {
  return Buffer.concat([encodeHeader({ command, dataSize: data.length, oobSize, key }), data]);
}

const addJson = Buffer.from('{"podNetworkDesc":{"podId":"p","podNs":"ns","podName":"n"}}');
const recoverJson = Buffer.from('{"csn":{}}');

const getJson = Buffer.from('{"queues":2}');

/** A stream of four requests: add with payload, get with its (ours) payload, release with a payload to drain, recover. */
const stream = Buffer.concat([
  req(Command.Add, 'pod-a', addJson),
  req(Command.Get, 'pod-b', getJson),
  req(Command.Release, 'pod-c', Buffer.from('ignored payload')),
  req(Command.Recover, 'pod-d', recoverJson),
]);
const expected: Request[] = [
  { command: 0, key: 'pod-a', data: addJson },
  { command: 2, key: 'pod-b', data: getJson },
  { command: 1, key: 'pod-c', data: Buffer.alloc(0) },
  { command: 3, key: 'pod-d', data: recoverJson },
];

describe('RequestReader', () => {
  it('decodes coalesced requests from one chunk, draining release/list payloads', () => {
    const r = new RequestReader();
    expect(r.push(stream)).toEqual(expected);
    expect(r.pending()).toBe(0);
    expect(r.midFrame()).toBe(false);
  });

  it('decodes the same requests split at every offset', () => {
    for (let cut = 0; cut <= stream.length; cut++) {
      const r = new RequestReader();
      const got = [...r.push(stream.subarray(0, cut)), ...r.push(stream.subarray(cut))];
      expect(got, `cut at ${cut}`).toEqual(expected);
      expect(r.midFrame()).toBe(false);
    }
  });

  it('decodes the same requests pushed byte by byte, tracking pending bytes', () => {
    const r = new RequestReader();
    const got: Request[] = [];
    for (let i = 0; i < stream.length; i++) {
      got.push(...r.push(stream.subarray(i, i + 1)));
      if (i === 10) {
        expect(r.pending()).toBe(11);
        expect(r.midFrame()).toBe(true);
      }
    }
    expect(got).toEqual(expected);
  });

  it('keeps a truncated header pending and emits nothing', () => {
    const r = new RequestReader();
    const h = req(Command.Get, 'k');
    for (let i = 0; i < 76; i++) expect(r.push(h.subarray(i, i + 1))).toEqual([]);
    expect(r.pending()).toBe(76);
    expect(r.midFrame()).toBe(true);
    expect(r.push(h.subarray(76))).toEqual([{ command: 2, key: 'k', data: Buffer.alloc(0) }]);
  });

  it('counts kept payload bytes as pending, drained ones not', () => {
    const r = new RequestReader();
    const add = req(Command.Add, 'k', addJson);
    r.push(add.subarray(0, 80));
    expect(r.pending()).toBe(3);
    expect(r.midFrame()).toBe(true);
    const r2 = new RequestReader();
    const rel = req(Command.Release, 'k', Buffer.alloc(10));
    r2.push(rel.subarray(0, 80));
    expect(r2.pending()).toBe(0);
    expect(r2.midFrame()).toBe(true);
  });

  it('handles an empty push and a list request with an empty key', () => {
    const r = new RequestReader();
    expect(r.push(Buffer.alloc(0))).toEqual([]);
    expect(r.push(req(Command.List, ''))).toEqual([{ command: 4, key: '', data: Buffer.alloc(0) }]);
  });

  it('rejects a bad magic on its first wrong byte, and stays failed', () => {
    const r = new RequestReader();
    expect(r.push(Buffer.from([0x42]))).toEqual([]);
    expect(r.error).toBeNull();
    expect(r.push(Buffer.from([0x41]))).toEqual([]);
    expect(r.error?.code).toBe('PROTOCOL');
    expect(r.error?.message).toMatch(/bad magic 0x4241/);
    expect(r.push(req(Command.Get, 'k'))).toEqual([]);
    expect(r.error?.message).toMatch(/bad magic/);
  });

  it('rejects a bad magic in the second of two coalesced frames', () => {
    const bad = req(Command.Get, 'k');
    bad.writeUInt32BE(0xdeadbeef, 0);
    const r = new RequestReader();
    // the valid request before the garbage is still returned: it gets its reply before the error
    expect(r.push(Buffer.concat([req(Command.Get, 'k'), bad]))).toEqual([
      { command: 2, key: 'k', data: Buffer.alloc(0) },
    ]);
    expect(r.error?.message).toMatch(/bad magic 0xde/);
  });

  it('allocates nothing for a claimed payload until its bytes arrive', () => {
    const r = new RequestReader();
    expect(r.push(encodeHeader({ command: Command.Add, dataSize: MAX_PAYLOAD, oobSize: 0, key: 'k' }))).toEqual([]);
    expect(r.pending()).toBe(0);
    r.push(Buffer.from('{"a":'));
    expect(r.pending()).toBe(5);
  });

  it('rejects an oversized dataSize right after the header, before any payload', () => {
    const h = encodeHeader({ command: Command.Add, dataSize: MAX_PAYLOAD + 1, oobSize: 0, key: 'big' });
    const r = new RequestReader();
    expect(r.push(h)).toEqual([]);
    expect(r.error?.code).toBe('PROTOCOL');
    expect(r.error?.message).toMatch(/1048577 bytes exceeds 1048576/);
    // a drained command is limited too
    const g = encodeHeader({ command: Command.Release, dataSize: 0xffffffff, oobSize: 0, key: 'big' });
    expect(errorOfPush(g).message).toMatch(/4294967295/);
    // exactly MAX_PAYLOAD is fine
    const ok = new RequestReader();
    expect(ok.push(encodeHeader({ command: Command.Add, dataSize: MAX_PAYLOAD, oobSize: 0, key: 'max' }))).toEqual([]);
    expect(ok.pending()).toBe(0);
    expect(ok.push(Buffer.alloc(MAX_PAYLOAD, 0x7b))[0]!.data.length).toBe(MAX_PAYLOAD);
  });

  it('rejects oobSize in a request', () => {
    const e = errorOfPush(req(Command.Get, 'k', Buffer.alloc(0), 24));
    expect(e.code).toBe('PROTOCOL');
    expect(e.message).toMatch(/get request for key "k": oobSize 24/);
  });

  it('rejects unknown commands after the header', () => {
    for (const c of [9, 0x7f, 0x80, 0x82, 0xff]) {
      const r = new RequestReader();
      const h = req(c, 'k');
      expect(r.push(h.subarray(0, 76))).toEqual([]);
      expect(r.push(h.subarray(76))).toEqual([]);
      const e = r.error!;
      expect(e.code).toBe('PROTOCOL');
      expect(e.message).toBe(`bad command 0x${c.toString(16).padStart(2, '0')} (key "k")`);
    }
  });
});

describe('response framing', () => {
  it('encodes a get response with 2 fds', () => {
    const payload = Buffer.from('[]');
    const { header, data } = encodeResponse(Command.Get, 'pod', payload, 2);
    expect(decodeHeader(header)).toEqual({ command: 0x82, dataSize: 2, oobSize: 24, key: 'pod' });
    expect(data).toBe(payload);
  });

  it('encodes a release response with nothing after the header', () => {
    const { header, data } = encodeResponse(Command.Release, 'pod', null, 0);
    expect(decodeHeader(header)).toEqual({ command: 0x81, dataSize: 0, oobSize: 0, key: 'pod' });
    expect(data.length).toBe(0);
    expect(decodeHeader(encodeResponse(Command.Get, 'p', null, 3).header).oobSize).toBe(32);
  });

  it('encodes an error reply', () => {
    const b = encodeError('bad fd key: "x"');
    expect(b.length).toBe(77 + 15);
    expect(decodeHeader(b)).toEqual({ command: 0xff, dataSize: 15, oobSize: 0, key: '' });
    expect(b.subarray(13, 77)).toEqual(Buffer.alloc(64, 0));
    expect(b.subarray(77).toString()).toBe('bad fd key: "x"');
  });

  it('caps error text at MAX_PAYLOAD without splitting a UTF-8 character', () => {
    const b = encodeError('é'.repeat(MAX_PAYLOAD));
    const h = decodeHeader(b);
    expect(h.dataSize).toBe(MAX_PAYLOAD);
    expect(b.subarray(77).toString('utf8')).toBe('é'.repeat(MAX_PAYLOAD / 2));
    const odd = encodeError(`a${'é'.repeat(MAX_PAYLOAD)}`);
    expect(decodeHeader(odd).dataSize).toBe(MAX_PAYLOAD - 1);
  });
});
