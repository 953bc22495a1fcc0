import { describe, expect, it } from 'vitest';
import { unpooled } from '../../src/buffers.js';

describe('unpooled', () => {
  it('copies buffers cut from the shared pool into one allocation of their total size, in order', () => {
    const pooled = [Buffer.from('ab'), Buffer.from(''), Buffer.from('cde')];
    expect(pooled[0]!.buffer.byteLength).toBe(Buffer.poolSize);
    const own = unpooled(pooled);
    expect(own.map((b) => b.toString())).toEqual(['ab', '', 'cde']);
    for (const b of own) expect(b.buffer.byteLength).toBe(5);
    pooled[0]!.write('zz');
    expect(own[0]!.toString()).toBe('ab');
    expect(unpooled([])).toEqual([]);
  });
});
