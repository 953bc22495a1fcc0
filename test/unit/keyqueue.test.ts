import { describe, it, expect } from 'vitest';
import { KeyQueue } from '../../src/tapmanager/keyqueue.js';

const tick = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('KeyQueue', () => {
  it('never interleaves two operations on one key', async () => {
    const q = new KeyQueue();
    const events: string[] = [];
    const op = (name: string, ms: number) => async () => {
      events.push(`${name} start`);
      await tick(ms);
      events.push(`${name} end`);
      return name;
    };
    const results = await Promise.all([q.run('a', op('a1', 20)), q.run('a', op('a2', 1)), q.run('a', op('a3', 5))]);
    expect(results).toEqual(['a1', 'a2', 'a3']);
    expect(events).toEqual(['a1 start', 'a1 end', 'a2 start', 'a2 end', 'a3 start', 'a3 end']);
  });

  it('runs different keys in parallel', async () => {
    const q = new KeyQueue();
    const events: string[] = [];
    const op = (name: string, ms: number) => async () => {
      events.push(`${name} start`);
      await tick(ms);
      events.push(`${name} end`);
    };
    await Promise.all([q.run('a', op('a', 30)), q.run('b', op('b', 1))]);
    expect(events).toEqual(['a start', 'b start', 'b end', 'a end']);
  });

  it('keeps going after a failed operation and reports the failure to its caller only', async () => {
    const q = new KeyQueue();
    const failed = q.run('a', async () => {
      throw new Error('boom');
    });
    const ok = q.run('a', async () => 'fine');
    await expect(failed).rejects.toThrow('boom');
    await expect(ok).resolves.toBe('fine');
    await q.drain();
    expect(q.busyKeys).toEqual([]);
  });
});
