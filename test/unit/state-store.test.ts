import { describe, it, expect, beforeEach, afterEach } from 'vitest';
import { mkdtempSync, rmSync, statSync, readdirSync, writeFileSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { StateStore } from '../../src/state/store.js';
import { RECORD_KIND, newRecord, recordProblems, type PodRecord } from '../../src/state/record.js';
import { isVmpodError } from '../../src/errors.js';

function sample(key = 'pod-1'): PodRecord {
  return {
    kind: RECORD_KIND,
    key,
    desc: { podId: 'uid-1', podNs: 'default', podName: 'vm1', DNS: null },
    nsPath: `/var/run/netns/${key}`,
    phase: 'adding',
    steps: [
      { name: 'netns', target: key, do: [{ op: 'netns-add', name: key }], undo: [{ op: 'netns-del', name: key }] },
      {
        name: 'cni-add',
        target: 'virtlet-eth0',
        do: [{ op: 'cni-add', ifName: 'virtlet-eth0' }],
        undo: [{ op: 'cni-del', ifName: 'virtlet-eth0' }],
      },
      {
        name: 'bridge',
        target: 'br0',
        do: [{ op: 'ip', args: ['link', 'add', 'name', 'br0', 'type', 'bridge'] }],
        undo: [{ op: 'ip', args: ['link', 'del', 'dev', 'br0'] }],
      },
    ],
    cniIfNames: ['virtlet-eth0'],
    interfaces: [],
    createdAt: '2024-01-01T00:00:00.000Z',
  };
}

describe('StateStore', () => {
  let base: string;
  let dir: string;
  beforeEach(() => {
    base = mkdtempSync(join(tmpdir(), 'vmpod-state-'));
    dir = join(base, 'state');
  });
  afterEach(() => rmSync(base, { recursive: true, force: true }));

  it('round-trips a record; the file is 0600 in a 0700 dir; a rewrite swaps with the scratch file, which goes with the record', async () => {
    const s = new StateStore(dir);
    expect(s.read('pod-1')).toBeUndefined();
    expect(s.keys()).toEqual([]);
    const rec = sample();
    s.write(rec);
    expect(s.read('pod-1')).toEqual(rec);
    expect(statSync(join(dir, 'pod-1.json')).mode & 0o777).toBe(0o600);
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    expect(readdirSync(dir)).toEqual(['pod-1.json']); // the first write renames its scratch into place
    const first = statSync(join(dir, 'pod-1.json')).ino;
    rec.phase = 'ready';
    s.write(rec);
    expect(s.read('pod-1')!.phase).toBe('ready');
    // the rewrite swapped names: the old record is the scratch now (a temporary file, never read as a record)
    expect(readdirSync(dir).sort()).toEqual(['.tmp-pod-1', 'pod-1.json']);
    expect(statSync(join(dir, '.tmp-pod-1')).ino).toBe(first);
    rec.phase = 'releasing';
    s.write(rec);
    expect(statSync(join(dir, 'pod-1.json')).ino).toBe(first); // no new inode: the two files take turns
    expect(statSync(join(dir, 'pod-1.json')).mode & 0o777).toBe(0o600);
    expect(s.read('pod-1')!.phase).toBe('releasing');
    s.write(sample('pod-0'));
    expect(s.keys()).toEqual(['pod-0', 'pod-1']);
    s.remove('pod-1');
    s.remove('pod-1');
    expect(s.keys()).toEqual(['pod-0']);
    // nothing of a removed record stays: the dir holds the live records only
    expect(readdirSync(dir).sort()).toEqual(['pod-0.json']);
    const small = { ...sample('p2'), desc: { podId: 'p', podNs: 'n', podName: 'x' } };
    s.write({ ...small, desc: { ...small.desc, podName: 'x'.repeat(500) } });
    s.write(small);
    // written over and cut to length: nothing of the longer record that was in that file before
    expect(s.read('p2')).toEqual(small);
    await s.removeAsync('p2');
    expect(readdirSync(dir).sort()).toEqual(['pod-0.json']);
    // a restart sweeps the temporary files of no record, and keeps a record's scratch file, which its next write
    // reuses: the record is whole either way
    s.write(sample('pod-0'));
    writeFileSync(join(dir, '.tmp-pod-9'), '{"half');
    expect(readdirSync(dir).sort()).toEqual(['.tmp-pod-0', '.tmp-pod-9', 'pod-0.json']);
    expect(new StateStore(dir).sweepTemps()).toEqual(['.tmp-pod-9']);
    expect(new StateStore(dir).read('pod-0')).toEqual(sample('pod-0'));
    writeFileSync(join(dir, '.tmp-pod-0'), '{"half');
    const again = new StateStore(dir);
    again.write({ ...sample('pod-0'), phase: 'releasing' });
    expect(again.read('pod-0')).toEqual({ ...sample('pod-0'), phase: 'releasing' });
  });

  it('a new store on the same dir reads what the old one wrote', () => {
    new StateStore(dir).write(sample());
    expect(new StateStore(dir).read('pod-1')).toEqual(sample());
  });

  it('ignores temporary files left by a crash between write and rename', () => {
    const s = new StateStore(dir);
    s.write(sample());
    writeFileSync(join(dir, '.tmp-pod-2-1-abcd'), '{"half');
    expect(s.keys()).toEqual(['pod-1']);
  });

  it('never leaves a half-written record: the old one or the new one', () => {
    const s = new StateStore(dir);
    s.write(sample());
    const before = readFileSync(join(dir, 'pod-1.json'), 'utf8');
    const bad = sample();
    (bad as unknown as { desc: unknown }).desc = {
      toJSON() {
        throw new Error('boom');
      },
    };
    expect(() => s.write(bad)).toThrow();
    expect(readFileSync(join(dir, 'pod-1.json'), 'utf8')).toBe(before);
  });

  it('a corrupt record is a State error naming the file and the problems', () => {
    const s = new StateStore(dir);
    s.write(sample());
    writeFileSync(join(dir, 'pod-1.json'), '{"kind":"vmpodPodV1",');
    try {
      s.read('pod-1');
      expect.unreachable();
    } catch (e) {
      expect(isVmpodError(e) && e.code).toBe('STATE');
      expect(String((e as Error).message)).toMatch(/state record .*pod-1\.json for key pod-1 is corrupt: not JSON/);
    }
    writeFileSync(
      join(dir, 'pod-1.json'),
      JSON.stringify({ ...sample(), kind: 'other', phase: 'weird', steps: [{ name: 'zap', do: [], undo: [] }] }),
    );
    expect(() => s.read('pod-1')).toThrow(
      /kind is "other", expected "vmpodPodV1"; phase "weird" is not one of adding, ready, releasing; steps\[0\]: unknown step "zap"/,
    );
    writeFileSync(join(dir, 'pod-1.json'), JSON.stringify(sample('pod-9')));
    expect(() => s.read('pod-1')).toThrow(/key is "pod-9", expected "pod-1"/);
  });

  it('refuses keys that are not safe file names, before touching the disk', () => {
    const s = new StateStore(dir);
    expect(() => s.read('../etc')).toThrow(/bad key/);
    expect(() => s.write(sample('a/b'))).toThrow(/bad key/);
    expect(() => statSync(dir)).toThrow();
  });
});

describe('record', () => {
  it('newRecord fills kind, interfaces and createdAt, and its record parses', () => {
    const rec = newRecord({
      key: 'pod-1',
      desc: sample().desc,
      nsPath: '/var/run/netns/pod-1',
      phase: 'adding',
      steps: sample().steps,
      cniIfNames: ['virtlet-eth0'],
    });
    expect(rec).toEqual({ ...sample(), createdAt: rec.createdAt });
    expect(Object.keys(rec)).toEqual(Object.keys(sample()));
    expect(Number.isNaN(Date.parse(rec.createdAt))).toBe(false);
    expect(recordProblems(JSON.parse(JSON.stringify(rec)), 'pod-1')).toEqual([]);
  });

  it('a sysctl op takes "name=value" settings only', () => {
    const withOp = (op: unknown) => ({
      ...sample(),
      steps: [{ name: 'rp-filter', target: 'pod-1', do: [op], undo: [] }],
    });
    expect(recordProblems(withOp({ op: 'sysctl', settings: ['net.ipv4.conf.all.rp_filter=0'] }), 'pod-1')).toEqual([]);
    for (const settings of [undefined, ['net.ipv4.conf.all.rp_filter'], ['a=1 b=2'], [3]]) {
      expect(recordProblems(withOp({ op: 'sysctl', settings }), 'pod-1')).toEqual([
        'steps[0].do[0]: sysctl op without "name=value" settings',
      ]);
    }
  });
});
