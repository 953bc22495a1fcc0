import { describe, expect, it } from 'vitest';
import { CniError } from '../../src/cni/errors.js';
import { CNI_VERSIONS, compareVersions, convertResult, normalizeResult } from '../../src/cni/result.js';
import { fromV031, toV031 } from '../../src/protocol/result.js';
import type { CniResult } from '../../src/cni/types.js';

// One attachment (bridge + host-local, dual stack) as each version writes it.
const dns = { nameservers: ['10.1.0.1'], domain: 'example.com', search: ['svc.local'] };
const v02 = {
  cniVersion: '0.2.0',
  ip4: { ip: '10.1.0.5/24', gateway: '10.1.0.1', routes: [{ dst: '0.0.0.0/0', gw: '10.1.0.1' }] },
  ip6: { ip: 'fd00::5/64', gateway: 'fd00::1', routes: [{ dst: '::/0' }] },
  dns,
};
const ifaces = [
  { name: 'br0', mac: '0a:00:00:00:00:01' },
  { name: 'veth1', mac: '0a:00:00:00:00:02' },
  { name: 'eth0', mac: '0a:00:00:00:00:03', sandbox: '/var/run/netns/x' },
];
const v04 = (v: string) => ({
  cniVersion: v,
  interfaces: ifaces,
  ips: [
    { version: '4', interface: 2, address: '10.1.0.5/24', gateway: '10.1.0.1' },
    { version: '6', interface: 2, address: 'fd00::5/64', gateway: 'fd00::1' },
  ],
  routes: [{ dst: '0.0.0.0/0', gw: '10.1.0.1' }, { dst: '::/0' }],
  dns,
});
const v1 = (v: string) => ({
  cniVersion: v,
  interfaces: ifaces,
  ips: [
    { interface: 2, address: '10.1.0.5/24', gateway: '10.1.0.1' },
    { interface: 2, address: 'fd00::5/64', gateway: 'fd00::1' },
  ],
  routes: [{ dst: '0.0.0.0/0', gw: '10.1.0.1' }, { dst: '::/0' }],
  dns,
});
const normal = (v: string): CniResult => ({
  cniVersion: v,
  interfaces: ifaces,
  ips: [
    { interface: 2, address: '10.1.0.5/24', gateway: '10.1.0.1' },
    { interface: 2, address: 'fd00::5/64', gateway: 'fd00::1' },
  ],
  routes: [{ dst: '0.0.0.0/0', gw: '10.1.0.1' }, { dst: '::/0' }],
  dns,
});

describe('normalizeResult', () => {
  it.each(['0.1.0', '0.2.0'])('reads %s: ip4/ip6 become ips, their routes are concatenated', (v) => {
    expect(normalizeResult({ ...v02, cniVersion: v })).toEqual({
      cniVersion: v,
      interfaces: [],
      ips: [
        { address: '10.1.0.5/24', gateway: '10.1.0.1' },
        { address: 'fd00::5/64', gateway: 'fd00::1' },
      ],
      routes: [{ dst: '0.0.0.0/0', gw: '10.1.0.1' }, { dst: '::/0' }],
      dns,
    });
  });

  it.each(['0.3.0', '0.3.1', '0.4.0'])('reads %s and drops ips[].version', (v) => {
    expect(normalizeResult(v04(v))).toEqual(normal(v));
  });

  it.each(['1.0.0', '1.1.0'])('reads %s', (v) => {
    expect(normalizeResult(v1(v))).toEqual(normal(v));
  });

  it('keeps the 1.1.0 fields', () => {
    const r = normalizeResult({
      cniVersion: '1.1.0',
      interfaces: [{ name: 'eth0', mtu: 1450, socketPath: '/run/x.sock', pciID: '0000:00:05.0' }],
      routes: [{ dst: '10.0.0.0/8', gw: '10.1.0.1', mtu: 1400, advmss: 1360, priority: 5, table: 100, scope: 0 }],
    });
    expect(r.interfaces).toEqual([{ name: 'eth0', mtu: 1450, socketPath: '/run/x.sock', pciID: '0000:00:05.0' }]);
    expect(r.routes).toEqual([{ dst: '10.0.0.0/8', gw: '10.1.0.1', mtu: 1400, advmss: 1360, priority: 5, table: 100 }]);
    expect(r.ips).toEqual([]);
    expect(r.dns).toEqual({});
  });

  it('reads a result without cniVersion in the default (config) version', () => {
    const { cniVersion: _, ...noVersion } = v1('1.0.0');
    expect(normalizeResult(noVersion, '1.0.0').cniVersion).toBe('1.0.0');
  });

  it.each([['9.9.9'], [undefined], [3]])('rejects result version %s with CNI error code 1', (v) => {
    let err: unknown;
    try {
      normalizeResult({ cniVersion: v, ips: [] });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(CniError);
    expect((err as CniError).cniError.code).toBe(1);
    expect((err as CniError).message).toMatch(/^\[code 1\] incompatible CNI versions: result version/);
  });

  it('lists every malformed field at once as CNI error code 6', () => {
    let err: unknown;
    try {
      normalizeResult({
        cniVersion: '1.0.0',
        ips: [{ address: '10.1.0.5' }, { address: 'x/24', gateway: 'nope' }],
        routes: [{ gw: '1.1.1.1' }],
        interfaces: [{}],
      });
    } catch (e) {
      err = e;
    }
    expect((err as CniError).cniError.code).toBe(6);
    const d = (err as CniError).cniError.details ?? '';
    expect(d).toContain('ips[0].address "10.1.0.5" is not an address in CIDR form');
    expect(d).toContain('ips[1].address "x/24"');
    expect(d).toContain('ips[1].gateway "nope" is not an IP address');
    expect(d).toContain('routes[0].dst is missing');
    expect(d).toContain('interfaces[0].name is missing');
  });

  it('rejects a non-object', () => {
    expect(() => normalizeResult('x')).toThrow(/\[code 6\] invalid CNI result/);
    expect(() => normalizeResult([])).toThrow(CniError);
  });
});

describe('convertResult', () => {
  const r = normal('1.0.0');

  it.each(['0.1.0', '0.2.0'])('writes %s: first address per family, routes by dst family', (v) => {
    expect(convertResult(r, v)).toEqual({ ...v02, cniVersion: v });
  });

  it.each(['0.3.0', '0.3.1', '0.4.0'])('writes %s with ips[].version', (v) => {
    expect(convertResult(r, v)).toEqual(v04(v));
  });

  it.each(['1.0.0', '1.1.0'])('writes %s', (v) => {
    expect(convertResult(r, v)).toEqual(v1(v));
  });

  it('writes the 1.1.0-only fields only for 1.1.0', () => {
    const x: CniResult = {
      cniVersion: '1.1.0',
      interfaces: [{ name: 'eth0', mtu: 1450, pciID: 'p' }],
      ips: [{ address: '10.0.0.2/24' }],
      routes: [{ dst: '0.0.0.0/0', mtu: 1400, table: 7 }],
      dns: {},
    };
    expect(convertResult(x, '1.1.0')).toEqual({
      cniVersion: '1.1.0',
      interfaces: [{ name: 'eth0', mtu: 1450, pciID: 'p' }],
      ips: [{ address: '10.0.0.2/24' }],
      routes: [{ dst: '0.0.0.0/0', mtu: 1400, table: 7 }],
      dns: {},
    });
    expect(convertResult(x, '1.0.0')).toEqual({
      cniVersion: '1.0.0',
      interfaces: [{ name: 'eth0' }],
      ips: [{ address: '10.0.0.2/24' }],
      routes: [{ dst: '0.0.0.0/0' }],
      dns: {},
    });
    expect(convertResult(x, '0.4.0')).toEqual({
      cniVersion: '0.4.0',
      interfaces: [{ name: 'eth0' }],
      ips: [{ version: '4', address: '10.0.0.2/24' }],
      routes: [{ dst: '0.0.0.0/0' }],
      dns: {},
    });
  });

  it('round-trips every version through the normalised form', () => {
    for (const from of CNI_VERSIONS) {
      for (const to of CNI_VERSIONS) {
        const out = convertResult(normalizeResult(convertResult(r, from)), to) as { cniVersion: string };
        expect(out.cniVersion).toBe(to);
        const back = normalizeResult(out);
        // 0.1.0/0.2.0 have no interfaces and no interface index: only addresses and routes survive.
        const lossy = from.startsWith('0.1') || from.startsWith('0.2') || to.startsWith('0.1') || to.startsWith('0.2');
        if (lossy) expect(back.ips.map((i) => i.address)).toEqual(r.ips.map((i) => i.address));
        else expect({ ...back, cniVersion: '' }).toEqual({ ...r, cniVersion: '' });
        expect(back.routes).toEqual(r.routes);
      }
    }
  });

  it('cannot write 0.2.0 without an address', () => {
    expect(() => convertResult({ cniVersion: '1.0.0', interfaces: [], ips: [], routes: [], dns: {} }, '0.2.0')).toThrow(
      /\[code 1\] cannot convert result to 0.2.0/,
    );
  });

  it('refuses an unknown target version', () => {
    expect(() => convertResult(r, '2.0.0')).toThrow(/\[code 1\] incompatible CNI versions: target version "2.0.0"/);
  });

  it('does not share arrays with its input', () => {
    const out = convertResult(r, '1.0.0') as { dns: { nameservers: string[] } };
    out.dns.nameservers.push('x');
    expect(r.dns.nameservers).toEqual(['10.1.0.1']);
  });
});

describe('Virtlet 0.3.1 shape', () => {
  it('toV031: version on ips, interface omitted when 0, empty lists omitted, dns kept', () => {
    const r: CniResult = {
      cniVersion: '1.0.0',
      interfaces: [
        { name: 'eth0', mac: '0a:58:0a:01:00:05', sandbox: '/var/run/netns/p', mtu: 1450 },
        { name: 'eth1' },
      ],
      ips: [
        { interface: 0, address: '10.1.0.5/24', gateway: '10.1.0.1' },
        { interface: 1, address: 'fd00::5/64' },
        { address: '10.2.0.5/24' },
      ],
      routes: [],
      dns: {},
    };
    expect(toV031(r)).toEqual({
      cniVersion: '0.3.1',
      interfaces: [{ name: 'eth0', mac: '0a:58:0a:01:00:05', sandbox: '/var/run/netns/p' }, { name: 'eth1' }],
      ips: [
        { version: '4', address: '10.1.0.5/24', gateway: '10.1.0.1' },
        { version: '6', interface: 1, address: 'fd00::5/64' },
        { version: '4', address: '10.2.0.5/24' },
      ],
      dns: {},
    });
    expect(JSON.stringify(toV031(r))).not.toContain('"interface":0');
  });

  it('fromV031: a missing interface means index 0 when there are interfaces', () => {
    expect(
      fromV031({
        cniVersion: '0.3.1',
        interfaces: [{ name: 'eth0' }],
        ips: [
          { version: '4', address: '10.1.0.5/24' },
          { version: '4', interface: 0, address: '10.1.0.6/24' },
        ],
      }).ips,
    ).toEqual([
      { address: '10.1.0.5/24', interface: 0 },
      { address: '10.1.0.6/24', interface: 0 },
    ]);
    expect(fromV031({ ips: [{ version: '4', address: '10.1.0.5/24' }] })).toEqual({
      cniVersion: '0.3.1',
      interfaces: [],
      ips: [{ address: '10.1.0.5/24' }],
      routes: [],
      dns: {},
    });
  });

  it('round-trips', () => {
    const r = normal('0.3.1');
    expect(fromV031(toV031(r))).toEqual(r);
  });
});

describe('compareVersions', () => {
  it('compares numerically', () => {
    expect(compareVersions('0.10.0', '0.4.0')).toBeGreaterThan(0);
    expect(compareVersions('0.4.0', '0.4.0')).toBe(0);
    expect(compareVersions('0.3.1', '0.4.0')).toBeLessThan(0);
    expect(compareVersions('1.0.0', '0.4.0')).toBeGreaterThan(0);
  });
});
