// The pure parts of a pod's check (src/podnet/check.ts): the prevResult CNI CHECK gets, and the links against the plan.
import { describe, expect, it } from 'vitest';
import { checkLinks, prevResultForCheck, redirectsTo } from '../../src/podnet/check.js';
import type { CniResult } from '../../src/cni/types.js';
import type { PodInterface } from '../../src/state/types.js';
import type { Observed, ObservedLink } from '../../src/podnet/types.js';

const NS = '/var/run/netns/pod1';
const cached: CniResult = {
  cniVersion: '1.0.0',
  interfaces: [
    { name: 'cni0', mac: '0a:00:00:00:00:01' },
    { name: 'veth1234', mac: '0a:00:00:00:00:02' },
    { name: 'virtlet-eth0', mac: '0a:00:00:00:00:03', sandbox: NS },
  ],
  ips: [{ interface: 2, address: '10.1.0.5/24', gateway: '10.1.0.1' }],
  routes: [{ dst: '0.0.0.0/0', gw: '10.1.0.1' }],
  dns: { nameservers: ['10.1.0.1'] },
};

const tapIface: PodInterface = {
  index: 2,
  cniName: 'virtlet-eth0',
  type: 'tap',
  vmMac: '0a:00:00:00:00:03',
  vethMacNew: '0e:11:22:33:44:55',
  mtu: 1500,
  tapName: 'tap0',
  bridgeName: 'br0',
  bridgeIp: '169.254.254.2',
  vlanId: 0,
};

describe('prevResultForCheck', () => {
  it('keeps the host side and the DNS, and drops the moved MAC, the addresses and the routes', () => {
    expect(prevResultForCheck(cached, [tapIface])).toEqual({
      cniVersion: '1.0.0',
      interfaces: [
        { name: 'cni0', mac: '0a:00:00:00:00:01' },
        { name: 'veth1234', mac: '0a:00:00:00:00:02' },
        { name: 'virtlet-eth0', sandbox: NS },
      ],
      ips: [],
      routes: [],
      dns: { nameservers: ['10.1.0.1'] },
    });
  });

  it("drops addresses without an interface index too (they are the first sandboxed interface's)", () => {
    const r = prevResultForCheck({ ...cached, ips: [{ address: '10.1.0.5/24' }] }, [tapIface]);
    expect(r.ips).toEqual([]);
  });

  it('keeps the MAC of an interface whose binding shares it with the VM', () => {
    const shared = { ...tapIface, vethMacNew: undefined } as PodInterface;
    delete shared.vethMacNew;
    expect(prevResultForCheck(cached, [shared]).interfaces[2]).toEqual({
      name: 'virtlet-eth0',
      mac: '0a:00:00:00:00:03',
      sandbox: NS,
    });
  });

  it('leaves the cached result as it was', () => {
    const before = JSON.stringify(cached);
    prevResultForCheck(cached, [tapIface]);
    expect(JSON.stringify(cached)).toBe(before);
  });
});

const link = (name: string, extra: Partial<ObservedLink> = {}): ObservedLink => ({
  name,
  index: 1,
  mac: '0e:00:00:00:00:99',
  mtu: 1500,
  up: true,
  addrs4: [],
  ...extra,
});
const healthy = (): Observed => ({
  links: [
    link('lo'),
    link('virtlet-eth0', { kind: 'veth', mac: '0e:11:22:33:44:55', master: 'br0' }),
    link('br0', { kind: 'bridge' }),
    link('tap0', { kind: 'tun', master: 'br0' }),
  ],
  routes4: [],
});

describe('checkLinks (the bridge binding)', () => {
  it('passes a pod as the plan left it', async () => {
    expect(await checkLinks([tapIface], { observed: healthy(), nsPath: NS })).toEqual([]);
  });

  it('names a missing, a down and an unbridged link', async () => {
    const o = healthy();
    o.links = o.links.filter((l) => l.name !== 'tap0');
    o.links.find((l) => l.name === 'br0')!.up = false;
    delete o.links.find((l) => l.name === 'virtlet-eth0')!.master;
    expect(await checkLinks([tapIface], { observed: o, nsPath: NS })).toEqual([
      { reason: 'link-down', detail: 'the bridge br0 is down' },
      { reason: 'link-missing', detail: 'the tap tap0 is gone from the pod netns' },
      { reason: 'link-unbridged', detail: 'virtlet-eth0 is not a port of br0 (its master: none)' },
    ]);
  });

  it("finds the VM's MAC back on the CNI interface", async () => {
    const o = healthy();
    o.links.find((l) => l.name === 'virtlet-eth0')!.mac = '0a:00:00:00:00:03';
    expect((await checkLinks([tapIface], { observed: o, nsPath: NS })).map((f) => f.reason)).toEqual([
      'mac-misplaced',
      'mac-misplaced',
    ]);
  });
});

describe('the tc-redirect binding', () => {
  const tcIface: PodInterface = { ...tapIface, binding: 'tc-redirect', bridgeName: '', vmMac: '0a:00:00:00:00:03' };
  delete tcIface.vethMacNew;
  const redirect = (to: string) =>
    JSON.stringify([
      { parent: 'ffff:', kind: 'u32' },
      {
        parent: 'ffff:',
        kind: 'u32',
        options: {
          actions: [{ order: 1, kind: 'mirred', mirred_action: 'redirect', direction: 'egress', to_dev: to }],
        },
      },
    ]);
  const observed = (): Observed => ({
    links: [link('virtlet-eth0', { kind: 'macvlan', mac: '0a:00:00:00:00:03' }), link('tap0', { kind: 'tun' })],
    routes4: [],
  });

  it('reads the redirect out of tc -j filter show', () => {
    expect(redirectsTo(redirect('tap0'), 'tap0')).toBe(true);
    expect(redirectsTo(redirect('tap0'), 'virtlet-eth0')).toBe(false);
    expect(redirectsTo('', 'tap0')).toBe(false);
    expect(redirectsTo('not json', 'tap0')).toBe(false);
  });

  it('passes with both filters and the shared MAC, and names a missing filter', async () => {
    const filters: Record<string, string> = { 'virtlet-eth0': redirect('tap0'), tap0: redirect('virtlet-eth0') };
    const exec = {
      inNetns: async (_ns: string, argv: string[]) => ({ exitCode: 0, stdout: filters[argv[5]!] ?? '', stderr: '' }),
    };
    expect(await checkLinks([tcIface], { observed: observed(), nsPath: NS, exec })).toEqual([]);
    filters.tap0 = '[]';
    expect(await checkLinks([tcIface], { observed: observed(), nsPath: NS, exec })).toEqual([
      { reason: 'redirect-missing', detail: 'tap0 has no ingress filter redirecting its frames to virtlet-eth0' },
    ]);
  });
});
