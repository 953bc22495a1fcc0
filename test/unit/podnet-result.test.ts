import { describe, it, expect } from 'vitest';
import { inSubnet4 } from '../../src/net/ip.js';
import { completeResult, fixOffSubnetGateways, isIncomplete, routeDstToCidr } from '../../src/podnet/result.js';
import { parseObserved, splitJsonValues } from '../helpers/ipjson.js';
import { isAlreadyUndone } from '../../src/podnet/exec.js';
import type { Observed } from '../../src/podnet/types.js';
import type { CniResult } from '../../src/cni/types.js';

const NS = '/var/run/netns/pod1';

/** Calico: a /32, the gateway 169.254.1.1 reachable through an on-link host route. */
function calicoNetns(): Observed {
  return {
    links: [
      {
        name: 'lo',
        index: 1,
        mac: '00:00:00:00:00:00',
        mtu: 65536,
        up: true,
        addrs4: [{ local: '127.0.0.1', prefixlen: 8, scope: 'host' }],
      },
      {
        name: 'eth0',
        index: 4,
        kind: 'veth',
        mac: 'ee:ee:ee:ee:ee:ee',
        mtu: 1440,
        up: true,
        addrs4: [{ local: '10.244.1.7', prefixlen: 32, scope: 'global' }],
      },
    ],
    routes4: [
      { dst: 'default', gateway: '169.254.1.1', dev: 'eth0', scope: 'global', flags: [] },
      { dst: '169.254.1.1', dev: 'eth0', scope: 'link', flags: [] },
    ],
  };
}

const empty = (v = '0.2.0'): CniResult => ({ cniVersion: v, interfaces: [], ips: [], routes: [], dns: {} });

describe('completeResult', () => {
  it('keeps a complete result as it is', () => {
    const r: CniResult = {
      cniVersion: '1.0.0',
      interfaces: [{ name: 'eth0', sandbox: NS }],
      ips: [{ address: '10.1.0.5/24', gateway: '10.1.0.1', interface: 0 }],
      routes: [{ dst: '0.0.0.0/0', gw: '10.1.0.1' }],
      dns: { nameservers: ['10.96.0.10'] },
    };
    expect(isIncomplete(r)).toBe(false);
    expect(completeResult(r, calicoNetns(), NS)).toEqual(r);
  });

  it('rebuilds an empty (0.2.0-style) result from the only veth, its only IPv4 and the kernel routes (Calico)', () => {
    expect(isIncomplete(empty())).toBe(true);
    expect(completeResult(empty(), calicoNetns(), NS)).toEqual({
      cniVersion: '0.2.0',
      interfaces: [{ name: 'eth0', mac: 'ee:ee:ee:ee:ee:ee', sandbox: NS }],
      ips: [{ address: '10.244.1.7/32', gateway: '169.254.1.1', interface: 0 }],
      routes: [{ dst: '0.0.0.0/0', gw: '169.254.1.1' }, { dst: '169.254.1.1/32' }],
      dns: {},
    });
  });

  it('gives IPs without an interface index the one sandboxed interface (Weave), keeps the plugin IP', () => {
    const r: CniResult = { ...empty('0.3.1'), ips: [{ address: '10.32.0.9/12', gateway: '10.32.0.1' }] };
    const out = completeResult(r, calicoNetns(), NS);
    expect(out.interfaces).toEqual([{ name: 'eth0', mac: 'ee:ee:ee:ee:ee:ee', sandbox: NS }]);
    expect(out.ips).toEqual([{ address: '10.32.0.9/12', gateway: '10.32.0.1', interface: 0 }]);
  });

  it('adds the on-link host route for a gateway outside the subnet (the Calico fix-up)', () => {
    const r: CniResult = {
      ...empty('0.3.1'),
      interfaces: [{ name: 'eth0', sandbox: NS }],
      ips: [{ address: '10.244.1.7/32', gateway: '169.254.1.1', interface: 0 }],
      routes: [{ dst: '0.0.0.0/0', gw: '169.254.1.1' }],
    };
    expect(fixOffSubnetGateways(r).routes).toEqual([
      { dst: '169.254.1.1/32' },
      { dst: '0.0.0.0/0', gw: '169.254.1.1' },
    ]);
    // in-subnet gateway: nothing added
    const ok: CniResult = {
      ...r,
      ips: [{ address: '10.1.0.5/24', gateway: '10.1.0.1', interface: 0 }],
      routes: [{ dst: '0.0.0.0/0', gw: '10.1.0.1' }],
    };
    expect(fixOffSubnetGateways(ok)).toBe(ok);
  });

  it('refuses to guess between several veths or several addresses', () => {
    const two = calicoNetns();
    two.links.push({ ...two.links[1]!, name: 'eth1', index: 5 });
    expect(() => completeResult(empty(), two, NS)).toThrow(/the netns has 2 veths \(eth0, eth1\)/);
    const twoIps = calicoNetns();
    twoIps.links[1]!.addrs4.push({ local: '10.244.1.8', prefixlen: 32 });
    expect(() => completeResult(empty(), twoIps, NS)).toThrow(/eth0 has 2 IPv4 addresses/);
  });
});

describe('IPv4 helpers', () => {
  it('inSubnet4 and routeDstToCidr', () => {
    expect(inSubnet4('10.1.0.1', '10.1.0.5/24')).toBe(true);
    expect(inSubnet4('169.254.1.1', '10.244.1.7/32')).toBe(false);
    expect(inSubnet4('1.2.3.4', '0.0.0.0/0')).toBe(true);
    expect(routeDstToCidr('default')).toBe('0.0.0.0/0');
    expect(routeDstToCidr('169.254.1.1')).toBe('169.254.1.1/32');
    expect(routeDstToCidr('10.0.0.0/8')).toBe('10.0.0.0/8');
  });
});

describe('parseObserved', () => {
  it('reads `ip -d -j -batch` output (addr show, route show)', () => {
    const text =
      '[{"ifindex":1,"ifname":"lo","flags":["LOOPBACK"],"mtu":65536,"address":"00:00:00:00:00:00","addr_info":[]},' +
      '{"ifindex":3,"link":"v1","ifname":"v0","flags":["BROADCAST","UP","LOWER_UP"],"mtu":1500,"master":"br0","address":"da:71:44:71:75:24","linkinfo":{"info_kind":"veth","info_slave_kind":"bridge"},' +
      '"addr_info":[{"family":"inet","local":"10.9.9.5","prefixlen":24,"scope":"global","label":"v0"},{"family":"inet6","local":"fe80::1","prefixlen":64,"scope":"link"}]},' +
      '{"ifindex":7,"ifname":"ens1f0v1","flags":["UP"],"mtu":1500,"address":"aa:00:00:00:00:01","parentbus":"pci","parentdev":"0000:3b:02.1","addr_info":[]}]\n' +
      '[{"type":"unicast","dst":"default","gateway":"10.9.9.1","dev":"v0","protocol":"boot","scope":"global","flags":[]},' +
      '{"type":"unicast","dst":"10.9.9.0/24","dev":"v0","protocol":"kernel","scope":"link","prefsrc":"10.9.9.5","flags":[]}]\n';
    const o = parseObserved(text);
    expect(o.links).toEqual([
      { name: 'lo', index: 1, mac: '00:00:00:00:00:00', mtu: 65536, up: false, addrs4: [] },
      {
        name: 'v0',
        index: 3,
        kind: 'veth',
        mac: 'da:71:44:71:75:24',
        mtu: 1500,
        up: true,
        master: 'br0',
        addrs4: [{ local: '10.9.9.5', prefixlen: 24, scope: 'global' }],
        linkLocal6: [{ local: 'fe80::1', prefixlen: 64, scope: 'link' }],
      },
      {
        name: 'ens1f0v1',
        index: 7,
        mac: 'aa:00:00:00:00:01',
        mtu: 1500,
        up: true,
        parentBus: 'pci',
        parentDev: '0000:3b:02.1',
        addrs4: [],
      },
    ]);
    expect(o.routes4).toEqual([
      { dst: 'default', gateway: '10.9.9.1', dev: 'v0', protocol: 'boot', scope: 'global', type: 'unicast', flags: [] },
      {
        dst: '10.9.9.0/24',
        dev: 'v0',
        protocol: 'kernel',
        scope: 'link',
        prefsrc: '10.9.9.5',
        type: 'unicast',
        flags: [],
      },
    ]);
  });

  it('keeps the main table of the IPv6 routes (`-d` names it) and drops the local table', () => {
    const text =
      '[]\n[]\n' +
      '[{"type":"unicast","dst":"fd00:9::/64","dev":"v0","table":"main","protocol":"kernel","scope":"global","metric":256,"flags":[],"pref":"medium"},' +
      '{"type":"unicast","dst":"default","gateway":"fd00:9::1","dev":"v0","table":"main","protocol":"boot","scope":"global","metric":1024,"flags":[],"pref":"medium"},' +
      '{"type":"local","dst":"fd00:9::5","dev":"v0","table":"local","protocol":"kernel","scope":"global","metric":0,"flags":[],"pref":"medium"}]\n';
    expect(parseObserved(text).routes6).toEqual([
      { dst: 'fd00:9::/64', dev: 'v0', protocol: 'kernel', scope: 'global', type: 'unicast', metric: 256, flags: [] },
      {
        dst: 'default',
        gateway: 'fd00:9::1',
        dev: 'v0',
        protocol: 'boot',
        scope: 'global',
        type: 'unicast',
        metric: 1024,
        flags: [],
      },
    ]);
  });

  it('splits JSON values with brackets inside strings', () => {
    expect(splitJsonValues('[{"a":"]["}][]\n{"b":1}')).toEqual([[{ a: '][' }], [], { b: 1 }]);
    expect(() => splitJsonValues('[1,')).toThrow(/unterminated/);
    expect(() => parseObserved('[]')).toThrow(/expected two or three JSON arrays/);
  });
});

describe('undo failures', () => {
  it('tells "already undone" from real failures by errno, not by message', () => {
    // by the kernel's errno: no such device, route (ESRCH), address, table
    for (const code of ['ENODEV', 'EADDRNOTAVAIL', 'ESRCH', 'ENOENT']) expect(isAlreadyUndone(code)).toBe(true);
    for (const code of ['EINVAL', 'EPERM', 'EEXIST', undefined]) expect(isAlreadyUndone(code)).toBe(false);
  });
});
