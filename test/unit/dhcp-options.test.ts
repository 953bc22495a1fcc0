import { describe, expect, it } from 'vitest';
import { isVmpodError } from '../../src/errors.js';
import type { DhcpLease } from '../../src/dhcp/lease.js';
import {
  buildOptions,
  decodeClasslessRoutes,
  decodeDomainSearch,
  encodeClasslessRoutes,
  encodeDomainSearch,
  orderByRequest,
  planRoutes,
  sortRoutes,
} from '../../src/dhcp/options.js';
import { domainNameProblems } from '../../src/net/dns.js';
import { parseCidr } from '../../src/net/ip.js';
import { thrownError as thrown } from '../helpers/errors.js';

const lease: DhcpLease = {
  mac: '02:42:AC:11:00:02',
  ip: '10.1.90.5',
  prefixLength: 24,
  gateway: '10.1.90.1',
  routes: [
    { dst: '0.0.0.0/0', gw: '10.1.90.1' },
    { dst: '10.17.0.0/16', gw: '10.1.90.1' },
  ],
  dns: ['10.96.0.10', '8.8.4.4'],
  search: ['default.svc.cluster.local', 'svc.cluster.local', 'cluster.local'],
  domain: 'cluster.local',
  hostname: 'vm-pod',
  mtu: 1450,
  leaseSeconds: 86400,
};

function opt(built: ReturnType<typeof buildOptions>, code: number): Buffer | undefined {
  return built.options.find((o) => o.code === code)?.data;
}

describe('RFC 3442 classless static routes (option 121)', () => {
  it('encodes the RFC examples', () => {
    expect([...encodeClasslessRoutes([{ dst: '10.17.0.0', prefix: 16, gw: '10.229.0.128' }])]).toEqual([
      16, 10, 17, 10, 229, 0, 128,
    ]);
    expect([...encodeClasslessRoutes([{ dst: '10.27.129.0', prefix: 24, gw: '10.229.0.128' }])]).toEqual([
      24, 10, 27, 129, 10, 229, 0, 128,
    ]);
    expect([...encodeClasslessRoutes([{ dst: '0.0.0.0', prefix: 0, gw: '10.0.0.1' }])]).toEqual([0, 10, 0, 0, 1]);
    expect([...encodeClasslessRoutes([{ dst: '10.229.0.128', prefix: 25, gw: '10.229.0.128' }])]).toEqual([
      25, 10, 229, 0, 128, 10, 229, 0, 128,
    ]);
    expect([...encodeClasslessRoutes([{ dst: '169.254.254.2', prefix: 32, gw: '0.0.0.0' }])]).toEqual([
      32, 169, 254, 254, 2, 0, 0, 0, 0,
    ]);
  });

  it('decodes what it encodes, and rejects truncation', () => {
    const r = [
      { dst: '169.254.254.2', prefix: 32, gw: '0.0.0.0' },
      { dst: '10.17.0.0', prefix: 16, gw: '10.229.0.128' },
      { dst: '0.0.0.0', prefix: 0, gw: '10.0.0.1' },
    ];
    const b = encodeClasslessRoutes(r);
    expect(decodeClasslessRoutes(b)).toEqual(r);
    for (let n = 1; n < b.length; n++) {
      if ([9, 16].includes(n)) continue; // route boundaries
      expect(() => decodeClasslessRoutes(b.subarray(0, n)), `${n}`).toThrow(/option 121/);
    }
  });

  it('sorts on-link routes first and the default route last, otherwise stable', () => {
    const s = sortRoutes([
      { dst: '0.0.0.0', prefix: 0, gw: '10.0.0.1' },
      { dst: '10.2.0.0', prefix: 16, gw: '10.0.0.1' },
      { dst: '10.0.0.1', prefix: 32, gw: '0.0.0.0' },
      { dst: '10.3.0.0', prefix: 16, gw: '10.0.0.1' },
    ]);
    expect(s.map((r) => `${r.dst}/${r.prefix}`)).toEqual(['10.0.0.1/32', '10.2.0.0/16', '10.3.0.0/16', '0.0.0.0/0']);
  });

  it('parses CIDRs, clearing host bits', () => {
    expect(parseCidr('10.1.2.3/16')).toEqual({ dst: '10.1.0.0', prefix: 16 });
    expect(() => parseCidr('10.1.2.3/33')).toThrow(/not an IPv4 CIDR/);
    expect(() => parseCidr('fd00::/8')).toThrow(/not an IPv4 CIDR/);
  });
});

describe('RFC 3397 domain search (option 119)', () => {
  it('encodes the RFC example with compression and decodes it back', () => {
    const b = encodeDomainSearch(['eng.apple.com', 'marketing.apple.com']);
    const expected = Buffer.concat([
      Buffer.from([3]),
      Buffer.from('eng'),
      Buffer.from([5]),
      Buffer.from('apple'),
      Buffer.from([3]),
      Buffer.from('com'),
      Buffer.from([0]),
      Buffer.from([9]),
      Buffer.from('marketing'),
      Buffer.from([0xc0, 0x04]),
    ]);
    expect(b.equals(expected)).toBe(true);
    expect(decodeDomainSearch(b)).toEqual(['eng.apple.com', 'marketing.apple.com']);
  });

  it('terminates every name (the last one too: Virtlet did not)', () => {
    const b = encodeDomainSearch(['a.example', 'b.test']);
    expect(b[b.length - 1]).toBe(0);
    expect(decodeDomainSearch(b)).toEqual(['a.example', 'b.test']);
  });

  it('decodes uncompressed lists and refuses pointer loops and overruns', () => {
    const plain = Buffer.from([3, 0x66, 0x6f, 0x6f, 0, 3, 0x62, 0x61, 0x72, 0]);
    expect(decodeDomainSearch(plain)).toEqual(['foo', 'bar']);
    expect(() => decodeDomainSearch(Buffer.from([0xc0, 0x00]))).toThrow(/option 119/);
    expect(() => decodeDomainSearch(Buffer.from([5, 0x61]))).toThrow(/option 119/);
  });

  it('names each bad domain', () => {
    expect(domainNameProblems('ok.example', 'search domain')).toEqual([]);
    expect(domainNameProblems(`${'a'.repeat(64)}.example`, 'search domain')[0]).toMatch(/64 bytes, at most 63/);
    const long = Array.from({ length: 5 }, () => 'b'.repeat(63)).join('.');
    expect(domainNameProblems(long, 'search domain')[0]).toMatch(/bytes encoded, at most 255/);
    expect(domainNameProblems('has space.example', 'search domain')[0]).toMatch(/bad label/);
    expect(domainNameProblems('', 'search domain')[0]).toMatch(/empty/);
  });
});

describe('buildOptions', () => {
  it("keeps its options' bytes in one allocation of their size, not in a slab of Node's 64 KiB buffer pool", () => {
    const b = buildOptions(lease, '169.254.254.2');
    const total = b.options.reduce((n, o) => n + o.data.length, 0);
    for (const o of b.options) expect(o.data.buffer).toBe(b.options[0]!.data.buffer);
    expect(b.options[0]!.data.buffer.byteLength).toBe(total);
    expect(total).toBeLessThan(Buffer.poolSize);
  });

  it('builds every option of the lease, validated', () => {
    const b = buildOptions(lease, '169.254.254.2');
    expect(b.options.map((o) => o.code)).toEqual([54, 1, 3, 121, 6, 15, 119, 12, 26, 51, 58, 59]);
    expect([...opt(b, 54)!]).toEqual([169, 254, 254, 2]);
    expect([...opt(b, 1)!]).toEqual([255, 255, 255, 0]);
    expect([...opt(b, 3)!]).toEqual([10, 1, 90, 1]);
    expect(decodeClasslessRoutes(opt(b, 121)!)).toEqual([
      { dst: '169.254.254.2', prefix: 32, gw: '0.0.0.0' },
      { dst: '10.17.0.0', prefix: 16, gw: '10.1.90.1' },
      { dst: '0.0.0.0', prefix: 0, gw: '10.1.90.1' },
    ]);
    expect([...opt(b, 6)!]).toEqual([10, 96, 0, 10, 8, 8, 4, 4]);
    expect(opt(b, 15)!.toString()).toBe('cluster.local');
    expect(decodeDomainSearch(opt(b, 119)!)).toEqual(lease.search);
    expect(opt(b, 12)!.toString()).toBe('vm-pod');
    expect(opt(b, 26)!.readUInt16BE(0)).toBe(1450);
    expect(opt(b, 51)!.readUInt32BE(0)).toBe(86400);
    expect(opt(b, 58)!.readUInt32BE(0)).toBe(43200);
    expect(opt(b, 59)!.readUInt32BE(0)).toBe(75600);
  });

  it('puts a default route via the gateway into 121 when the lease has a gateway but no default route', () => {
    const p = planRoutes({ ...lease, routes: [] }, '169.254.254.2');
    expect(p.router).toBe('10.1.90.1');
    expect(p.routes.at(-1)).toEqual({ dst: '0.0.0.0', prefix: 0, gw: '10.1.90.1' });
  });

  it('sends no router and no default route without a gateway', () => {
    const b = buildOptions({ ...lease, gateway: undefined, routes: [] }, '169.254.254.2');
    expect(opt(b, 3)).toBeUndefined();
    expect(decodeClasslessRoutes(opt(b, 121)!)).toEqual([{ dst: '169.254.254.2', prefix: 32, gw: '0.0.0.0' }]);
  });

  it('adds an on-link host route for a gateway outside the subnet (a /32 pod address, Calico style)', () => {
    const p = planRoutes(
      {
        ...lease,
        ip: '10.1.90.5',
        prefixLength: 32,
        gateway: '169.254.1.1',
        routes: [{ dst: '0.0.0.0/0', gw: '169.254.1.1' }],
      },
      '169.254.254.2',
    );
    expect(p.routes.map((r) => `${r.dst}/${r.prefix} ${r.gw}`)).toEqual([
      '169.254.254.2/32 0.0.0.0',
      '169.254.1.1/32 0.0.0.0',
      '0.0.0.0/0 169.254.1.1',
    ]);
  });

  it('leaves out T1/T2 for an infinite lease and options the lease does not have', () => {
    const b = buildOptions(
      {
        mac: '02:00:00:00:00:01',
        ip: '10.0.0.2',
        prefixLength: 8,
        routes: [],
        dns: [],
        search: [],
        leaseSeconds: 0xffffffff,
      },
      '169.254.254.2',
    );
    expect(b.options.map((o) => o.code)).toEqual([54, 1, 121, 51]);
  });

  it('throws VmpodError(Config) listing every problem before anything starts', () => {
    const e = thrown(() =>
      buildOptions(
        {
          ...lease,
          mac: 'zz',
          mtu: 40,
          dns: ['fd00::1'],
          search: ['ok.example', `${'x'.repeat(70)}.example`],
          leaseSeconds: 0,
          prefixLength: 33,
        },
        '169.254.254.300',
      ),
    );
    expect(isVmpodError(e)).toBe(true);
    expect(e.code).toBe('CONFIG');
    for (const frag of [
      'server id "169.254.254.300"',
      'MAC "zz"',
      'prefix length 33',
      'DNS server "fd00::1"',
      '70 bytes, at most 63',
      'MTU 40',
      'lease time 0',
    ]) {
      expect(e.message).toContain(frag);
    }
  });

  it('refuses options over 255 bytes (no RFC 3396 splitting: busybox reads only the first piece)', () => {
    const routes = Array.from({ length: 40 }, (_, i) => ({ dst: `10.${i}.0.0/16`, gw: '10.1.90.1' }));
    expect(() => buildOptions({ ...lease, routes }, '169.254.254.2')).toThrow(
      /option 121 needs 2\d\d bytes, at most 255 \(too many routes\)/,
    );
    const search = Array.from({ length: 12 }, (_, i) => `team${i}-${'x'.repeat(20)}.ns${i}.example.org`);
    expect(() => buildOptions({ ...lease, search }, '169.254.254.2')).toThrow(
      /option 119 needs \d+ bytes, at most 255 \(search domains/,
    );
  });

  it('refuses a lease whose reply cannot fit a 576-byte datagram even with file and sname', () => {
    const search = Array.from({ length: 8 }, (_, i) => `team${i}-${'x'.repeat(20)}.example.org`);
    const routes = Array.from({ length: 30 }, (_, i) => ({ dst: `10.${i}.0.0/16`, gw: '10.1.90.1' }));
    const dns = Array.from({ length: 50 }, (_, i) => `10.0.0.${i + 1}`);
    expect(() => buildOptions({ ...lease, search, routes, dns }, '169.254.254.2')).toThrow(
      /does not fit a 576-byte datagram/,
    );
    // but the same search list alone fits (with option 52)
    expect(() => buildOptions({ ...lease, search }, '169.254.254.2')).not.toThrow();
  });

  it('orders by the parameter request list loosely, 53 and 54 first', () => {
    const b = buildOptions(lease, '169.254.254.2');
    const o = orderByRequest([{ code: 53, data: Buffer.from([2]) }, ...b.options], Buffer.from([26, 121, 1, 99]));
    expect(o.map((x) => x.code)).toEqual([53, 54, 26, 121, 1, 3, 6, 15, 119, 12, 51, 58, 59]);
  });
});
