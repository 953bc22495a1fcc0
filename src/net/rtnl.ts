// rtnetlink messages (RFC 3549; the kernel's uapi linux/netlink.h, rtnetlink.h, if_link.h, if_addr.h): requests
// encoded, dumps decoded, and the batch format of the addon's netlinkInNetns (native/netlink.c). Pure.

/** Message types. */
export const RTM = {
  NEWLINK: 16,
  DELLINK: 17,
  GETLINK: 18,
  NEWADDR: 20,
  DELADDR: 21,
  GETADDR: 22,
  NEWROUTE: 24,
  DELROUTE: 25,
  GETROUTE: 26,
  NEWQDISC: 36,
  DELQDISC: 37,
  NEWTFILTER: 44,
} as const;
/** nlmsg_flags. */
export const NLM_F = { DUMP: 0x300, REPLACE: 0x100, EXCL: 0x200, CREATE: 0x400 } as const;
export const AF_INET = 2;
export const AF_INET6 = 10;
/** ifi_flags bits */
export const IFF_UP = 1;
/** TUNSETIFF flags */
export const IFF_TAP = 0x2;
export const IFF_MULTI_QUEUE = 0x0100;
export const IFF_NO_PI = 0x1000;
export const IFF_VNET_HDR = 0x4000;

const NLMSG_HDRLEN = 16;
const align4 = (n: number): number => (n + 3) & ~3;

/** A value that becomes the ifindex of the named link in the netns, looked up when the request runs. */
export interface IfIndexOf {
  ifindexOf: string;
}
/**
 * Bytes with the ifindex of a named link written at `at` when the request runs (a struct that holds one, as tc_mirred).
 */
export interface BytesWithIfIndex {
  bytes: Buffer;
  at: number;
  ifindexOf: string;
}
/** An attribute: its type and a value (bytes, an ifindex to look up, bytes holding one, or nested attributes). */
export type Attr = [type: number, value: Buffer | IfIndexOf | BytesWithIfIndex | Attr[]];

export const u8 = (n: number): Buffer => Buffer.from([n & 0xff]);
export function u32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(n >>> 0);
  return b;
}
export const cstr = (s: string): Buffer => Buffer.concat([Buffer.from(s), Buffer.alloc(1)]);

/**
 * A request of netlinkInNetns: a netlink message with the offsets where link names' ifindexes go, a persistent tap, an
 * nf_tables transaction (its messages, batch begin to batch end), or sysctls ("name=value", written in the netns).
 */
export type NlRequest =
  | { msg: Buffer; fix: { offset: number; name: string }[] }
  | { tap: string; flags: number }
  | { nftBatch: Buffer }
  | { sysctl: readonly string[] };

/**
 * Builds one message: header, the fixed part (its u32 at `indexOf.at`, when given, is the ifindex of link
 * `indexOf.name`), attributes (nested ones flagged NLA_F_NESTED when `nestedFlag`, as nf_tables wants).
 */
export function nlMessage(
  type: number,
  flags: number,
  fixed: Buffer,
  attrs: Attr[],
  indexOf?: { at: number; name: string },
  nestedFlag = false,
): { msg: Buffer; fix: { offset: number; name: string }[] } {
  const fix: { offset: number; name: string }[] = [];
  if (indexOf) fix.push({ offset: NLMSG_HDRLEN + indexOf.at, name: indexOf.name });
  const parts: Buffer[] = [Buffer.alloc(NLMSG_HDRLEN), fixed, Buffer.alloc(align4(fixed.length) - fixed.length)];
  let at = NLMSG_HDRLEN + align4(fixed.length);
  const put = (list: Attr[]): void => {
    for (const [t, v] of list) {
      const head = Buffer.alloc(4);
      parts.push(head);
      at += 4;
      let len = 4;
      if (Array.isArray(v)) {
        const before = at;
        put(v);
        len += at - before;
      } else {
        const bytes = Buffer.isBuffer(v) ? v : 'bytes' in v ? v.bytes : Buffer.alloc(4);
        if (!Buffer.isBuffer(v)) fix.push({ offset: at + ('bytes' in v ? v.at : 0), name: v.ifindexOf });
        parts.push(bytes, Buffer.alloc(align4(bytes.length) - bytes.length));
        at += align4(bytes.length);
        len += bytes.length;
      }
      head.writeUInt16LE(len, 0);
      head.writeUInt16LE(t | (nestedFlag && Array.isArray(v) ? 0x8000 : 0), 2);
    }
  };
  put(attrs);
  const msg = Buffer.concat(parts);
  msg.writeUInt32LE(msg.length, 0);
  msg.writeUInt16LE(type, 4);
  msg.writeUInt16LE(flags, 6);
  return { msg, fix };
}

/**
 * A dump request of `type` for `family` (the fixed part is an ifinfomsg, ifaddrmsg or rtmsg: all start with the
 * family).
 */
export function dumpRequest(type: number, fixedLen: number, family = 0): NlRequest {
  const fixed = Buffer.alloc(fixedLen);
  fixed[0] = family;
  return nlMessage(type, NLM_F.DUMP, fixed, []);
}

const IFNAMSIZ = 16;

/** The addon's batch: per request u32 kind, u32 length, body (see native/netlink.c). */
export function encodeBatch(reqs: readonly NlRequest[]): Buffer {
  const out: Buffer[] = [];
  for (const r of reqs) {
    let body: Buffer;
    if ('nftBatch' in r) body = r.nftBatch;
    else if ('sysctl' in r) body = Buffer.from(r.sysctl.join('\n'));
    else if ('tap' in r) {
      body = Buffer.alloc(IFNAMSIZ + 4);
      body.write(r.tap, 0, IFNAMSIZ - 1);
      body.writeUInt32LE(r.flags, IFNAMSIZ);
    } else {
      const fixes = Buffer.alloc(4 + r.fix.length * (4 + IFNAMSIZ));
      fixes.writeUInt32LE(r.fix.length, 0);
      r.fix.forEach((f, i) => {
        fixes.writeUInt32LE(f.offset, 4 + i * (4 + IFNAMSIZ));
        fixes.write(f.name, 8 + i * (4 + IFNAMSIZ), IFNAMSIZ - 1);
      });
      body = Buffer.concat([fixes, r.msg]);
    }
    const head = Buffer.alloc(8);
    head.writeUInt32LE('sysctl' in r ? 3 : 'nftBatch' in r ? 2 : 'tap' in r ? 1 : 0, 0);
    head.writeUInt32LE(body.length, 4);
    out.push(head, body);
  }
  return Buffer.concat(out);
}

/** The answer to one request: errno (0: done), a dump's messages, and the kernel's extended ack or what failed. */
export interface NlAnswer {
  errno: number;
  data: Buffer;
  text: string;
}

export function decodeAnswers(buf: Buffer): NlAnswer[] {
  const out: NlAnswer[] = [];
  for (let at = 0; at + 12 <= buf.length; ) {
    const errno = buf.readInt32LE(at);
    const dlen = buf.readUInt32LE(at + 4);
    const tlen = buf.readUInt32LE(at + 8);
    const data = buf.subarray(at + 12, at + 12 + dlen);
    const text = buf.toString('utf8', at + 12 + dlen, at + 12 + dlen + tlen);
    out.push({ errno, data, text });
    at += 12 + dlen + tlen;
  }
  return out;
}

/** One message of a dump: its type and what follows the header. */
export interface NlMessage {
  type: number;
  body: Buffer;
}

export function parseMessages(buf: Buffer): NlMessage[] {
  const out: NlMessage[] = [];
  for (let at = 0; at + NLMSG_HDRLEN <= buf.length; ) {
    const len = buf.readUInt32LE(at);
    if (len < NLMSG_HDRLEN || at + len > buf.length) break;
    out.push({ type: buf.readUInt16LE(at + 4), body: buf.subarray(at + NLMSG_HDRLEN, at + len) });
    at += align4(len);
  }
  return out;
}

/**
 * Attributes from `from` on (the type without the nested and byte-order bits): the last of a type wins. With `want`,
 * only those types (a link's dump carries dozens of attributes; each one kept is a view to make). The lengths are read
 * byte by byte: Buffer's checked readers cost an allocation per call until they are optimized.
 */
export function parseAttrs(buf: Buffer, from = 0, want?: ReadonlySet<number>): Map<number, Buffer> {
  const out = new Map<number, Buffer>();
  for (let at = from; at + 4 <= buf.length; ) {
    const len = buf[at]! | (buf[at + 1]! << 8);
    if (len < 4 || at + len > buf.length) break;
    const type = (buf[at + 2]! | (buf[at + 3]! << 8)) & 0x3fff;
    if (want === undefined || want.has(type)) out.set(type, buf.subarray(at + 4, at + len));
    at += align4(len);
  }
  return out;
}

/** A NUL-terminated string attribute. */
export function attrString(b: Buffer | undefined): string | undefined {
  if (!b) return undefined;
  const nul = b.indexOf(0);
  return b.toString('utf8', 0, nul < 0 ? b.length : nul);
}
