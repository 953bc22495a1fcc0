// The `tc` command lines the plans record (a tap's root qdisc: tapmake.ts; the tc-redirect binding: tcredirect.ts),
// turned into the rtnetlink requests tc would send for them (src/net/tc.ts): the record keeps the readable line, the
// addon runs the request with the `ip` lines of the same batch (no `tc` process). Only the vocabulary the planners
// write is known; any other line is an Internal error. Pure.
import { ErrorCode, VmpodError } from '../errors.js';
import type { NlRequest } from '../net/rtnl.js';
import {
  INGRESS_HANDLE,
  TC_PROTOCOLS,
  ingressQdisc,
  packMatch,
  rootNoqueue,
  u32FilterRequest,
  type FilterTarget,
  type U32Key,
} from '../net/tc.js';

function bad(args: readonly string[], why: string): VmpodError {
  return new VmpodError(ErrorCode.Internal, `tc ${args.join(' ')}: ${why}`);
}

/** A number as tc reads one: decimal, or hex with 0x. */
function num(s: string | undefined): number | undefined {
  if (s === undefined || !/^(0x[0-9a-f]+|\d+)$/i.test(s)) return undefined;
  const n = Number(s);
  return n <= 0xffffffff ? n : undefined;
}

/** A class id "MAJOR:MINOR" (both hex, as tc reads them). */
function classid(s: string | undefined): number | undefined {
  const m = /^([0-9a-f]{1,4}):([0-9a-f]{1,4})$/i.exec(s ?? '');
  return m ? ((parseInt(m[1]!, 16) << 16) | parseInt(m[2]!, 16)) >>> 0 : undefined;
}

/** The keys and target of a u32 filter line, from its first "match" on. */
function u32Rest(args: readonly string[], from: number): { keys: U32Key[]; target: FilterTarget } {
  const keys: U32Key[] = [];
  let i = from;
  while (args[i] === 'match') {
    const size = args[i + 1];
    const [value, mask, off] = [num(args[i + 2]), num(args[i + 3]), args[i + 4] === 'at' ? Number(args[i + 5]) : NaN];
    const bits = size === 'u8' ? 8 : size === 'u16' ? 16 : size === 'u32' ? 32 : undefined;
    if (bits === undefined || value === undefined || mask === undefined || !Number.isInteger(off))
      throw bad(args, `bad match at word ${i + 1}`);
    if (!packMatch(keys, bits, value, mask, off))
      throw bad(args, `match at word ${i + 1} is misaligned or contradicts another`);
    i += 6;
  }
  if (keys.length === 0) throw bad(args, 'no match');
  const rest = args.slice(i);
  if (rest.length === 2 && rest[0] === 'classid') {
    const c = classid(rest[1]);
    if (c === undefined) throw bad(args, `bad classid ${JSON.stringify(rest[1])}`);
    return { keys, target: { classid: c } };
  }
  if (rest.length === 6 && rest.slice(0, 5).join(' ') === 'action mirred egress redirect dev' && rest[5])
    return { keys, target: { redirectTo: rest[5] } };
  throw bad(args, `unknown ending ${JSON.stringify(rest.join(' '))}`);
}

/** The request for one recorded `tc` line (without the leading "tc"). */
export function tcRequest(args: readonly string[]): NlRequest {
  const [obj, verb, devKw, dev] = args;
  if (devKw !== 'dev' || !dev) throw bad(args, 'no dev');
  if (obj === 'qdisc' && (verb === 'add' || verb === 'del') && args.length === 5 && args[4] === 'ingress')
    return ingressQdisc(dev, verb === 'del');
  if (obj === 'qdisc' && verb === 'replace' && args.length === 6 && args[4] === 'root' && args[5] === 'noqueue')
    return rootNoqueue(dev);
  if (
    obj === 'filter' &&
    verb === 'add' &&
    args[4] === 'parent' &&
    classid(args[5]?.endsWith(':') ? `${args[5]}0` : args[5]) === INGRESS_HANDLE
  ) {
    const prio = num(args[7]);
    if (args[6] !== 'prio' || prio === undefined || prio < 1 || prio > 0xffff) throw bad(args, 'bad prio');
    if (args[8] !== 'protocol' || TC_PROTOCOLS[args[9] ?? ''] === undefined) throw bad(args, 'bad protocol');
    if (args[10] !== 'u32') throw bad(args, 'only u32 filters are known');
    return u32FilterRequest({ dev, prio, protocol: args[9]!, ...u32Rest(args, 11) });
  }
  throw bad(args, 'not a line the planner writes');
}
