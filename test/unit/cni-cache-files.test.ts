// The CNI cache's files: a record written whole, and nothing of it left once removed (no pool of spare files).
import { describe, it, expect, beforeEach, afterEach } from 'vitest';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { removeCacheRecord, writeCacheRecord } from '../../src/cni/cache.js';

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), 'vmpod-cache-files-'));
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

const rec = (result: unknown) =>
  ({ kind: 'cniCacheV1', containerId: 'c1', ifName: 'eth0', networkName: 'n', config: '', result }) as never;

describe('the CNI cache files', () => {
  it('writes a record whole (its dir made), and its removal leaves the dir empty; removing it again is fine', async () => {
    const path = join(dir, 'results', 'n-c1-eth0');
    writeCacheRecord(path, rec({ ips: ['x'.repeat(100)] }));
    writeCacheRecord(path, rec({ ips: [] }));
    expect(JSON.parse(readFileSync(path, 'utf8'))).toEqual(JSON.parse(JSON.stringify(rec({ ips: [] }))));
    expect(readdirSync(join(dir, 'results'))).toEqual(['n-c1-eth0']);
    removeCacheRecord(path);
    removeCacheRecord(path);
    expect(readdirSync(dir)).toEqual(['results']);
    expect(readdirSync(join(dir, 'results'))).toEqual([]);
  });
});
