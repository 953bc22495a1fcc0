import { describe, it, expect } from 'vitest';
import { groupsFromStatus } from '../../src/tapmanager/server.js';

describe('groupsFromStatus', () => {
  it('reads the supplementary groups of /proc/<pid>/status', () => {
    expect(groupsFromStatus('Name:\tx\nGid:\t100\t100\t100\t100\nGroups:\t27 100 65534 \nNStgid:\t1\n')).toEqual([27, 100, 65534]);
    expect(groupsFromStatus('Name:\tx\nGroups:\t\nNStgid:\t1\n')).toEqual([]);
    expect(groupsFromStatus('Name:\tx\n')).toEqual([]);
  });
});
