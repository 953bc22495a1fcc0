import { describe, it, expect } from 'vitest';
import { allowedByCred, groupsFromStatus, peerAllowed } from '../../src/protocol/peer.js';

describe('groupsFromStatus', () => {
  it('reads the supplementary groups of /proc/<pid>/status', () => {
    expect(groupsFromStatus('Name:\tx\nGid:\t100\t100\t100\t100\nGroups:\t27 100 65534 \nNStgid:\t1\n')).toEqual([
      27, 100, 65534,
    ]);
    expect(groupsFromStatus('Name:\tx\nGroups:\t\nNStgid:\t1\n')).toEqual([]);
    expect(groupsFromStatus('Name:\tx\n')).toEqual([]);
  });
});

describe('the peer rule', () => {
  const never = (): number[] => {
    throw new Error('groups read although the credentials decide');
  };

  it('uid 0 and an allowed primary gid are decided by the credentials alone', () => {
    expect(allowedByCred({ uid: 0, gid: 5 }, [])).toBe(true);
    expect(allowedByCred({ uid: 1000, gid: 7 }, [7])).toBe(true);
    expect(allowedByCred({ uid: 1000, gid: 8 }, [7])).toBe(false);
    expect(peerAllowed({ uid: 0, gid: 5 }, [], never)).toBe(true);
    expect(peerAllowed({ uid: 1000, gid: 7 }, [7], never)).toBe(true);
  });

  it('otherwise a supplementary group must be allowed; with no allowed group none is read', () => {
    expect(peerAllowed({ uid: 1000, gid: 8 }, [7], () => [3, 7])).toBe(true);
    expect(peerAllowed({ uid: 1000, gid: 8 }, [7], () => [3])).toBe(false);
    expect(peerAllowed({ uid: 1000, gid: 8 }, [], never)).toBe(false);
  });
});
