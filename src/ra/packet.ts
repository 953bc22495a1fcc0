// Router Solicitation and Router Advertisement messages (RFC 4861 4.1, 4.2, 4.6; RFC 8106 5.1, 5.2), Neighbor
// Solicitation and Advertisement (4.3, 4.4), the ICMPv6 body only (frame6.ts adds the headers and checksum). Pure.
// Option lengths are checked against the message.
import { formatIpv6, macBytes, parseIpv6 } from '../net/ipv6.js';
import { encodeDomainList } from '../dhcp6/packet.js';

export const ICMP6_RS = 133;
export const ICMP6_RA = 134;
export const ICMP6_NS = 135;
export const ICMP6_NA = 136;
export const ALL_NODES = 'ff02::1';
export const ALL_ROUTERS = 'ff02::2';

/**
 * Neighbor Discovery option types: RFC 4861 4.6.1 (link-layer addresses), 4.6.2 (prefix), 4.6.4 (MTU); RFC 8106 5.1,
 * 5.2
 */
export const NdOpt = { SourceLinkAddr: 1, TargetLinkAddr: 2, PrefixInfo: 3, Mtu: 5, Rdnss: 25, Dnssl: 31 } as const;

export interface NdOption {
  type: number;
  /** the option's bytes after type and length */
  body: Buffer;
}

/** type(1) length(1, in 8-octet units, 0 invalid) body, to the end; RFC 4861 4.6: a zero length is invalid. */
export function decodeNdOptions(buf: Buffer): NdOption[] {
  const out: NdOption[] = [];
  let off = 0;
  while (off < buf.length) {
    if (off + 2 > buf.length) throw new RangeError(`ND option header at byte ${off} runs past the end`);
    const type = buf[off]!;
    const len = buf[off + 1]! * 8;
    if (len === 0) throw new RangeError(`ND option ${type} at byte ${off} has length 0`);
    if (off + len > buf.length)
      throw new RangeError(
        `ND option ${type} of ${len} bytes at byte ${off} runs past the end (${buf.length - off} left)`,
      );
    out.push({ type, body: Buffer.from(buf.subarray(off + 2, off + len)) });
    off += len;
  }
  return out;
}

export function encodeNdOption(type: number, body: Buffer): Buffer {
  const total = Math.ceil((body.length + 2) / 8) * 8;
  if (total / 8 > 255) throw new RangeError(`ND option ${type}: ${body.length} bytes do not fit`);
  const b = Buffer.alloc(total);
  b[0] = type;
  b[1] = total / 8;
  body.copy(b, 2);
  return b;
}

export interface RouterSolicitation {
  /** the Source Link-Layer Address option, colon-hex */
  sourceMac?: string;
}

/** An RS's ICMPv6 message; RFC 4861 6.1.1 checks (code 0, length, options, no SLLA from ::). Throws RangeError. */
export function decodeRs(msg: Buffer, src: string): RouterSolicitation {
  if (msg.length < 8) throw new RangeError(`RS of ${msg.length} bytes is shorter than 8`);
  if (msg[0] !== ICMP6_RS) throw new RangeError(`ICMPv6 type ${msg[0]} is not RS`);
  if (msg[1] !== 0) throw new RangeError(`RS code ${msg[1]} is not 0`);
  const opts = decodeNdOptions(msg.subarray(8));
  const slla = opts.find((o) => o.type === NdOpt.SourceLinkAddr);
  if (slla && src === '::') throw new RangeError('RS from :: with a source link-layer address option');
  if (slla && slla.body.length < 6) throw new RangeError('RS source link-layer address option shorter than 6 bytes');
  return slla ? { sourceMac: [...slla.body.subarray(0, 6)].map((x) => x.toString(16).padStart(2, '0')).join(':') } : {};
}

export interface NeighborSolicitation {
  /** the address asked for, canonical text */
  target: string;
}

/** An NS's ICMPv6 message; RFC 4861 7.1.1 checks (code 0, length, target not multicast, options). Throws RangeError. */
export function decodeNs(msg: Buffer, src: string): NeighborSolicitation {
  if (msg.length < 24) throw new RangeError(`NS of ${msg.length} bytes is shorter than 24`);
  if (msg[0] !== ICMP6_NS) throw new RangeError(`ICMPv6 type ${msg[0]} is not NS`);
  if (msg[1] !== 0) throw new RangeError(`NS code ${msg[1]} is not 0`);
  if (msg[8] === 0xff) throw new RangeError('NS for a multicast target');
  const opts = decodeNdOptions(msg.subarray(24));
  if (src === '::' && opts.some((o) => o.type === NdOpt.SourceLinkAddr))
    throw new RangeError('NS from :: with a source link-layer address option');
  return { target: formatIpv6(msg.subarray(8, 24)) };
}

/**
 * A solicited Neighbor Advertisement for `target` at `targetMac` (R and O set: a router answering for its own address).
 */
export function encodeNa(target: string, targetMac: string): Buffer {
  const t = parseIpv6(target);
  if (!t) throw new RangeError(`not an IPv6 address: ${target}`);
  const h = Buffer.alloc(24);
  h[0] = ICMP6_NA;
  h[4] = 0x80 | 0x40 | 0x20; // Router, Solicited, Override (RFC 4861 4.4)
  t.copy(h, 8);
  return Buffer.concat([h, encodeNdOption(NdOpt.TargetLinkAddr, macBytes(targetMac))]);
}

export interface RouterAdvertisement {
  curHopLimit: number;
  managed: boolean;
  other: boolean;
  /** seconds; 0 = not a default router */
  routerLifetime: number;
  reachableTime: number;
  retransTimer: number;
  sourceMac?: string;
  mtu?: number;
  prefixes: {
    prefix: string;
    length: number;
    onLink: boolean;
    autonomous: boolean;
    valid: number;
    preferred: number;
  }[];
  rdnss?: { lifetime: number; servers: string[] };
  dnssl?: { lifetime: number; domains: string[] };
}

/** The RA's ICMPv6 message, checksum zero (frame6 fills it). */
export function encodeRa(ra: RouterAdvertisement): Buffer {
  const h = Buffer.alloc(16);
  h[0] = ICMP6_RA;
  h[1] = 0;
  h[4] = ra.curHopLimit;
  h[5] = (ra.managed ? 0x80 : 0) | (ra.other ? 0x40 : 0);
  h.writeUInt16BE(ra.routerLifetime, 6);
  h.writeUInt32BE(ra.reachableTime >>> 0, 8);
  h.writeUInt32BE(ra.retransTimer >>> 0, 12);
  const opts: Buffer[] = [];
  if (ra.sourceMac) opts.push(encodeNdOption(NdOpt.SourceLinkAddr, macBytes(ra.sourceMac)));
  if (ra.mtu !== undefined) {
    const b = Buffer.alloc(6);
    b.writeUInt32BE(ra.mtu >>> 0, 2);
    opts.push(encodeNdOption(NdOpt.Mtu, b));
  }
  for (const p of ra.prefixes) {
    const b = Buffer.alloc(30);
    b[0] = p.length;
    b[1] = (p.onLink ? 0x80 : 0) | (p.autonomous ? 0x40 : 0);
    b.writeUInt32BE(p.valid >>> 0, 2);
    b.writeUInt32BE(p.preferred >>> 0, 6);
    const addr = parseIpv6(p.prefix);
    if (!addr) throw new RangeError(`not an IPv6 prefix: ${p.prefix}`);
    addr.copy(b, 14);
    opts.push(encodeNdOption(NdOpt.PrefixInfo, b));
  }
  if (ra.rdnss && ra.rdnss.servers.length > 0) {
    const b = Buffer.alloc(6 + 16 * ra.rdnss.servers.length);
    b.writeUInt32BE(ra.rdnss.lifetime >>> 0, 2);
    ra.rdnss.servers.forEach((s, i) => {
      const a = parseIpv6(s);
      if (!a) throw new RangeError(`not an IPv6 address: ${s}`);
      a.copy(b, 6 + 16 * i);
    });
    opts.push(encodeNdOption(NdOpt.Rdnss, b));
  }
  if (ra.dnssl && ra.dnssl.domains.length > 0) {
    const names = encodeDomainList(ra.dnssl.domains);
    const b = Buffer.alloc(6 + names.length);
    b.writeUInt32BE(ra.dnssl.lifetime >>> 0, 2);
    names.copy(b, 6);
    opts.push(encodeNdOption(NdOpt.Dnssl, b)); // padded with zeros to 8 octets (RFC 8106 5.2)
  }
  return Buffer.concat([h, ...opts]);
}

/** An RA's ICMPv6 message back into fields (tests, and a guard that what we send parses). Throws RangeError. */
export function decodeRa(msg: Buffer): RouterAdvertisement {
  if (msg.length < 16) throw new RangeError(`RA of ${msg.length} bytes is shorter than 16`);
  if (msg[0] !== ICMP6_RA) throw new RangeError(`ICMPv6 type ${msg[0]} is not RA`);
  const ra: RouterAdvertisement = {
    curHopLimit: msg[4]!,
    managed: (msg[5]! & 0x80) !== 0,
    other: (msg[5]! & 0x40) !== 0,
    routerLifetime: msg.readUInt16BE(6),
    reachableTime: msg.readUInt32BE(8),
    retransTimer: msg.readUInt32BE(12),
    prefixes: [],
  };
  for (const o of decodeNdOptions(msg.subarray(16))) {
    const b = o.body;
    if (o.type === NdOpt.SourceLinkAddr && b.length >= 6)
      ra.sourceMac = [...b.subarray(0, 6)].map((x) => x.toString(16).padStart(2, '0')).join(':');
    else if (o.type === NdOpt.Mtu && b.length >= 6) ra.mtu = b.readUInt32BE(2);
    else if (o.type === NdOpt.PrefixInfo && b.length >= 30) {
      ra.prefixes.push({
        length: b[0]!,
        onLink: (b[1]! & 0x80) !== 0,
        autonomous: (b[1]! & 0x40) !== 0,
        valid: b.readUInt32BE(2),
        preferred: b.readUInt32BE(6),
        prefix: formatIpv6(b.subarray(14, 30)),
      });
    } else if (o.type === NdOpt.Rdnss && b.length >= 22) {
      const servers: string[] = [];
      for (let off = 6; off + 16 <= b.length; off += 16) servers.push(formatIpv6(b.subarray(off, off + 16)));
      ra.rdnss = { lifetime: b.readUInt32BE(2), servers };
    } else if (o.type === NdOpt.Dnssl && b.length >= 6) {
      const domains: string[] = [];
      let off = 6;
      let labels: string[] = [];
      while (off < b.length) {
        const l = b[off]!;
        if (l === 0) {
          if (labels.length === 0) break; // padding
          domains.push(labels.join('.'));
          labels = [];
          off++;
          continue;
        }
        if (off + 1 + l > b.length) throw new RangeError('DNSSL label runs past the option');
        labels.push(b.subarray(off + 1, off + 1 + l).toString('ascii'));
        off += 1 + l;
      }
      ra.dnssl = { lifetime: b.readUInt32BE(2), domains };
    }
  }
  return ra;
}
