// DHCPv4 message codec (RFC 2131 section 2, RFC 2132 section 2, RFC 3396). Pure: bytes in, data out.
//
// Fixed BOOTP header (RFC 2131 figure 1), then the magic cookie 99.130.83.99 and the options:
//   off  len  field              off  len  field
//     0    1  op (1 req, 2 rep)    16    4  yiaddr
//     1    1  htype (1 ethernet)   20    4  siaddr
//     2    1  hlen (6)             24    4  giaddr
//     3    1  hops                 28   16  chaddr
//     4    4  xid                  44   64  sname
//     8    2  secs                108  128  file
//    10    2  flags (0x8000 = B)  236    4  magic cookie
//    12    4  ciaddr              240    -  options (code, len, data...; 0 pad, 255 end)
import { ErrorCode, VmpodError } from '../errors.js';
import { bytesToIp, ipToBytes } from '../net/ip.js';

export const DHCP_MIN_LEN = 240;
/** largest datagram we accept: an Ethernet MTU; larger means a broken or hostile sender */
export const DHCP_MAX_LEN = 1500;
/**
 * BOOTP relays and some clients drop replies shorter than 300 bytes (RFC 1542 section 2.1 "at least 300 octets";
 * RFC 951's fixed 64-byte vendor area). Replies are padded to this length.
 */
export const BOOTP_MIN_REPLY_LEN = 300;
export const MAGIC_COOKIE = Buffer.from([99, 130, 83, 99]);

export const Op = { Request: 1, Reply: 2 } as const;
export type Op = (typeof Op)[keyof typeof Op];

export const HTYPE_ETHERNET = 1;
/** @public the BROADCAST bit of flags (RFC 2131 2); bench/dhcp-answer.mjs sets it */
export const BROADCAST_FLAG = 0x8000;

/** Option 53 values (RFC 2132 section 9.6). */
export const MessageType = {
  Discover: 1,
  Offer: 2,
  Request: 3,
  Decline: 4,
  Ack: 5,
  Nak: 6,
  Release: 7,
  Inform: 8,
} as const;
export type MessageType = (typeof MessageType)[keyof typeof MessageType];

export function messageTypeName(t: number): string {
  const e = Object.entries(MessageType).find(([, v]) => v === t);
  return e ? e[0].toUpperCase() : `TYPE${t}`;
}

/** Option codes we read or write (RFC 2132 unless noted). */
export const Opt = {
  Pad: 0,
  SubnetMask: 1,
  Router: 3,
  DnsServers: 6,
  HostName: 12,
  DomainName: 15,
  InterfaceMtu: 26,
  RequestedIp: 50,
  LeaseTime: 51,
  Overload: 52,
  MessageType: 53,
  ServerId: 54,
  ParameterList: 55,
  Message: 56,
  MaxMessageSize: 57,
  RenewalTime: 58,
  RebindingTime: 59,
  ClientId: 61,
  /** RFC 4578 client machine identifier (UUID/GUID), echoed like Virtlet did */
  ClientMachineId: 97,
  /** RFC 3397 */
  DomainSearch: 119,
  /** RFC 3442 */
  ClasslessRoutes: 121,
  End: 255,
} as const;
export type Opt = (typeof Opt)[keyof typeof Opt];

export interface DhcpOption {
  code: number;
  data: Buffer;
}

export interface DhcpPacket {
  op: number;
  htype: number;
  hlen: number;
  hops: number;
  xid: number;
  secs: number;
  flags: number;
  ciaddr: string;
  yiaddr: string;
  siaddr: string;
  giaddr: string;
  /** the 16-byte chaddr field as sent */
  chaddr: Buffer;
  /** sname and file (zero bytes unless used); ignored when option 52 overloads them */
  sname: Buffer;
  file: Buffer;
  /**
   * options in order of first appearance; RFC 3396: several instances of one code are concatenated into one
   * (across the options field, then file, then sname when option 52 overloads them).
   */
  options: DhcpOption[];
}

function malformed(why: string): VmpodError {
  return new VmpodError(ErrorCode.Protocol, `malformed DHCP packet: ${why}`, { op: 'dhcp decode' });
}

// ---- addresses: src/net/ip.ts ----

const MAC = /^[0-9a-f]{2}([:-][0-9a-f]{2}){5}$/i;

/** colon- or dash-hex, any case -> lower-case colon-hex; throws VmpodError(Config) otherwise. */
export function normaliseMac(s: string): string {
  if (!MAC.test(s)) throw new VmpodError(ErrorCode.Config, `not a MAC address: ${JSON.stringify(s)}`);
  return s.toLowerCase().replace(/-/g, ':');
}

export function macToBytes(s: string): Buffer {
  return Buffer.from(normaliseMac(s).replace(/:/g, ''), 'hex');
}

/** the client's hardware address (hlen bytes of chaddr) as lower-case colon-hex */
export function chaddrMac(p: DhcpPacket): string {
  const n = Math.min(p.hlen, 16);
  return [...p.chaddr.subarray(0, n)].map((x) => x.toString(16).padStart(2, '0')).join(':');
}

// ---- options ----

export function getOption(p: DhcpPacket, code: number): Buffer | undefined {
  return p.options.find((o) => o.code === code)?.data;
}

export function messageType(p: DhcpPacket): number | undefined {
  const d = getOption(p, Opt.MessageType);
  return d && d.length === 1 ? d[0] : undefined;
}

/** an option holding one IPv4 address (50, 54), or undefined when absent or not 4 bytes long */
export function optionIp(p: DhcpPacket, code: number): string | undefined {
  const d = getOption(p, code);
  return d && d.length === 4 ? bytesToIp(d) : undefined;
}

/**
 * Parse one options area (RFC 2132 section 2): pad (0) is one byte, end (255) stops, every other option is
 * code, length, data. Appends to `into`, concatenating repeated codes (RFC 3396 section 6). Returns whether
 * end was seen. Throws on a length that runs past the area.
 */
function parseOptionArea(area: Buffer, where: string, into: Map<number, Buffer[]>, order: number[]): boolean {
  let i = 0;
  while (i < area.length) {
    const code = area[i];
    if (code === Opt.Pad) {
      i++;
      continue;
    }
    if (code === Opt.End) return true;
    if (i + 1 >= area.length) throw malformed(`option ${code} at ${where} offset ${i} has no length byte`);
    const len = area[i + 1];
    if (i + 2 + len > area.length) {
      throw malformed(`option ${code} at ${where} offset ${i} claims ${len} bytes, only ${area.length - i - 2} left`);
    }
    const data = area.subarray(i + 2, i + 2 + len);
    const parts = into.get(code);
    if (parts) parts.push(data);
    else {
      into.set(code, [data]);
      order.push(code);
    }
    i += 2 + len;
  }
  return false;
}

/**
 * Decode a DHCP message. Throws VmpodError(Protocol) naming the problem for: fewer than 240 bytes, more than
 * 1500, a bad magic cookie, an option overrunning its area, a missing end option. Does not judge op or type:
 * the server does that.
 */
export function decodePacket(buf: Buffer): DhcpPacket {
  if (buf.length < DHCP_MIN_LEN) throw malformed(`${buf.length} bytes, at least ${DHCP_MIN_LEN} needed`);
  if (buf.length > DHCP_MAX_LEN) throw malformed(`${buf.length} bytes, at most ${DHCP_MAX_LEN} accepted`);
  if (!buf.subarray(236, 240).equals(MAGIC_COOKIE)) {
    throw malformed(`magic cookie ${[...buf.subarray(236, 240)].join('.')}, expected 99.130.83.99`);
  }
  const parts = new Map<number, Buffer[]>();
  const order: number[] = [];
  const sname = Buffer.from(buf.subarray(44, 108));
  const file = Buffer.from(buf.subarray(108, 236));
  const sawEnd = parseOptionArea(buf.subarray(DHCP_MIN_LEN), 'options', parts, order);
  if (!sawEnd) throw malformed('options field has no end option (255)');
  // RFC 2131 section 4.1 / RFC 2132 section 9.3: option 52 says file (1), sname (2) or both (3) hold options too;
  // they are read after the options field, file before sname (RFC 3396 section 7).
  const overload = parts.get(Opt.Overload)?.[0];
  if (overload && overload.length === 1 && overload[0] >= 1 && overload[0] <= 3) {
    if (overload[0] & 1 && !parseOptionArea(file, 'file', parts, order))
      throw malformed('overloaded file field has no end option');
    if (overload[0] & 2 && !parseOptionArea(sname, 'sname', parts, order))
      throw malformed('overloaded sname field has no end option');
  }
  return {
    op: buf[0],
    htype: buf[1],
    hlen: buf[2],
    hops: buf[3],
    xid: buf.readUInt32BE(4),
    secs: buf.readUInt16BE(8),
    flags: buf.readUInt16BE(10),
    ciaddr: bytesToIp(buf, 12),
    yiaddr: bytesToIp(buf, 16),
    siaddr: bytesToIp(buf, 20),
    giaddr: bytesToIp(buf, 24),
    chaddr: Buffer.from(buf.subarray(28, 44)),
    sname,
    file,
    options: order.map((code) => ({ code, data: Buffer.concat(parts.get(code) ?? []) })),
  };
}

/** Encode one option; data longer than 255 bytes is split into several instances of the same code (RFC 3396). */
export function encodeOption(o: DhcpOption): Buffer {
  if (o.code === Opt.Pad || o.code === Opt.End)
    throw new VmpodError(ErrorCode.Internal, `option ${o.code} is not encodable with data`);
  const chunks: Buffer[] = [];
  let off = 0;
  do {
    const piece = o.data.subarray(off, off + 255);
    chunks.push(Buffer.from([o.code, piece.length]), piece);
    off += 255;
  } while (off < o.data.length);
  return Buffer.concat(chunks);
}

/**
 * The longest DHCP message a client accepts: its option 57 (RFC 2132 section 9.10: the whole IP datagram, at
 * least 576), else 576, less 20 (IPv4 header) and 8 (UDP header). RFC 2131 section 2: every client must accept
 * a 576-byte datagram, i.e. 312 bytes of options with the cookie; busybox udhcpc sends 57 = 576 and drops
 * anything much longer.
 */
export function clientMaxMessage(maxSizeOption: Buffer | undefined): number {
  const v = maxSizeOption && maxSizeOption.length === 2 ? maxSizeOption.readUInt16BE(0) : 576;
  return Math.min(Math.max(v, 576), 1500) - 28;
}

/** Where the options of a message go: the options field, and with option 52 also file and sname. */
interface OptionLayout {
  main: Buffer[];
  file: Buffer[];
  sname: Buffer[];
  overload: 0 | 1 | 3;
}

/**
 * Place encoded options in at most maxLen bytes of message. Options that do not fit the options field go into
 * the file field (128 bytes) and then the sname field (64), announced by option 52 (RFC 2131 section 4.1,
 * RFC 2132 section 9.3): busybox, dhclient and systemd read them. Each option stays in one piece (clients that
 * ignore RFC 3396 read only the first instance of a code). Throws VmpodError(Protocol) when it cannot fit.
 */
export function layoutOptions(options: DhcpOption[], maxLen: number): OptionLayout {
  const enc = options.map(encodeOption);
  const total = enc.reduce((n, b) => n + b.length, 0);
  const mainCap = maxLen - DHCP_MIN_LEN - 1; // room for end (255)
  if (total <= mainCap) return { main: enc, file: [], sname: [], overload: 0 };
  const caps = [mainCap - 3, 128 - 1, 64 - 1]; // option 52 takes 3 bytes; each overloaded field ends with 255
  // first fit, largest first (a 250-byte search list fits only the options field); each area keeps the given order
  const where = new Array<number>(enc.length);
  const bySize = enc.map((_, i) => i).sort((a, b) => enc[b].length - enc[a].length || a - b);
  for (const i of bySize) {
    const area = caps.findIndex((c) => c >= enc[i].length);
    if (area < 0) {
      throw new VmpodError(
        ErrorCode.Protocol,
        `DHCP options (${total} bytes) do not fit a ${maxLen}-byte message even with option 52`,
        {
          op: 'dhcp encode',
        },
      );
    }
    caps[area] -= enc[i].length;
    where[i] = area;
  }
  const areas: Buffer[][] = [0, 1, 2].map((a) => enc.filter((_, i) => where[i] === a));
  return { main: areas[0], file: areas[1], sname: areas[2], overload: areas[2].length > 0 ? 3 : 1 };
}

/**
 * Encode a message: header, cookie, options, end, zero padding to BOOTP_MIN_REPLY_LEN. Options that do not fit
 * maxLen (default: any size up to DHCP_MAX_LEN) overflow into file and sname (layoutOptions).
 */
export function encodePacket(
  p: Omit<DhcpPacket, 'sname' | 'file'> & { sname?: Buffer; file?: Buffer },
  maxLen = DHCP_MAX_LEN,
): Buffer {
  const head = Buffer.alloc(DHCP_MIN_LEN);
  head[0] = p.op;
  head[1] = p.htype;
  head[2] = p.hlen;
  head[3] = p.hops;
  head.writeUInt32BE(p.xid >>> 0, 4);
  head.writeUInt16BE(p.secs, 8);
  head.writeUInt16BE(p.flags, 10);
  ipToBytes(p.ciaddr).copy(head, 12);
  ipToBytes(p.yiaddr).copy(head, 16);
  ipToBytes(p.siaddr).copy(head, 20);
  ipToBytes(p.giaddr).copy(head, 24);
  p.chaddr.copy(head, 28, 0, 16);
  MAGIC_COOKIE.copy(head, 236);
  const layout = layoutOptions(p.options, maxLen);
  const end = Buffer.from([Opt.End]);
  if (layout.overload === 0) {
    p.sname?.copy(head, 44, 0, 64);
    p.file?.copy(head, 108, 0, 128);
  } else {
    Buffer.concat([...layout.sname, ...(layout.sname.length > 0 ? [end] : [])]).copy(head, 44);
    Buffer.concat([...layout.file, end]).copy(head, 108);
    layout.main.push(Buffer.from([Opt.Overload, 1, layout.overload]));
  }
  const out = Buffer.concat([head, ...layout.main, end]);
  return out.length >= BOOTP_MIN_REPLY_LEN ? out : Buffer.concat([out, Buffer.alloc(BOOTP_MIN_REPLY_LEN - out.length)]);
}
