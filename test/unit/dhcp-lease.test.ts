import { describe, expect, it } from 'vitest';
import type { CniResult } from '../../src/cni/types.js';
import { isVmpodError } from '../../src/errors.js';
import { buildOptions } from '../../src/dhcp/options.js';
import { leaseFromCni } from '../../src/dhcp/lease.js';

const bridgeResult: CniResult = {
  cniVersion: '1.0.0',
  interfaces: [
    { name: 'cni0', mac: '0a:58:0a:01:5a:01' },
    { name: 'veth1234', mac: '0a:58:0a:01:5a:02' },
    { name: 'eth0', mac: '0a:58:0a:01:5a:05', sandbox: '/var/run/netns/pod', mtu: 1450 },
  ],
  ips: [
    { address: 'fd00::5/64', gateway: 'fd00::1', interface: 2 },
    { address: '10.1.90.5/24', gateway: '10.1.90.1', interface: 2 },
  ],
  routes: [{ dst: '0.0.0.0/0' }, { dst: '10.17.0.0/16', gw: '10.1.90.254' }, { dst: '::/0' }],
  dns: { nameservers: ['10.96.0.10', 'fd00::10'], search: ['cluster.local'], domain: 'cluster.local' },
};

describe('leaseFromCni', () => {
  it('takes the IPv4 address, gateway, routes, DNS and MTU of the interface', () => {
    const l = leaseFromCni({ result: bridgeResult, ifIndex: 2, podName: 'vm-1', mac: '0A:58:0A:01:5A:05' });
    expect(l).toEqual({
      mac: '0a:58:0a:01:5a:05',
      ip: '10.1.90.5',
      prefixLength: 24,
      gateway: '10.1.90.1',
      routes: [
        { dst: '0.0.0.0/0', gw: '10.1.90.1' },
        { dst: '10.17.0.0/16', gw: '10.1.90.254' },
      ],
      dns: ['10.96.0.10'],
      search: ['cluster.local'],
      domain: 'cluster.local',
      hostname: 'vm-1',
      mtu: 1450,
      leaseSeconds: 86400,
    });
  });

  it("replaces the CNI DNS with the pod's when it has nameservers or search domains", () => {
    const l = leaseFromCni({
      result: bridgeResult,
      ifIndex: 2,
      mac: '02:00:00:00:00:01',
      podDns: { nameservers: ['10.0.0.10'], search: ['ns.svc.cluster.local', 'svc.cluster.local'] },
      mtu: 1400,
    });
    expect(l.dns).toEqual(['10.0.0.10']);
    expect(l.search).toEqual(['ns.svc.cluster.local', 'svc.cluster.local']);
    expect(l.domain).toBeUndefined();
    expect(l.mtu).toBe(1400);
    expect(l.hostname).toBeUndefined();
    const kept = leaseFromCni({
      result: bridgeResult,
      ifIndex: 2,
      mac: '02:00:00:00:00:01',
      podDns: { options: ['ndots:5'] },
    });
    expect(kept.dns).toEqual(['10.96.0.10']);
  });

  it('serves no DNS server when neither the pod nor the CNI result names one (no public resolver invented)', () => {
    const l = leaseFromCni({ result: { ...bridgeResult, dns: {} }, ifIndex: 2, mac: '02:00:00:00:00:01' });
    expect(l.dns).toEqual([]);
    expect(buildOptions(l, '169.254.254.2').options.find((o) => o.code === 6)).toBeUndefined();
  });

  it("serves the operator's --default-dns only when nothing else names a DNS server", () => {
    const none = leaseFromCni({
      result: { ...bridgeResult, dns: {} },
      ifIndex: 2,
      mac: '02:00:00:00:00:01',
      defaultDns: ['10.0.0.53'],
    });
    expect(none.dns).toEqual(['10.0.0.53']);
    const pod = leaseFromCni({
      result: { ...bridgeResult, dns: {} },
      ifIndex: 2,
      mac: '02:00:00:00:00:01',
      defaultDns: ['10.0.0.53'],
      podDns: { nameservers: ['10.96.0.10'] },
    });
    expect(pod.dns).toEqual(['10.96.0.10']);
  });

  it('reads an old result without interface indexes (one IP, no routes)', () => {
    const l = leaseFromCni({
      result: {
        cniVersion: '0.2.0',
        interfaces: [],
        ips: [{ address: '192.168.5.7/16', gateway: '192.168.0.1' }],
        routes: [],
        dns: {},
      },
      ifIndex: 0,
      mac: '02:00:00:00:00:01',
    });
    expect(l).toMatchObject({ ip: '192.168.5.7', prefixLength: 16, gateway: '192.168.0.1', routes: [] });
  });

  it('gives each of two interfaces the routes through its own subnet', () => {
    const two: CniResult = {
      cniVersion: '1.0.0',
      interfaces: [
        { name: 'eth0', sandbox: '/ns' },
        { name: 'net1', sandbox: '/ns' },
      ],
      ips: [
        { address: '10.1.0.5/24', gateway: '10.1.0.1', interface: 0 },
        { address: '192.168.7.5/24', interface: 1 },
      ],
      routes: [
        { dst: '0.0.0.0/0', gw: '10.1.0.1' },
        { dst: '172.16.0.0/12', gw: '192.168.7.1' },
      ],
      dns: {},
    };
    expect(leaseFromCni({ result: two, ifIndex: 0, mac: '02:00:00:00:00:01' }).routes).toEqual([
      { dst: '0.0.0.0/0', gw: '10.1.0.1' },
    ]);
    expect(leaseFromCni({ result: two, ifIndex: 1, mac: '02:00:00:00:00:02' }).routes).toEqual([
      { dst: '172.16.0.0/12', gw: '192.168.7.1' },
    ]);
  });

  it('throws VmpodError(Config) naming the interface when it has no IPv4 address', () => {
    let err: unknown;
    try {
      leaseFromCni({ result: bridgeResult, ifIndex: 1, mac: '02:00:00:00:00:01' });
    } catch (e) {
      err = e;
    }
    expect(isVmpodError(err)).toBe(true);
    expect((err as { code: string }).code).toBe('CONFIG');
    expect((err as Error).message).toMatch(/no IPv4 address for interface 1 \(veth1234\)/);
    expect(() =>
      // IPv6 only (with the gateway its ::/0 route needs): a lease for DHCPv6, none for DHCPv4
      leaseFromCni({
        result: { ...bridgeResult, ips: [{ address: 'fd00::5/64', gateway: 'fd00::1', interface: 2 }] },
        ifIndex: 2,
        mac: '02:00:00:00:00:01',
      }),
    ).toThrow(/no IPv4 address for interface 2 \(eth0\)/);
  });
});
