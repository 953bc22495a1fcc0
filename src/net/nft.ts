// nf_tables over netlink (the kernel's uapi linux/netfilter/nf_tables.h, nfnetlink.h): one transaction that makes a
// table of the bridge family with its base chains and rules, or deletes a table. Integers in nf_tables attributes are
// big-endian. Pure.
import { cstr, nlMessage, type Attr } from './rtnl.js';

const NFNL_SUBSYS_NFTABLES = 10;
const NFNL_MSG_BATCH_BEGIN = 0x10;
const NFNL_MSG_BATCH_END = 0x11;
const MSG = { NEWTABLE: 0, DELTABLE: 2, NEWCHAIN: 3, NEWRULE: 6 } as const;
const NLM_F_REQUEST = 1;
const NLM_F_ACK = 4;
const NLM_F_EXCL = 0x200;
const NLM_F_CREATE = 0x400;
const NLM_F_APPEND = 0x800;
export const NFPROTO_BRIDGE = 7;

export function be32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeInt32BE(n | 0);
  return b;
}

/** The bridge family's hooks (NF_BR_*) by ebtables' chain names. */
export const BRIDGE_HOOKS = { INPUT: 1, FORWARD: 2, OUTPUT: 3 } as const;
/** ebtables' filter priority in the bridge family (NF_BR_PRI_FILTER_BRIDGED) */
const PRI_FILTER = -200;

/** One expression: its name and its attributes. */
export type Expr = [name: string, data: Attr[]];

const REG_VERDICT = 0;
export const REG_1 = 1;
export const PAYLOAD_BASE = { LL: 0, NETWORK: 1, TRANSPORT: 2 } as const;
export const META_KEY = { PROTOCOL: 1, IIFNAME: 6, OIFNAME: 7, L4PROTO: 16 } as const;
const NF_DROP = 0;

export const meta = (key: number): Expr => [
  'meta',
  [
    [1, be32(REG_1)],
    [2, be32(key)],
  ],
];
export const payload = (base: number, offset: number, len: number): Expr => [
  'payload',
  [
    [1, be32(REG_1)],
    [2, be32(base)],
    [3, be32(offset)],
    [4, be32(len)],
  ],
];
/** register 1 equals these bytes */
export const cmpEq = (data: Buffer): Expr => [
  'cmp',
  [
    [1, be32(REG_1)],
    [2, be32(0)],
    [3, [[1, data]]],
  ],
];
export const drop = (): Expr => [
  'immediate',
  [
    [1, be32(REG_VERDICT)],
    [2, [[2, [[1, be32(NF_DROP)]]]]],
  ],
];

export interface NftChain {
  name: string;
  hook: number;
  rules: Expr[][];
}

/** An nf_tables message (the batch's own two are outside the subsystem: `bare`) with an nfgenmsg. */
function message(type: number, flags: number, attrs: Attr[], seq: number, bare = false): Buffer {
  const gen = Buffer.alloc(4);
  gen[0] = bare ? 0 : NFPROTO_BRIDGE;
  gen.writeUInt16BE(bare ? NFNL_SUBSYS_NFTABLES : 0, 2);
  const { msg } = nlMessage(
    bare ? type : (NFNL_SUBSYS_NFTABLES << 8) | type,
    flags | NLM_F_REQUEST,
    gen,
    attrs,
    undefined,
    true,
  );
  msg.writeUInt32LE(seq, 8);
  return msg;
}

function batch(inner: ((seq: number) => Buffer)[]): Buffer {
  const out = [message(NFNL_MSG_BATCH_BEGIN, 0, [], 1, true)];
  inner.forEach((m, i) => out.push(m(i + 2)));
  out.push(message(NFNL_MSG_BATCH_END, 0, [], inner.length + 2, true));
  return Buffer.concat(out);
}

/** A transaction that makes the table (it must not exist), its base chains (policy accept) and their rules. */
export function newTableBatch(table: string, chains: readonly NftChain[]): Buffer {
  const msgs: ((seq: number) => Buffer)[] = [
    (seq) => message(MSG.NEWTABLE, NLM_F_CREATE | NLM_F_EXCL | NLM_F_ACK, [[1, cstr(table)]], seq),
  ];
  for (const c of chains) {
    msgs.push((seq) =>
      message(
        MSG.NEWCHAIN,
        NLM_F_CREATE | NLM_F_ACK,
        [
          [1, cstr(table)],
          [3, cstr(c.name)],
          [
            4,
            [
              [1, be32(c.hook)],
              [2, be32(PRI_FILTER)],
            ],
          ],
          [5, be32(1)],
          [7, cstr('filter')],
        ],
        seq,
      ),
    );
    for (const exprs of c.rules) {
      const list: Attr[] = exprs.map(([name, data]) => [
        1,
        [
          [1, cstr(name)],
          [2, data],
        ],
      ]);
      msgs.push((seq) =>
        message(
          MSG.NEWRULE,
          NLM_F_CREATE | NLM_F_APPEND | NLM_F_ACK,
          [
            [1, cstr(table)],
            [2, cstr(c.name)],
            [4, list],
          ],
          seq,
        ),
      );
    }
  }
  return batch(msgs);
}

/** A transaction that deletes the table with everything in it. */
export function delTableBatch(table: string): Buffer {
  return batch([(seq) => message(MSG.DELTABLE, NLM_F_ACK, [[1, cstr(table)]], seq)]);
}
