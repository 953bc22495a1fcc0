import { describe, it, expect } from 'vitest';
import { Slots } from '../../src/tapmanager/slots.js';

/** A run that waits until released; records when it started. */
function gate(started: string[], id: string) {
  let open!: () => void;
  const p = new Promise<void>((r) => (open = r));
  return { open, fn: async () => (started.push(id), await p, id) };
}

describe('Slots', () => {
  it('runs at most n at once, the rest in start order', async () => {
    const s = new Slots(2);
    const started: string[] = [];
    const g = ['a', 'b', 'c', 'd'].map((id) => gate(started, id));
    const all = g.map((x, i) => s.run(['a', 'b', 'c', 'd'][i]!, x.fn));
    await new Promise((r) => setImmediate(r));
    expect(started).toEqual(['a', 'b']);
    g[1]!.open();
    await new Promise((r) => setImmediate(r));
    expect(started).toEqual(['a', 'b', 'c']);
    for (const x of g) x.open();
    expect(await Promise.all(all)).toEqual(['a', 'b', 'c', 'd']);
  });

  it('a promoted run takes the next free slot; promoting a running or unknown id changes nothing', async () => {
    const s = new Slots(1);
    const started: string[] = [];
    const ids = ['a', 'b', 'c', 'd'];
    const g = ids.map((id) => gate(started, id));
    const all = g.map((x, i) => s.run(ids[i]!, x.fn));
    await new Promise((r) => setImmediate(r));
    s.promote('d');
    s.promote('a'); // running
    s.promote('zz');
    g[0]!.open();
    await new Promise((r) => setImmediate(r));
    expect(started).toEqual(['a', 'd']);
    for (const x of g) x.open();
    await Promise.all(all);
    expect(started).toEqual(['a', 'd', 'b', 'c']);
  });

  it('a run that throws frees its slot', async () => {
    const s = new Slots(1);
    await expect(s.run('x', async () => Promise.reject(new Error('boom')))).rejects.toThrow('boom');
    expect(await s.run('y', async () => 'ok')).toBe('ok');
  });
});
