// Spare files (src/files.ts) and their users that no other test reaches alone: the CNI cache writes into a spare and
// gives its file back; a spare written over holds nothing of what it held.
import { describe, it, expect, beforeEach, afterEach } from 'vitest';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Spares } from '../../src/files.js';
import { removeCacheRecord, writeCacheRecord } from '../../src/cni/cache.js';

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'vmpod-spares-'));
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

const rec = (result: unknown) => ({ kind: 'cniCacheV1', containerId: 'c1', ifName: 'eth0', networkName: 'n', config: '', result }) as never;

describe('Spares', () => {
  it('gives a file into the pool and takes the same inode back under another name; none left: false', async () => {
    const s = new Spares(join(dir, '.spare'));
    const a = join(dir, 'a');
    writeFileSync(a, 'x');
    const ino = statSync(a).ino;
    expect(await s.give(a)).toBe(true);
    expect(readdirSync(dir).sort()).toEqual(['.spare']);
    expect(s.take(join(dir, 'b'))).toBe(true);
    expect(statSync(join(dir, 'b')).ino).toBe(ino);
    expect(s.take(join(dir, 'c'))).toBe(false);
    // a missing file is nothing to give; a full pool says false (the caller deletes)
    expect(await s.give(join(dir, 'nosuch'))).toBe(true);
    const one = new Spares(join(dir, '.one'), 1);
    writeFileSync(a, 'x');
    expect(one.giveSync(a)).toBe(true);
    writeFileSync(a, 'y');
    expect(one.giveSync(a)).toBe(false);
  });

  it('keeps a spare that cannot go where asked (the directory is missing), and drops one gone from its dir', () => {
    const s = new Spares(join(dir, '.spare'));
    writeFileSync(join(dir, 'a'), 'x');
    expect(s.giveSync(join(dir, 'a'))).toBe(true);
    expect(s.take(join(dir, 'nodir', 'b'))).toBe(false);
    expect(s.take(join(dir, 'b'))).toBe(true);
    writeFileSync(join(dir, 'c'), 'x');
    expect(s.giveSync(join(dir, 'c'))).toBe(true);
    for (const n of readdirSync(join(dir, '.spare'))) rmSync(join(dir, '.spare', n));
    expect(s.take(join(dir, 'd'))).toBe(false);
    writeFileSync(join(dir, 'e'), 'x');
    expect(s.giveSync(join(dir, 'e'))).toBe(true);
    expect(s.take(join(dir, 'f'))).toBe(true);
  });

  it('a new pool on the same dir finds the spares an earlier one left, and names new ones after them', async () => {
    const s = new Spares(join(dir, '.spare'));
    for (const n of ['a', 'b']) {
      writeFileSync(join(dir, n), n);
      expect(s.giveSync(join(dir, n))).toBe(true);
    }
    const again = new Spares(join(dir, '.spare'));
    writeFileSync(join(dir, 'c'), 'c');
    expect(again.giveSync(join(dir, 'c'))).toBe(true);
    expect(readdirSync(join(dir, '.spare'))).toHaveLength(3);
  });
});

describe('the CNI cache with spares', () => {
  it('writes a record into a spare (nothing of the longer file it was is left) and gives the file back on removal', async () => {
    const s = new Spares(join(dir, '.spare'));
    const old = join(dir, 'old');
    writeFileSync(old, 'z'.repeat(5000));
    const ino = statSync(old).ino;
    expect(s.giveSync(old)).toBe(true);
    const path = join(dir, 'results', 'n-c1-eth0');
    writeCacheRecord(path, rec({ ips: [] }), s);
    expect(statSync(path).ino).toBe(ino);
    expect(JSON.parse(readFileSync(path, 'utf8'))).toEqual(JSON.parse(JSON.stringify(rec({ ips: [] }))));
    expect(readdirSync(join(dir, 'results'))).toEqual(['n-c1-eth0']);
    await removeCacheRecord(path, s);
    expect(readdirSync(join(dir, 'results'))).toEqual([]);
    expect(readdirSync(join(dir, '.spare')).map((n) => statSync(join(dir, '.spare', n)).ino)).toEqual([ino]);
    // without a spare on hand: a new file, removed as before
    const t = new Spares(join(dir, '.empty'), 0);
    writeCacheRecord(path, rec({}), t);
    await removeCacheRecord(path, t);
    expect(readdirSync(join(dir, 'results'))).toEqual([]);
  });
});
