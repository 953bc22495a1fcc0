// Ethernet frames carrying IPv6 with UDP or ICMPv6 (RFC 8200, RFC 768, RFC 4443), as the RA and DHCPv6 servers
// read and write them on the tap's packet socket; checksums over the IPv6 pseudo-header (RFC 8200 8.1); and the
// classic BPF programs that keep every other frame out of those sockets. Pure.
import { formatIpv6, isMulticast6, macBytes, multicastMac, parseIpv6 } from './ipv6.js';

export const ETH_HLEN = 14;
export const ETHERTYPE_IPV6 = 0x86dd;
export const IP6_HLEN = 40;
export const NH_HOPOPTS = 0;
export const NH_UDP = 17;
export const NH_ICMPV6 = 58;

export interface Frame6 {
  dstMac: string;
  srcMac: string;
  /** canonical text */
  src: string;
  dst: string;
  hopLimit: number;
  /** the upper-layer protocol after any hop-by-hop header */
  proto: number;
  /** the upper-layer message (UDP header included for UDP) */
  payload: Buffer;
}

export interface Udp6 {
  srcPort: number;
  dstPort: number;
  data: Buffer;
}

const macText = (b: Uint8Array): string => [...b].map((x) => x.toString(16).padStart(2, '0')).join(':');

/** The one's-complement sum of the pseudo-header and the upper-layer message (RFC 8200 8.1), as stored. */
export function checksum6(src: Uint8Array, dst: Uint8Array, proto: number, msg: Uint8Array): number {
  let sum = 0;
  const add = (b: Uint8Array) => {
    for (let i = 0; i + 1 < b.length; i += 2) sum += (b[i]! << 8) | b[i + 1]!;
    if (b.length % 2 === 1) sum += b[b.length - 1]! << 8;
  };
  add(src);
  add(dst);
  sum += (msg.length >>> 16) + (msg.length & 0xffff) + proto;
  add(msg);
  while (sum > 0xffff) sum = (sum & 0xffff) + (sum >>> 16);
  return ~sum & 0xffff;
}

/**
 * A frame's IPv6 header and upper layer; throws RangeError on anything malformed (lengths, version, checksum).
 * csumNotReady: the socket said the sender left the UDP/ICMPv6 checksum to be filled in (CHECKSUM_PARTIAL: a guest
 * with checksum offload, whose field holds only the pseudo-header seed); the packet is whole, the checksum is not
 * checked. Every length still is.
 */
export function decodeFrame6(buf: Buffer, csumNotReady = false): Frame6 {
  if (buf.length < ETH_HLEN + IP6_HLEN)
    throw new RangeError(`frame of ${buf.length} bytes is shorter than Ethernet + IPv6 headers`);
  if (buf.readUInt16BE(12) !== ETHERTYPE_IPV6)
    throw new RangeError(`ethertype 0x${buf.readUInt16BE(12).toString(16)} is not IPv6`);
  const ip = buf.subarray(ETH_HLEN);
  if (ip[0]! >> 4 !== 6) throw new RangeError(`IP version ${ip[0]! >> 4}`);
  const plen = ip.readUInt16BE(4);
  if (IP6_HLEN + plen > ip.length)
    throw new RangeError(`IPv6 payload length ${plen} runs past the frame (${ip.length - IP6_HLEN} bytes)`);
  let proto = ip[6]!;
  let off = IP6_HLEN;
  const end = IP6_HLEN + plen;
  if (proto === NH_HOPOPTS) {
    // MLD and some stacks put a hop-by-hop header first; anything else before UDP/ICMPv6 is not ours
    if (off + 8 > end) throw new RangeError('hop-by-hop header runs past the payload');
    const next = ip[off]!;
    const len = (ip[off + 1]! + 1) * 8;
    if (off + len > end) throw new RangeError('hop-by-hop header runs past the payload');
    proto = next;
    off += len;
  }
  const src = ip.subarray(8, 24);
  const dst = ip.subarray(24, 40);
  const payload = Buffer.from(ip.subarray(off, end));
  if (proto === NH_UDP || proto === NH_ICMPV6) {
    if (proto === NH_UDP && payload.length < 8) throw new RangeError('UDP header runs past the payload');
    if (proto === NH_ICMPV6 && payload.length < 4) throw new RangeError('ICMPv6 header runs past the payload');
    // a correct checksum sums to 0 (UDP's 0 = "none" is not allowed over IPv6, RFC 8200 8.1)
    if (!csumNotReady && checksum6(src, dst, proto, payload) !== 0)
      throw new RangeError(`bad ${proto === NH_UDP ? 'UDP' : 'ICMPv6'} checksum`);
  }
  return {
    dstMac: macText(buf.subarray(0, 6)),
    srcMac: macText(buf.subarray(6, 12)),
    src: formatIpv6(src),
    dst: formatIpv6(dst),
    hopLimit: ip[7]!,
    proto,
    payload,
  };
}

/** The UDP header of a frame's payload; throws RangeError when the UDP length disagrees with the IPv6 one. */
export function decodeUdp6(payload: Buffer): Udp6 {
  if (payload.length < 8) throw new RangeError('UDP header runs past the payload');
  const len = payload.readUInt16BE(4);
  if (len < 8 || len > payload.length)
    throw new RangeError(`UDP length ${len} does not fit the ${payload.length} byte payload`);
  return {
    srcPort: payload.readUInt16BE(0),
    dstPort: payload.readUInt16BE(2),
    data: Buffer.from(payload.subarray(8, len)),
  };
}

export interface EncodeFrame6 {
  srcMac: string;
  /** default: the multicast MAC of dst when dst is multicast (RFC 2464 7) */
  dstMac?: string;
  src: string;
  dst: string;
  hopLimit: number;
}

function ipv6Bytes(text: string): Buffer {
  const b = parseIpv6(text);
  if (!b) throw new RangeError(`not an IPv6 address: ${text}`);
  return b;
}

function frame(h: EncodeFrame6, proto: number, msg: Buffer): Buffer {
  const src = ipv6Bytes(h.src);
  const dst = ipv6Bytes(h.dst);
  const dstMac = h.dstMac !== undefined ? macBytes(h.dstMac) : isMulticast6(dst) ? multicastMac(dst) : undefined;
  if (!dstMac) throw new RangeError(`no destination MAC for unicast ${h.dst}`);
  const out = Buffer.alloc(ETH_HLEN + IP6_HLEN + msg.length);
  dstMac.copy(out, 0);
  macBytes(h.srcMac).copy(out, 6);
  out.writeUInt16BE(ETHERTYPE_IPV6, 12);
  out.writeUInt32BE(0x60000000, 14);
  out.writeUInt16BE(msg.length, 18);
  out[20] = proto;
  out[21] = h.hopLimit;
  src.copy(out, 22);
  dst.copy(out, 38);
  msg.copy(out, 54);
  return out;
}

/** An Ethernet + IPv6 + ICMPv6 frame; `msg` is the ICMPv6 message with its checksum field zero (filled here). */
export function encodeIcmp6Frame(h: EncodeFrame6, msg: Buffer): Buffer {
  const m = Buffer.from(msg);
  m.writeUInt16BE(0, 2);
  m.writeUInt16BE(checksum6(ipv6Bytes(h.src), ipv6Bytes(h.dst), NH_ICMPV6, m), 2);
  return frame(h, NH_ICMPV6, m);
}

/** An Ethernet + IPv6 + UDP frame with its checksum. */
export function encodeUdp6Frame(h: EncodeFrame6, srcPort: number, dstPort: number, data: Buffer): Buffer {
  const m = Buffer.alloc(8 + data.length);
  m.writeUInt16BE(srcPort, 0);
  m.writeUInt16BE(dstPort, 2);
  m.writeUInt16BE(m.length, 4);
  data.copy(m, 8);
  let c = checksum6(ipv6Bytes(h.src), ipv6Bytes(h.dst), NH_UDP, m);
  if (c === 0) c = 0xffff; // RFC 768: a computed 0 is sent as all ones
  m.writeUInt16BE(c, 6);
  return frame(h, NH_UDP, m);
}

// ---- classic BPF (linux/filter.h), run on each frame before it is queued to the socket ----

const BPF = { LD_H_ABS: 0x28, LD_B_ABS: 0x30, JEQ_K: 0x15, RET_K: 0x06 } as const;

function insn(code: number, jt: number, jf: number, k: number): Buffer {
  const b = Buffer.alloc(8);
  b.writeUInt16LE(code, 0); // struct sock_filter is in host order: little-endian on x86-64 and arm64
  b[2] = jt;
  b[3] = jf;
  b.writeUInt32LE(k >>> 0, 4);
  return b;
}

/**
 * A filter that passes IPv6 frames whose next header (no extension header) is ICMPv6 of one of `icmpTypes` (1 to 8),
 * or UDP to `udpPort`; everything else (the VM's ordinary traffic) never reaches the socket.
 */
export function bpfIpv6Filter(want: { icmpTypes: readonly number[] } | { udpPort: number }): Buffer {
  const accept = insn(BPF.RET_K, 0, 0, 0x40000);
  const reject = insn(BPF.RET_K, 0, 0, 0);
  if ('icmpTypes' in want) {
    const types = want.icmpTypes;
    if (types.length < 1 || types.length > 8) throw new RangeError(`${types.length} ICMPv6 types: 1 to 8`);
    // each type test jumps to accept (past the remaining tests and the reject) or falls through to the next
    const tests = types.map((t, i) => insn(BPF.JEQ_K, types.length - i, 0, t));
    return Buffer.concat([
      insn(BPF.LD_H_ABS, 0, 0, 12),
      insn(BPF.JEQ_K, 0, 3 + types.length, ETHERTYPE_IPV6),
      insn(BPF.LD_B_ABS, 0, 0, ETH_HLEN + 6),
      insn(BPF.JEQ_K, 0, 1 + types.length, NH_ICMPV6),
      insn(BPF.LD_B_ABS, 0, 0, ETH_HLEN + IP6_HLEN),
      ...tests,
      reject,
      accept,
    ]);
  }
  return Buffer.concat([
    insn(BPF.LD_H_ABS, 0, 0, 12),
    insn(BPF.JEQ_K, 0, 4, ETHERTYPE_IPV6),
    insn(BPF.LD_B_ABS, 0, 0, ETH_HLEN + 6),
    insn(BPF.JEQ_K, 0, 2, NH_UDP),
    insn(BPF.LD_H_ABS, 0, 0, ETH_HLEN + IP6_HLEN + 2),
    insn(BPF.JEQ_K, 1, 0, want.udpPort),
    reject,
    accept,
  ]);
}
