// What iproute2 shows (`ip -j -d -batch` of OBSERVE_BATCH) read into the Observed shape: the oracle the rtnetlink
// decoder (src/podnet/observe.ts) is checked against, and how tests look into a netns.
import { ErrorCode, VmpodError } from '../../src/errors.js';
import type { Observed, ObservedAddr, ObservedLink, ObservedRoute } from '../../src/podnet/types.js';

/**
 * `ip -j -batch` prints one JSON value per command, one after another. Splits them by bracket depth
 * (strings honoured), so a value spanning lines or two values on one line both parse.
 */
export function splitJsonValues(text: string): unknown[] {
  const out: unknown[] = [];
  let depth = 0;
  let start = -1;
  let inStr = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (inStr) {
      if (c === '\\') i++;
      else if (c === '"') inStr = false;
      continue;
    }
    if (c === '"') inStr = true;
    else if (c === '[' || c === '{') {
      if (depth === 0) start = i;
      depth++;
    } else if (c === ']' || c === '}') {
      depth--;
      if (depth === 0 && start >= 0) {
        out.push(JSON.parse(text.slice(start, i + 1)));
        start = -1;
      }
    }
  }
  if (depth !== 0)
    throw new VmpodError(ErrorCode.Netlink, `unterminated JSON from ip: ${JSON.stringify(text.slice(0, 200))}`);
  return out;
}

type Json = Record<string, unknown>;
const str = (x: unknown): string | undefined => (typeof x === 'string' ? x : undefined);
const num = (x: unknown): number | undefined => (typeof x === 'number' ? x : undefined);

function parseLink(j: Json): ObservedLink {
  const flags = Array.isArray(j.flags) ? (j.flags as unknown[]).map(String) : [];
  const linkinfo = (j.linkinfo ?? {}) as Json;
  const addrs4: ObservedAddr[] = [];
  for (const a of Array.isArray(j.addr_info) ? (j.addr_info as Json[]) : []) {
    if (a.family !== 'inet' || typeof a.local !== 'string' || typeof a.prefixlen !== 'number') continue;
    addrs4.push({
      local: a.local,
      prefixlen: a.prefixlen,
      ...(str(a.broadcast) ? { broadcast: str(a.broadcast) } : {}),
      ...(str(a.scope) ? { scope: str(a.scope) } : {}),
    });
  }
  const addrs6: ObservedAddr[] = [];
  const linkLocal6: ObservedAddr[] = [];
  for (const a of Array.isArray(j.addr_info) ? (j.addr_info as Json[]) : []) {
    if (a.family !== 'inet6' || typeof a.local !== 'string' || typeof a.prefixlen !== 'number') continue;
    if (a.scope === 'global') addrs6.push({ local: a.local, prefixlen: a.prefixlen, scope: 'global' });
    else if (a.scope === 'link') linkLocal6.push({ local: a.local, prefixlen: a.prefixlen, scope: 'link' });
  }
  const link: ObservedLink = {
    name: String(j.ifname),
    index: num(j.ifindex) ?? 0,
    mac: str(j.address) ?? '',
    mtu: num(j.mtu) ?? 0,
    up: flags.includes('UP'),
    addrs4,
    ...(addrs6.length > 0 ? { addrs6 } : {}),
    ...(linkLocal6.length > 0 ? { linkLocal6 } : {}),
  };
  const kind = str(linkinfo.info_kind);
  if (kind) link.kind = kind;
  for (const [from, to] of [
    ['master', 'master'],
    ['parentbus', 'parentBus'],
    ['parentdev', 'parentDev'],
  ] as const) {
    const v = str(j[from]);
    if (v) link[to] = v;
  }
  return link;
}

function parseRoute(j: Json): ObservedRoute {
  const r: ObservedRoute = {
    dst: String(j.dst),
    flags: Array.isArray(j.flags) ? (j.flags as unknown[]).map(String) : [],
  };
  for (const k of ['gateway', 'dev', 'protocol', 'scope', 'prefsrc', 'type', 'table'] as const) {
    const v = str(j[k]);
    if (v !== undefined) r[k] = v;
  }
  const m = num(j.metric);
  if (m !== undefined) r.metric = m;
  return r;
}

/** The batch lines parseObserved reads: links, IPv4 routes, IPv6 routes (`root ::/0` of table all: iproute2 lists
 * nothing for `root ::/0` of the main table alone; parseObserved keeps the main table's entries, which `-d` shows
 * with `"table":"main"`, and drops the others'). */
export const OBSERVE_BATCH: string[][] = [
  ['addr', 'show'],
  ['route', 'show'],
  ['route', 'show', 'table', 'all', 'root', '::/0'],
];

/** Parses the output of `ip -j -d -batch` with OBSERVE_BATCH (the IPv6 routes optional). */
export function parseObserved(text: string): Observed {
  const vals = splitJsonValues(text);
  if (vals.length < 2 || vals.length > 3 || !vals.every((v) => Array.isArray(v))) {
    throw new VmpodError(
      ErrorCode.Netlink,
      `expected two or three JSON arrays (addr show, route show, IPv6 routes) from ip, got ${vals.length} values`,
    );
  }
  const routes6 =
    vals[2] === undefined
      ? undefined
      : (vals[2] as Json[])
          .map(parseRoute)
          .filter((r) => r.table === undefined || r.table === 'main')
          .map(({ table: _main, ...r }) => r);
  return {
    links: (vals[0] as Json[]).map(parseLink),
    routes4: (vals[1] as Json[]).map(parseRoute),
    ...(routes6 ? { routes6 } : {}),
  };
}
