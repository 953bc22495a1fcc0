// Traffic control over rtnetlink (the kernel's uapi linux/rtnetlink.h, pkt_sched.h, pkt_cls.h, tc_act/tc_mirred.h): a
// root noqueue qdisc (a tap's), an ingress qdisc, and u32 filters on it that either keep a frame (a terminal match
// with a class id and no action: the frame goes on up the stack) or redirect it to another link's egress (the mirred
// action). The bytes are what iproute2's `tc` sends for the same command (test/unit/tc-codec.test.ts holds them). Pure.
import { NLM_F, RTM, cstr, nlMessage, u32, type Attr, type NlRequest } from './rtnl.js';

/** TC_H_ROOT: a root qdisc's parent. */
const TC_H_ROOT = 0xffffffff;
/** TC_H_INGRESS: the ingress qdisc's parent; its handle is ffff:0, and its filters' parent. */
const TC_H_INGRESS = 0xfffffff1;
export const INGRESS_HANDLE = 0xffff0000;
const TCA = { KIND: 1, OPTIONS: 2 } as const;
const TCA_U32 = { CLASSID: 1, SEL: 5, ACT: 7 } as const;
const TC_U32_TERMINAL = 1;
const TCA_ACT = { KIND: 1, OPTIONS: 2 } as const;
const NLA_F_NESTED = 0x8000;
const TCA_MIRRED_PARMS = 2;
const TCA_EGRESS_REDIR = 1;
const TC_ACT_STOLEN = 4;
/** The most keys one u32 selector holds (iproute2's limit). */
const MAX_KEYS = 128;

/** EtherTypes a filter matches by name, as tc's `protocol`. */
export const TC_PROTOCOLS: Record<string, number> = { all: 0x0003, ip: 0x0800, arp: 0x0806, ipv6: 0x86dd };

/** One 32-bit key of a u32 selector: (word at `off` from the network header & mask) == val; mask and val big-endian. */
export interface U32Key {
  mask: number;
  val: number;
  off: number;
}

/** What a matching frame gets: kept (class id, no action) or redirected to the egress of link `redirectTo`. */
export type FilterTarget = { classid: number } | { redirectTo: string };

export interface U32Filter {
  dev: string;
  prio: number;
  /** a TC_PROTOCOLS name */
  protocol: string;
  keys: readonly U32Key[];
  target: FilterTarget;
}

function tcmsg(handle: number, parent: number, info: number): Buffer {
  const b = Buffer.alloc(20);
  b.writeUInt32LE(handle >>> 0, 8);
  b.writeUInt32LE(parent >>> 0, 12);
  b.writeUInt32LE(info >>> 0, 16);
  return b;
}

/** `tc qdisc replace dev DEV root noqueue`: the link transmits straight to its driver. */
export function rootNoqueue(dev: string): NlRequest {
  return nlMessage(RTM.NEWQDISC, NLM_F.CREATE | NLM_F.REPLACE, tcmsg(0, TC_H_ROOT, 0), [[TCA.KIND, cstr('noqueue')]], {
    at: 4,
    name: dev,
  });
}

/** `tc qdisc add|del dev DEV ingress`. */
export function ingressQdisc(dev: string, del = false): NlRequest {
  return nlMessage(
    del ? RTM.DELQDISC : RTM.NEWQDISC,
    del ? 0 : NLM_F.CREATE | NLM_F.EXCL,
    tcmsg(INGRESS_HANDLE, TC_H_INGRESS, 0),
    [[TCA.KIND, cstr('ingress')]],
    { at: 4, name: dev },
  );
}

/**
 * `match u8|u16|u32 VALUE MASK at OFF` as tc packs it: the value shifted into the aligned word at OFF & ~3, merged into
 * the key of that word when there is one. Returns false when the match contradicts that key, or is misaligned.
 */
export function packMatch(keys: U32Key[], bits: 8 | 16 | 32, value: number, mask: number, at: number): boolean {
  if (bits === 16 && at % 2 !== 0) return false;
  if (bits === 32 && at % 4 !== 0) return false;
  const shift = bits === 32 ? 0 : bits === 16 ? 16 - 8 * (at & 2) : 24 - 8 * (at & 3);
  const m = bits === 32 ? mask >>> 0 : ((mask & (bits === 16 ? 0xffff : 0xff)) << shift) >>> 0;
  const v = ((value << shift) & m) >>> 0;
  const off = at - (at & 3);
  const same = keys.find((k) => k.off === off);
  if (same) {
    if (((same.val ^ v) & same.mask & m) !== 0) return false;
    same.val = (same.val | v) >>> 0;
    same.mask = (same.mask | m) >>> 0;
    return true;
  }
  if (keys.length >= MAX_KEYS) return false;
  keys.push({ mask: m, val: v, off });
  return true;
}

/** struct tc_u32_sel (terminal) with its keys. */
function selector(keys: readonly U32Key[]): Buffer {
  const b = Buffer.alloc(16 + 16 * keys.length);
  b[0] = TC_U32_TERMINAL;
  b[2] = keys.length;
  keys.forEach((k, i) => {
    b.writeUInt32BE(k.mask >>> 0, 16 + i * 16);
    b.writeUInt32BE(k.val >>> 0, 20 + i * 16);
    b.writeInt32LE(k.off, 24 + i * 16);
  });
  return b;
}

/** The mirred action `egress redirect dev TO` as action 1 of a filter. */
function redirectAction(to: string): Attr {
  const parms = Buffer.alloc(28);
  parms.writeInt32LE(TC_ACT_STOLEN, 8);
  parms.writeInt32LE(TCA_EGRESS_REDIR, 20);
  return [
    TCA_U32.ACT,
    [
      [
        1,
        [
          [TCA_ACT.KIND, cstr('mirred')],
          [TCA_ACT.OPTIONS | NLA_F_NESTED, [[TCA_MIRRED_PARMS, { bytes: parms, at: 24, ifindexOf: to }]]],
        ],
      ],
    ],
  ];
}

/**
 * `tc filter add dev DEV parent ffff: prio P protocol PROTO u32 <keys> (classid C | action mirred egress redirect dev
 * T)`.
 */
export function u32FilterRequest(f: U32Filter): NlRequest {
  const proto = TC_PROTOCOLS[f.protocol];
  if (proto === undefined) throw new RangeError(`unknown tc protocol ${JSON.stringify(f.protocol)}`);
  // tcm_info: the priority in the high half, the EtherType in network order in the low half
  const info = ((f.prio << 16) | (((proto & 0xff) << 8) | (proto >> 8))) >>> 0;
  const opts: Attr[] =
    'classid' in f.target ? [[TCA_U32.CLASSID, u32(f.target.classid)]] : [redirectAction(f.target.redirectTo)];
  opts.push([TCA_U32.SEL, selector(f.keys)]);
  return nlMessage(
    RTM.NEWTFILTER,
    NLM_F.CREATE | NLM_F.EXCL,
    tcmsg(0, INGRESS_HANDLE, info),
    [
      [TCA.KIND, cstr('u32')],
      [TCA.OPTIONS, opts],
    ],
    { at: 4, name: f.dev },
  );
}
