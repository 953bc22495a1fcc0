// IPv4 addresses and prefixes (pure): the one home of the address helpers every module uses.
import { isIpv6 } from './ipv6.js';
import { ErrorCode, VmpodError } from '../errors.js';

/**
 * The address as an unsigned 32-bit integer, or -1 when s is not a dotted quad (four decimal octets, no leading
 * zeros). Every IPv4 helper goes through it: no regex, no Buffer, no exception (a DHCP server's lease is built from
 * dozens of such checks, on every add and for every pod of a restart).
 */
function v4(s: string): number {
  let n = 0;
  let octets = 0;
  let i = 0;
  const len = s.length;
  while (octets < 4) {
    const start = i;
    let o = 0;
    while (i < len) {
      const c = s.charCodeAt(i);
      if (c < 48 || c > 57) break;
      o = o * 10 + (c - 48);
      i++;
    }
    const digits = i - start;
    if (digits === 0 || digits > 3 || o > 255 || (digits > 1 && s.charCodeAt(start) === 48)) return -1;
    n = n * 256 + o;
    octets++;
    if (octets < 4) {
      if (s.charCodeAt(i) !== 46) return -1;
      i++;
    }
  }
  return i === len ? n : -1;
}

/** Dotted-quad IPv4, no leading zeros. */
export function isIpv4(s: string): boolean {
  return v4(s) >= 0;
}

/** 4 or 6 for an IPv4 or IPv6 address (no zone), 0 for anything else: node:net's isIP without loading node:net
 * (its streams would weigh on every vmwrapper start: docs/performance.md). */
export function ipFamily(s: string): 0 | 4 | 6 {
  return isIpv4(s) ? 4 : isIpv6(s) ? 6 : 0;
}

/** An IPv4 or IPv6 address. */
export function isIp(s: string): boolean {
  return ipFamily(s) !== 0;
}

/** An IPv4 or IPv6 address with a prefix length ("10.1.0.5/24", "fd00::1/64"). */
export function isCidr(s: unknown): s is string {
  if (typeof s !== 'string') return false;
  const slash = s.indexOf('/');
  if (slash < 0) return false;
  const fam = ipFamily(s.slice(0, slash));
  const bits = s.slice(slash + 1);
  if (fam === 0 || !/^\d{1,3}$/.test(bits)) return false;
  return Number(bits) <= (fam === 4 ? 32 : 128);
}

function notV4(s: string): VmpodError {
  return new VmpodError(ErrorCode.Config, `not an IPv4 address: ${JSON.stringify(s)}`);
}

/** "10.1.2.3" -> 4 bytes; throws VmpodError(Config) quoting the value. */
export function ipToBytes(s: string): Buffer {
  const n = v4(s);
  if (n < 0) throw notV4(s);
  return Buffer.from([n >>> 24, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff]);
}

export function bytesToIp(b: Buffer, off = 0): string {
  return `${b[off]}.${b[off + 1]}.${b[off + 2]}.${b[off + 3]}`;
}

export function ipToInt(s: string): number {
  const n = v4(s);
  if (n < 0) throw notV4(s);
  return n;
}

export function intToIp(n: number): string {
  return `${n >>> 24}.${(n >>> 16) & 0xff}.${(n >>> 8) & 0xff}.${n & 0xff}`;
}

/** network mask for a prefix length, as an unsigned 32-bit integer */
export function prefixToMask(prefix: number): number {
  return prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) >>> 0;
}

/** "10.1.0.0/16" -> { dst, prefix }; host bits are cleared. Throws VmpodError(Config) quoting the value. */
export function parseCidr(s: string): { dst: string; prefix: number } {
  const c = cidr4(s);
  if (c === undefined) throw new VmpodError(ErrorCode.Config, `not an IPv4 CIDR: ${JSON.stringify(s)}`);
  return { dst: intToIp(c.net), prefix: c.prefix };
}

/** "a.b.c.d/p" as its network (an unsigned integer) and prefix; undefined when it is not one. */
function cidr4(s: string): { net: number; prefix: number } | undefined {
  const slash = s.indexOf('/');
  const bits = s.slice(slash + 1);
  if (slash < 0 || !/^\d{1,2}$/.test(bits) || Number(bits) > 32) return undefined;
  const a = v4(s.slice(0, slash));
  if (a < 0) return undefined;
  const prefix = Number(bits);
  return { net: (a & prefixToMask(prefix)) >>> 0, prefix };
}

/** Is s an IPv4 address with a prefix length? */
export function isCidr4(s: string): boolean {
  return cidr4(s) !== undefined;
}

/** Is ip inside the subnet of cidr (address/prefix)? False when either is not IPv4. */
export function inSubnet4(ip: string, cidr: string): boolean {
  const a = v4(ip);
  const c = cidr4(cidr);
  if (a < 0 || c === undefined) return false;
  return (a & prefixToMask(c.prefix)) >>> 0 === c.net;
}
