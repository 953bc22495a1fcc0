import { describe, expect, it } from 'vitest';
import { inSubnet4, intToIp, ipToBytes, ipToInt, isCidr4, isIpv4, parseCidr } from '../../src/net/ip.js';

describe('IPv4 addresses and prefixes', () => {
  it('takes dotted quads only: four decimal octets up to 255, no leading zeros, nothing around them', () => {
    for (const ok of ['0.0.0.0', '10.1.2.3', '255.255.255.255', '192.168.0.10', '1.0.0.1'])
      expect(isIpv4(ok)).toBe(true);
    for (const bad of [
      '',
      '1.2.3',
      '1.2.3.4.5',
      '256.1.1.1',
      '1.2.3.04',
      '01.2.3.4',
      '1..3.4',
      '1.2.3.4 ',
      ' 1.2.3.4',
      '1.2.3.4/32',
      'a.b.c.d',
      '1.2.3.-4',
      '1.2.3.1000',
      '::1',
      '1.2.3.4.',
    ]) {
      expect(isIpv4(bad), bad).toBe(false);
    }
  });

  it('converts between text, integers and bytes, the high bit included', () => {
    expect(ipToInt('10.1.2.3')).toBe(0x0a010203);
    expect(ipToInt('255.255.255.254')).toBe(0xfffffffe);
    expect(intToIp(0xc0a80001)).toBe('192.168.0.1');
    expect([...ipToBytes('172.16.254.1')]).toEqual([172, 16, 254, 1]);
    expect(() => ipToInt('1.2.3.256')).toThrow('not an IPv4 address: "1.2.3.256"');
  });

  it('reads prefixes, clearing host bits, and tells membership without throwing for IPv6', () => {
    expect(parseCidr('10.1.2.3/16')).toEqual({ dst: '10.1.0.0', prefix: 16 });
    expect(parseCidr('200.1.2.3/0')).toEqual({ dst: '0.0.0.0', prefix: 0 });
    expect(parseCidr('200.1.2.3/32')).toEqual({ dst: '200.1.2.3', prefix: 32 });
    for (const bad of ['10.1.2.3', '10.1.2.3/33', '10.1.2.3/', '10.1.2/8', 'fd00::1/64', '10.1.2.3/1x'])
      expect(isCidr4(bad), bad).toBe(false);
    expect(() => parseCidr('fd00::/64')).toThrow('not an IPv4 CIDR: "fd00::/64"');
    expect(inSubnet4('192.168.1.77', '192.168.1.0/24')).toBe(true);
    expect(inSubnet4('192.168.2.77', '192.168.1.0/24')).toBe(false);
    expect(inSubnet4('200.0.0.1', '128.0.0.0/1')).toBe(true);
    expect(inSubnet4('fd00::1', 'fd00::/64')).toBe(false);
  });
});
