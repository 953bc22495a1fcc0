// DHCPv6 messages (RFC 8415 section 8 and 21): msg-type, transaction-id, options; IA_NA and IA Address with their
// own options; Status Code; DUIDs. Pure. Every length is checked against what is left of its enclosing buffer (the
// parser dnsmasq 2.90 crashes in runs past the end of a RELEASE's IA_NA): anything malformed throws RangeError.
import { formatIpv6, macBytes, parseIpv6 } from '../net/ipv6.js';

export const DHCP6_SERVER_PORT = 547;
/** All_DHCP_Relay_Agents_and_Servers (RFC 8415 7.1) */
export const ALL_DHCP_SERVERS = 'ff02::1:2';

export const Msg = {
  Solicit: 1,
  Advertise: 2,
  Request: 3,
  Confirm: 4,
  Renew: 5,
  Rebind: 6,
  Reply: 7,
  Release: 8,
  Decline: 9,
  Reconfigure: 10,
  InformationRequest: 11,
  RelayForw: 12,
  RelayRepl: 13,
} as const;

const MSG_NAMES: Record<number, string> = Object.fromEntries(
  Object.entries(Msg).map(([k, v]) => [v, k.replace(/([a-z])([A-Z])/g, '$1-$2').toUpperCase()]),
);
export function msgName(t: number): string {
  return MSG_NAMES[t] ?? `type ${t}`;
}

export const Opt6 = {
  ClientId: 1,
  ServerId: 2,
  IaNa: 3,
  IaTa: 4,
  IaAddr: 5,
  Oro: 6,
  Preference: 7,
  ElapsedTime: 8,
  StatusCode: 13,
  RapidCommit: 14,
  DnsServers: 23,
  DomainList: 24,
  IaPd: 25,
} as const;

export const Status = {
  Success: 0,
  UnspecFail: 1,
  NoAddrsAvail: 2,
  NoBinding: 3,
  NotOnLink: 4,
  UseMulticast: 5,
  NoPrefixAvail: 6,
} as const;

export interface Option6 {
  code: number;
  data: Buffer;
}

export interface Message6 {
  type: number;
  /** 24 bits */
  xid: number;
  options: Option6[];
}

export interface IaAddr {
  address: string;
  preferred: number;
  valid: number;
  options: Option6[];
}

export interface IaNa {
  iaid: number;
  t1: number;
  t2: number;
  /** the IA Address options inside, decoded */
  addrs: IaAddr[];
  /** every option inside (IA Address ones included) */
  options: Option6[];
}

/** code(2) len(2) data, repeated to the end of buf; throws when a length runs past it. */
export function decodeOptions6(buf: Buffer, where: string): Option6[] {
  const out: Option6[] = [];
  let off = 0;
  while (off < buf.length) {
    if (off + 4 > buf.length)
      throw new RangeError(`${where}: option header at byte ${off} runs past the end (${buf.length} bytes)`);
    const code = buf.readUInt16BE(off);
    const len = buf.readUInt16BE(off + 2);
    if (off + 4 + len > buf.length)
      throw new RangeError(
        `${where}: option ${code} of ${len} bytes at byte ${off} runs past the end (${buf.length - off - 4} left)`,
      );
    out.push({ code, data: Buffer.from(buf.subarray(off + 4, off + 4 + len)) });
    off += 4 + len;
  }
  return out;
}

export function encodeOptions6(options: readonly Option6[]): Buffer {
  return Buffer.concat(
    options.map((o) => {
      if (o.data.length > 0xffff) throw new RangeError(`option ${o.code}: ${o.data.length} bytes do not fit`);
      const h = Buffer.alloc(4);
      h.writeUInt16BE(o.code, 0);
      h.writeUInt16BE(o.data.length, 2);
      return Buffer.concat([h, o.data]);
    }),
  );
}

export function decodeMessage6(buf: Buffer): Message6 {
  if (buf.length < 4) throw new RangeError(`DHCPv6 message of ${buf.length} bytes is shorter than its 4-byte header`);
  return {
    type: buf[0]!,
    xid: buf.readUIntBE(1, 3),
    options: decodeOptions6(buf.subarray(4), `message type ${buf[0]}`),
  };
}

export function encodeMessage6(m: Message6): Buffer {
  const h = Buffer.alloc(4);
  h[0] = m.type;
  h.writeUIntBE(m.xid & 0xffffff, 1, 3);
  return Buffer.concat([h, encodeOptions6(m.options)]);
}

export function getOption6(opts: readonly Option6[], code: number): Buffer | undefined {
  return opts.find((o) => o.code === code)?.data;
}

export function optionCount(opts: readonly Option6[], code: number): number {
  return opts.filter((o) => o.code === code).length;
}

/** IA_NA option data (RFC 8415 21.4): IAID, T1, T2, IA_NA-options. */
export function decodeIaNa(data: Buffer): IaNa {
  if (data.length < 12) throw new RangeError(`IA_NA of ${data.length} bytes is shorter than its 12 fixed bytes`);
  const options = decodeOptions6(data.subarray(12), 'IA_NA');
  return {
    iaid: data.readUInt32BE(0),
    t1: data.readUInt32BE(4),
    t2: data.readUInt32BE(8),
    addrs: options.filter((o) => o.code === Opt6.IaAddr).map((o) => decodeIaAddr(o.data)),
    options,
  };
}

export function encodeIaNa(ia: { iaid: number; t1: number; t2: number; options: Option6[] }): Buffer {
  const h = Buffer.alloc(12);
  h.writeUInt32BE(ia.iaid >>> 0, 0);
  h.writeUInt32BE(ia.t1 >>> 0, 4);
  h.writeUInt32BE(ia.t2 >>> 0, 8);
  return Buffer.concat([h, encodeOptions6(ia.options)]);
}

/** IA Address option data (RFC 8415 21.6): address, preferred, valid, IAaddr-options. */
export function decodeIaAddr(data: Buffer): IaAddr {
  if (data.length < 24) throw new RangeError(`IA Address of ${data.length} bytes is shorter than its 24 fixed bytes`);
  return {
    address: formatIpv6(data.subarray(0, 16)),
    preferred: data.readUInt32BE(16),
    valid: data.readUInt32BE(20),
    options: decodeOptions6(data.subarray(24), 'IA Address'),
  };
}

export function encodeIaAddr(a: { address: string; preferred: number; valid: number; options?: Option6[] }): Buffer {
  const ip = parseIpv6(a.address);
  if (!ip) throw new RangeError(`not an IPv6 address: ${a.address}`);
  const h = Buffer.alloc(24);
  ip.copy(h, 0);
  h.writeUInt32BE(a.preferred >>> 0, 16);
  h.writeUInt32BE(a.valid >>> 0, 20);
  return Buffer.concat([h, encodeOptions6(a.options ?? [])]);
}

/** Status Code option data (RFC 8415 21.13): code, UTF-8 message. */
export function statusOption(code: number, message: string): Option6 {
  const m = Buffer.from(message, 'utf8');
  const d = Buffer.alloc(2 + m.length);
  d.writeUInt16BE(code, 0);
  m.copy(d, 2);
  return { code: Opt6.StatusCode, data: d };
}

export function decodeStatus(data: Buffer): { code: number; message: string } {
  if (data.length < 2) throw new RangeError(`Status Code of ${data.length} bytes is shorter than 2`);
  return { code: data.readUInt16BE(0), message: data.subarray(2).toString('utf8') };
}

/** DUID-LL (RFC 8415 11.4): type 3, hardware type 1 (Ethernet), the MAC. */
export function duidLl(mac: string): Buffer {
  return Buffer.concat([Buffer.from([0, 3, 0, 1]), macBytes(mac)]);
}

/** The domain search list in DNS wire format, uncompressed (RFC 8415 21.8 -> RFC 1035 3.1); also RA DNSSL's body. */
export function encodeDomainList(domains: readonly string[]): Buffer {
  const parts: Buffer[] = [];
  for (const d of domains) {
    const name = d.replace(/\.$/, '');
    if (name === '') continue;
    for (const label of name.split('.')) {
      const l = Buffer.from(label, 'ascii');
      if (l.length === 0 || l.length > 63)
        throw new RangeError(
          `search domain ${JSON.stringify(d)}: label ${JSON.stringify(label)} must be 1 to 63 bytes`,
        );
      parts.push(Buffer.from([l.length]), l);
    }
    parts.push(Buffer.from([0]));
  }
  return Buffer.concat(parts);
}

/** 16 bytes per address (option 23, RDNSS body). */
export function encodeAddressList(addrs: readonly string[]): Buffer {
  return Buffer.concat(
    addrs.map((a) => {
      const b = parseIpv6(a);
      if (!b) throw new RangeError(`not an IPv6 address: ${a}`);
      return b;
    }),
  );
}
