// SocketWatch.stop: the poll stopped and the socket closed once; on the event loop, or on a pool thread when the io
// can (a packet socket's close waits for an RCU grace period), `closed` settling when it is done.
import { describe, expect, it } from 'vitest';
import { SocketWatch, type WatchIo } from '../../src/net/watch.js';

function fakeIo(offLoop?: (fd: number) => Promise<void>) {
  const calls: string[] = [];
  const io: WatchIo = {
    pollReadable: () => ({ stop: () => void calls.push('poll stopped') }),
    close: (fd) => void calls.push(`close ${fd}`),
    ...(offLoop ? { closeOffLoop: (fd: number) => (calls.push(`closeOffLoop ${fd}`), offLoop(fd)) } : {}),
  };
  const warnings: string[] = [];
  const log = { warn: (_o: object, msg: string) => void warnings.push(msg), error: () => {} };
  const watch = new SocketWatch(
    io,
    7,
    () => null,
    () => {},
    log,
    'test server',
  );
  return { calls, warnings, watch };
}

describe('SocketWatch.stop', () => {
  it('without an off-loop close: stops the poll and closes the fd at once, once', async () => {
    const { calls, watch } = fakeIo();
    expect(watch.stop()).toBe(true);
    expect(watch.stop()).toBe(false);
    expect(calls).toEqual(['poll stopped', 'close 7']);
    expect(watch.fd).toBe(-1);
    await watch.closed;
  });

  it('with one: the fd closes on the pool, and closed settles only when that close is done', async () => {
    let done!: () => void;
    const { calls, watch } = fakeIo(() => new Promise<void>((r) => (done = r)));
    expect(watch.stop()).toBe(true);
    expect(watch.stop()).toBe(false);
    expect(calls).toEqual(['poll stopped', 'closeOffLoop 7']);
    let settled = false;
    const closed = watch.closed.then(() => (settled = true));
    await new Promise((r) => setImmediate(r));
    expect(settled).toBe(false);
    done();
    await closed;
    expect(settled).toBe(true);
  });

  it('a close that fails off the loop is logged, and closed still settles', async () => {
    const { warnings, watch } = fakeIo(() => Promise.reject(new Error('EBADF')));
    watch.stop();
    await watch.closed;
    expect(warnings).toEqual(['test server: closing the socket failed']);
  });
});
