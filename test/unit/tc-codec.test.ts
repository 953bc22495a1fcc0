// The tc lines of the tc-redirect binding as rtnetlink requests: golden bytes captured from iproute2 6.1's `tc` (strace
// -xx of its sendmsg, in a netns where link "va" is ifindex 3 and tap "t0" ifindex 4), and the lines the codec refuses.
import { describe, expect, it } from 'vitest';
import { isVmpodError } from '../../src/errors.js';
import { NLM_F, RTM } from '../../src/net/rtnl.js';
import { packMatch, type U32Key } from '../../src/net/tc.js';
import { tcRequest } from '../../src/podnet/tclines.js';

const INDEX: Record<string, number> = { va: 3, t0: 4 };

/** strace's "\x.." text as bytes */
const sx = (s: string): Buffer => Buffer.from(s.replace(/\\x/g, ''), 'hex');
const hex = (s: string): Buffer => Buffer.from(s.replace(/\s+/g, ''), 'hex');

/** The message as the addon sends it minus its header's sequence and the request/ack flags (it sets them): fixes applied. */
function built(line: string): { type: number; flags: number; body: Buffer } {
  const req = tcRequest(line.split(' '));
  if (!('msg' in req)) throw new Error('not a netlink message');
  const msg = Buffer.from(req.msg);
  for (const f of req.fix) msg.writeUInt32LE(INDEX[f.name]!, f.offset);
  expect(msg.readUInt32LE(0)).toBe(msg.length);
  return { type: msg.readUInt16LE(4), flags: msg.readUInt16LE(6), body: msg.subarray(16) };
}

const TCMSG_VA = (handle: string, parent: string, info: string) => hex(`00000000 03000000 ${handle} ${parent} ${info}`);

describe('tc lines as tc sends them', () => {
  it('qdisc add dev va ingress', () => {
    const m = built('qdisc add dev va ingress');
    expect(m.type).toBe(RTM.NEWQDISC);
    expect(m.flags).toBe(NLM_F.CREATE | NLM_F.EXCL);
    expect(m.body).toEqual(
      Buffer.concat([
        TCMSG_VA('0000ffff', 'f1ffffff', '00000000'),
        hex('0c000100'),
        sx('\\x69\\x6e\\x67\\x72\\x65\\x73\\x73\\x00'),
      ]),
    );
  });

  it('qdisc del dev va ingress', () => {
    const m = built('qdisc del dev va ingress');
    expect(m.type).toBe(RTM.DELQDISC);
    expect(m.flags).toBe(0);
    expect(m.body).toEqual(
      Buffer.concat([
        TCMSG_VA('0000ffff', 'f1ffffff', '00000000'),
        hex('0c000100'),
        sx('\\x69\\x6e\\x67\\x72\\x65\\x73\\x73\\x00'),
      ]),
    );
  });

  it('qdisc replace dev va root noqueue (a tap, before it is up)', () => {
    const m = built('qdisc replace dev va root noqueue');
    expect(m.type).toBe(RTM.NEWQDISC);
    expect(m.flags).toBe(NLM_F.CREATE | NLM_F.REPLACE);
    expect(m.body).toEqual(
      Buffer.concat([
        TCMSG_VA('00000000', 'ffffffff', '00000000'),
        hex('0c000100'),
        sx('\\x6e\\x6f\\x71\\x75\\x65\\x75\\x65\\x00'),
      ]),
    );
  });

  it('a kept frame: u32 match udp dport 68 classid ffff:1 (no action)', () => {
    const m = built(
      'filter add dev va parent ffff: prio 1 protocol ip u32 match u8 17 0xff at 9 match u16 68 0xffff at 22 classid ffff:1',
    );
    expect(m.type).toBe(RTM.NEWTFILTER);
    expect(m.flags).toBe(NLM_F.CREATE | NLM_F.EXCL);
    const options = sx(
      '\\x08\\x00\\x01\\x00\\x01\\x00\\xff\\xff\\x34\\x00\\x05\\x00\\x01\\x00\\x02\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\xff\\x00\\x00\\x00\\x11\\x00\\x00\\x08\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\xff\\xff\\x00\\x00\\x00\\x44\\x14\\x00\\x00\\x00\\x00\\x00\\x00\\x00',
    );
    expect(m.body).toEqual(
      Buffer.concat([
        TCMSG_VA('00000000', '0000ffff', '08000100'),
        hex('08000100'),
        sx('\\x75\\x33\\x32\\x00'),
        hex('40000200'),
        options,
      ]),
    );
  });

  it('the redirect: u32 match-all, action mirred egress redirect dev t0', () => {
    const m = built(
      'filter add dev va parent ffff: prio 9 protocol all u32 match u8 0 0 at 0 action mirred egress redirect dev t0',
    );
    const options = sx(
      '\\x38\\x00\\x07\\x00\\x34\\x00\\x01\\x00\\x0b\\x00\\x01\\x00\\x6d\\x69\\x72\\x72\\x65\\x64\\x00\\x00\\x24\\x00\\x02\\x80\\x20\\x00\\x02\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x04\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x01\\x00\\x00\\x00\\x04\\x00\\x00\\x00\\x24\\x00\\x05\\x00\\x01\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00',
    );
    expect(m.body).toEqual(
      Buffer.concat([
        TCMSG_VA('00000000', '0000ffff', '00030900'),
        hex('08000100'),
        sx('\\x75\\x33\\x32\\x00'),
        hex('60000200'),
        options,
      ]),
    );
  });
});

describe('u32 keys', () => {
  it('packs matches into aligned words as tc does, merging those of one word', () => {
    const keys: U32Key[] = [];
    expect(packMatch(keys, 16, 67, 0xffff, 22)).toBe(true);
    expect(packMatch(keys, 16, 68, 0xffff, 20)).toBe(true);
    expect(packMatch(keys, 8, 0x3a, 0xff, 6)).toBe(true);
    expect(packMatch(keys, 32, 0xa9fefe02, 0xffffffff, 24)).toBe(true);
    expect(keys).toEqual([
      { off: 20, mask: 0xffffffff, val: 0x00440043 },
      { off: 4, mask: 0x0000ff00, val: 0x00003a00 },
      { off: 24, mask: 0xffffffff, val: 0xa9fefe02 },
    ]);
  });

  it('refuses a contradiction and a misaligned match', () => {
    const keys: U32Key[] = [];
    expect(packMatch(keys, 8, 17, 0xff, 9)).toBe(true);
    expect(packMatch(keys, 8, 6, 0xff, 9)).toBe(false);
    expect(packMatch(keys, 16, 1, 0xffff, 3)).toBe(false);
    expect(packMatch(keys, 32, 1, 0xffffffff, 2)).toBe(false);
  });
});

describe('lines the planner never writes', () => {
  it.each([
    ['qdisc add dev va clsact'],
    ['qdisc add va ingress'],
    ['filter add dev va parent 1: prio 1 protocol ip u32 match u8 0 0 at 0 classid ffff:1'],
    ['filter add dev va parent ffff: prio 0 protocol ip u32 match u8 0 0 at 0 classid ffff:1'],
    ['filter add dev va parent ffff: prio 1 protocol ipx u32 match u8 0 0 at 0 classid ffff:1'],
    ['filter add dev va parent ffff: prio 1 protocol ip flower classid ffff:1'],
    ['filter add dev va parent ffff: prio 1 protocol ip u32 classid ffff:1'],
    ['filter add dev va parent ffff: prio 1 protocol ip u32 match u8 0 0 at 0'],
    ['filter add dev va parent ffff: prio 1 protocol ip u32 match u8 0 0 at 0 action drop'],
    ['filter add dev va parent ffff: prio 1 protocol ip u32 match u9 0 0 at 0 classid ffff:1'],
  ])('%s: an Internal error', (line) => {
    let err: unknown;
    try {
      tcRequest(line.split(' '));
    } catch (e) {
      err = e;
    }
    expect(isVmpodError(err) && err.code).toBe('INTERNAL');
  });
});
