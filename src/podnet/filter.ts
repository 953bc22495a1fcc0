// The DHCP filter's rules (plan.ts writes them in ebtables' words, which the record keeps) turned into an nf_tables
// table of the bridge family: one table per interface, its base chains INPUT, FORWARD and OUTPUT at ebtables' priority,
// made in one transaction by the addon (no ebtables process). Only the forms the planner writes are known; any other
// rule is an Internal error. Pure.
import { ErrorCode, VmpodError } from '../errors.js';
import {
  BRIDGE_HOOKS,
  META_KEY,
  PAYLOAD_BASE,
  cmpEq,
  delTableBatch,
  drop,
  meta,
  newTableBatch,
  payload,
  type Expr,
  type NftChain,
} from '../net/nft.js';
import { cstr, type NlRequest } from '../net/rtnl.js';

const ETHER_TYPES: Record<string, number> = { IPv4: 0x0800, IPv6: 0x86dd };
const L4_PROTOS: Record<string, number> = { udp: 17, 'ipv6-icmp': 58 };
const ICMP6_TYPES: Record<string, number> = { 'router-solicitation': 133, 'router-advertisement': 134 };

/** The table of the filter of interface `veth` (an nf_tables name: up to 255 bytes). */
export const filterTable = (veth: string): string => `vmpod-${veth}`;

function bad(rule: readonly string[], why: string): VmpodError {
  return new VmpodError(ErrorCode.Internal, `filter rule ${JSON.stringify(rule.join(' '))}: ${why}`);
}

const be16 = (n: number): Buffer => Buffer.from([n >> 8, n & 0xff]);

/**
 * One rule in ebtables' words: `CHAIN -i|-o DEV -p IPv4|IPv6 --ip[6]-proto P (--ip[6]-dport N | --ip6-icmp-type T) -j
 * DROP`.
 */
export function ruleExprs(rule: readonly string[]): { chain: keyof typeof BRIDGE_HOOKS; exprs: Expr[] } {
  const [chain, dir, dev, ...rest] = rule;
  if (chain !== 'INPUT' && chain !== 'FORWARD' && chain !== 'OUTPUT') throw bad(rule, 'unknown chain');
  if ((dir !== '-i' && dir !== '-o') || !dev) throw bad(rule, 'no -i or -o device');
  const exprs: Expr[] = [meta(dir === '-i' ? META_KEY.IIFNAME : META_KEY.OIFNAME), cmpEq(cstr(dev))];
  for (let i = 0; i < rest.length; i += 2) {
    const [k, v] = [rest[i], rest[i + 1]];
    if (v === undefined) throw bad(rule, `${k} without a value`);
    if (k === '-p' && ETHER_TYPES[v] !== undefined) exprs.push(meta(META_KEY.PROTOCOL), cmpEq(be16(ETHER_TYPES[v])));
    else if ((k === '--ip-proto' || k === '--ip6-proto') && L4_PROTOS[v] !== undefined)
      exprs.push(meta(META_KEY.L4PROTO), cmpEq(Buffer.from([L4_PROTOS[v]])));
    else if ((k === '--ip-dport' || k === '--ip6-dport') && /^\d+$/.test(v) && Number(v) < 65536)
      exprs.push(payload(PAYLOAD_BASE.TRANSPORT, 2, 2), cmpEq(be16(Number(v))));
    else if (k === '--ip6-icmp-type' && ICMP6_TYPES[v] !== undefined)
      exprs.push(payload(PAYLOAD_BASE.TRANSPORT, 0, 1), cmpEq(Buffer.from([ICMP6_TYPES[v]])));
    else if (k === '-j' && v === 'DROP' && i === rest.length - 2) exprs.push(drop());
    else throw bad(rule, `unknown ${k} ${v}`);
  }
  if (exprs[exprs.length - 1]?.[0] !== 'immediate') throw bad(rule, 'no -j DROP at the end');
  return { chain, exprs };
}

/**
 * Transactions built already, by table and rules. Every pod's filter is the same (its links have the same names in
 * their own netns), and building one costs a millisecond of cold JS per add; the bytes are never changed.
 */
const built = new Map<string, NlRequest>();
const BUILT_MAX = 64;

/** The transaction that makes the table with these rules (the table must not exist yet). */
export function filterRequest(table: string, rules: readonly (readonly string[])[]): NlRequest {
  const id = `${table}\n${rules.map((r) => r.join(' ')).join('\n')}`;
  let req = built.get(id);
  if (req === undefined) {
    req = buildFilterRequest(table, rules);
    if (built.size >= BUILT_MAX) built.clear();
    built.set(id, req);
  }
  return req;
}

function buildFilterRequest(table: string, rules: readonly (readonly string[])[]): NlRequest {
  const chains: NftChain[] = (['INPUT', 'FORWARD', 'OUTPUT'] as const).map((name) => ({
    name,
    hook: BRIDGE_HOOKS[name],
    rules: [],
  }));
  for (const r of rules) {
    const { chain, exprs } = ruleExprs(r);
    chains.find((c) => c.name === chain)!.rules.push(exprs);
  }
  return { nftBatch: newTableBatch(table, chains) };
}

export const filterDelRequest = (table: string): NlRequest => ({ nftBatch: delTableBatch(table) });
