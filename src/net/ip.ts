// IPv4 addresses and prefixes (pure): the one home of the address helpers every module uses.
import { isIpv6 } from './ipv6.js';
import { ErrorCode, VmpodError } from '../errors.js';

const IPV4 = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/;

/** Dotted-quad IPv4, no leading zeros. */
export function isIpv4(s: string): boolean {
  const m = IPV4.exec(s);
  return m !== null && m.slice(1).every((o) => Number(o) <= 255 && String(Number(o)) === o);
}

/** 4 or 6 for an IPv4 or IPv6 address (no zone), 0 for anything else: node:net's isIP without loading node:net
 * (its streams cost vmwrapper's start ~1 ms). */
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

/** "10.1.2.3" -> 4 bytes; throws VmpodError(Config) quoting the value. */
export function ipToBytes(s: string): Buffer {
  if (!isIpv4(s)) throw new VmpodError(ErrorCode.Config, `not an IPv4 address: ${JSON.stringify(s)}`);
  return Buffer.from(s.split('.').map(Number));
}

export function bytesToIp(b: Buffer, off = 0): string {
  return `${b[off]}.${b[off + 1]}.${b[off + 2]}.${b[off + 3]}`;
}

export function ipToInt(s: string): number {
  return ipToBytes(s).readUInt32BE(0);
}

export function intToIp(n: number): string {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n >>> 0, 0);
  return bytesToIp(b);
}

/** network mask for a prefix length, as an unsigned 32-bit integer */
export function prefixToMask(prefix: number): number {
  return prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) >>> 0;
}

/** "10.1.0.0/16" -> { dst, prefix }; host bits are cleared. Throws VmpodError(Config) quoting the value. */
export function parseCidr(s: string): { dst: string; prefix: number } {
  const m = /^([0-9.]+)\/(\d{1,2})$/.exec(s);
  const prefix = m ? Number(m[2]) : NaN;
  if (!m || !isIpv4(m[1]!) || prefix > 32) throw new VmpodError(ErrorCode.Config, `not an IPv4 CIDR: ${JSON.stringify(s)}`);
  return { dst: intToIp(ipToInt(m[1]!) & prefixToMask(prefix)), prefix };
}

/** Is s an IPv4 address with a prefix length? */
export function isCidr4(s: string): boolean {
  try {
    parseCidr(s);
    return true;
  } catch {
    return false;
  }
}

/** Is ip inside the subnet of cidr (address/prefix)? False when either is not IPv4. */
export function inSubnet4(ip: string, cidr: string): boolean {
  if (!isIpv4(ip) || !isCidr4(cidr)) return false;
  const { dst, prefix } = parseCidr(cidr);
  const mask = prefixToMask(prefix);
  return ((ipToInt(ip) & mask) >>> 0) === ((ipToInt(dst) & mask) >>> 0);
}
