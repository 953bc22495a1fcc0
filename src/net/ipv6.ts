// IPv6 addresses as text and bytes (RFC 4291, RFC 5952), and the link-local and multicast addresses that follow
// from a MAC (RFC 4291 2.5.6 / appendix A, RFC 2464). Pure.

/** "2001:db8::1" -> 16 bytes; undefined for anything that is not an IPv6 address (no zone, no prefix). */
export function parseIpv6(text: string): Buffer | undefined {
  if (typeof text !== 'string' || text.length < 2 || text.length > 45 || !/^[0-9A-Fa-f:.]+$/.test(text))
    return undefined;
  let s = text;
  if (s.includes('.')) {
    // an embedded IPv4 in the last 32 bits (::ffff:10.1.2.3): rewritten as two hex groups
    const lastColon = s.lastIndexOf(':');
    const v4 = s.slice(lastColon + 1).split('.');
    if (lastColon < 0 || v4.length !== 4 || v4.some((o) => !/^\d{1,3}$/.test(o) || Number(o) > 255)) return undefined;
    const o = v4.map(Number);
    s = `${s.slice(0, lastColon + 1)}${((o[0]! << 8) | o[1]!).toString(16)}:${((o[2]! << 8) | o[3]!).toString(16)}`;
  }
  const halves = s.split('::');
  if (halves.length > 2) return undefined;
  const group = (h: string): number[] | undefined => {
    if (h === '') return [];
    const parts = h.split(':');
    if (parts.some((p) => !/^[0-9A-Fa-f]{1,4}$/.test(p))) return undefined;
    return parts.map((p) => parseInt(p, 16));
  };
  const head = group(halves[0]!);
  const rest = halves.length === 2 ? group(halves[1]!) : [];
  if (!head || !rest) return undefined;
  const words: number[] = [];
  if (halves.length === 2) {
    const missing = 8 - head.length - rest.length;
    if (missing < 1) return undefined;
    words.push(...head, ...new Array<number>(missing).fill(0), ...rest);
  } else {
    words.push(...head);
  }
  if (words.length !== 8) return undefined;
  const b = Buffer.alloc(16);
  words.forEach((w, i) => b.writeUInt16BE(w, i * 2));
  return b;
}

export function isIpv6(text: string): boolean {
  return parseIpv6(text) !== undefined;
}

/** 16 bytes -> RFC 5952 text: lower case, the longest run (>= 2) of zero groups as "::", leftmost on a tie. */
export function formatIpv6(b: Uint8Array): string {
  if (b.length !== 16) throw new RangeError(`an IPv6 address is 16 bytes, got ${b.length}`);
  const w = Array.from({ length: 8 }, (_, i) => (b[i * 2]! << 8) | b[i * 2 + 1]!);
  let best = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    if (w[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && w[j] === 0) j++;
    if (j - i > bestLen) {
      best = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = (xs: number[]) => xs.map((x) => x.toString(16)).join(':');
  if (best < 0) return hex(w);
  return `${hex(w.slice(0, best))}::${hex(w.slice(best + bestLen))}`;
}

/** The canonical text of an IPv6 address, undefined if it is not one. */
export function normaliseIpv6(text: string): string | undefined {
  const b = parseIpv6(text);
  return b ? formatIpv6(b) : undefined;
}

/** "2001:db8::5/64" -> { ip: canonical, prefix }; undefined for anything else. */
export function parseCidr6(cidr: string): { ip: string; bytes: Buffer; prefix: number } | undefined {
  const [a, p, extra] = cidr.split('/');
  if (extra !== undefined || a === undefined || p === undefined || !/^\d{1,3}$/.test(p)) return undefined;
  const bytes = parseIpv6(a);
  const prefix = Number(p);
  if (!bytes || prefix > 128) return undefined;
  return { ip: formatIpv6(bytes), bytes, prefix };
}

/** The first `prefix` bits of an address, the rest zero. */
export function networkOf(addr: Uint8Array, prefix: number): Buffer {
  const out = Buffer.alloc(16);
  for (let i = 0; i < 16; i++) {
    const bits = Math.max(0, Math.min(8, prefix - i * 8));
    out[i] = addr[i]! & ((0xff << (8 - bits)) & 0xff);
  }
  return out;
}

/** Is `ip` inside `net`/`prefix`? */
export function inSubnet6(ip: string, net: string, prefix: number): boolean {
  const a = parseIpv6(ip);
  const n = parseIpv6(net);
  if (!a || !n) return false;
  return networkOf(a, prefix).equals(networkOf(n, prefix));
}

/** fe80::/10 */
export function isLinkLocal6(b: Uint8Array): boolean {
  return b[0] === 0xfe && (b[1]! & 0xc0) === 0x80;
}

/** ff00::/8 */
export function isMulticast6(b: Uint8Array): boolean {
  return b[0] === 0xff;
}

/** "aa:bb:cc:dd:ee:ff" -> 6 bytes; RangeError for anything else. */
export function macBytes(mac: string): Buffer {
  const parts = mac.split(/[:-]/);
  if (parts.length !== 6 || parts.some((p) => !/^[0-9A-Fa-f]{2}$/.test(p)))
    throw new RangeError(`not a MAC address: ${mac}`);
  return Buffer.from(parts.map((p) => parseInt(p, 16)));
}

/** The modified EUI-64 link-local address of a MAC (RFC 4291 appendix A): fe80::(mac[0]^2)mac[1]:mac[2]ff:fe... */
export function linkLocalFromMac(mac: string): Buffer {
  const m = macBytes(mac);
  const b = Buffer.alloc(16);
  b[0] = 0xfe;
  b[1] = 0x80;
  b[8] = m[0]! ^ 0x02;
  b[9] = m[1]!;
  b[10] = m[2]!;
  b[11] = 0xff;
  b[12] = 0xfe;
  b[13] = m[3]!;
  b[14] = m[4]!;
  b[15] = m[5]!;
  return b;
}

/** The Ethernet destination of an IPv6 multicast address (RFC 2464 7): 33:33 + its last 32 bits. */
export function multicastMac(addr: Uint8Array): Buffer {
  return Buffer.from([0x33, 0x33, addr[12]!, addr[13]!, addr[14]!, addr[15]!]);
}
