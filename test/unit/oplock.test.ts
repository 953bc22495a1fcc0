import { describe, expect, it } from 'vitest';
import { OpLock } from '../../src/tapmanager/oplock.js';

/** A promise the test settles by hand. */
function gate(): { wait: Promise<void>; open: () => void } {
  let open!: () => void;
  const wait = new Promise<void>((r) => (open = r));
  return { wait, open };
}

const turns = () => new Promise((r) => setImmediate(r));

describe('OpLock', () => {
  it('runs shared holders together and an exclusive one alone, after them', async () => {
    const lock = new OpLock();
    const events: string[] = [];
    const a = gate();
    const b = gate();
    const pa = lock.runShared(async () => (events.push('add a'), await a.wait, events.push('add a done')));
    const pb = lock.runShared(async () => (events.push('add b'), await b.wait, events.push('add b done')));
    const pg = lock.runExclusive(async () => void events.push('gc'));
    await turns();
    expect(events).toEqual(['add a', 'add b']);
    a.open();
    await turns();
    expect(events).toEqual(['add a', 'add b', 'add a done']);
    b.open();
    await Promise.all([pa, pb, pg]);
    expect(events).toEqual(['add a', 'add b', 'add a done', 'add b done', 'gc']);
  });

  it('keeps shared requests that come while an exclusive one waits behind it', async () => {
    const lock = new OpLock();
    const events: string[] = [];
    const a = gate();
    const g = gate();
    const pa = lock.runShared(async () => (await a.wait, events.push('add a done')));
    const pg = lock.runExclusive(async () => (events.push('gc'), await g.wait, events.push('gc done')));
    const pc = lock.runShared(async () => void events.push('add c'));
    a.open();
    await turns();
    expect(events).toEqual(['add a done', 'gc']);
    g.open();
    await Promise.all([pa, pg, pc]);
    expect(events).toEqual(['add a done', 'gc', 'gc done', 'add c']);
  });

  it('lets the next go when a holder throws', async () => {
    const lock = new OpLock();
    await expect(lock.runExclusive(async () => Promise.reject(new Error('gc failed')))).rejects.toThrow('gc failed');
    expect(await lock.runShared(async () => 'add')).toBe('add');
    expect(lock.sharedHolders).toBe(0);
  });
});
