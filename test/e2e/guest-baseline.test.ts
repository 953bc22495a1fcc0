// The test guest boots and takes a DHCP lease WITHOUT any vmpod code: a hand-made netns + bridge + tap, dnsmasq,
// and qemu started inside the netns. Proves test/guest/build.sh and the helpers before vmpod is in the path.
import { afterEach, beforeAll, describe, expect, it } from 'vitest';
import {
  ensureGuest,
  GUEST_BUILD_TIMEOUT_MS,
  parseLease6Line,
  parseLeaseLine,
  type GuestImages,
} from '../helpers/guest.js';
import { MAX_LINK_NAME_BYTES, uniqueName } from '../helpers/netns.js';
import {
  baselineLeftovers,
  bootBaselineVm,
  fetchFromNetns,
  pingFromNetns,
  setupBaselineNet,
  type BaselineNet,
} from '../helpers/baseline.js';

describe('baseline guest (no vmpod code)', () => {
  let guest: GuestImages;
  let net: BaselineNet | undefined;

  beforeAll(async () => {
    guest = await ensureGuest();
  }, GUEST_BUILD_TIMEOUT_MS);

  afterEach(async () => {
    await net?.teardown.run();
  });

  it('boots, takes the static lease from dnsmasq, answers ping and HTTP, and leaves nothing behind', async () => {
    net = await setupBaselineNet({ prefix: 'vme', mtu: 1400 });
    const vm = await bootBaselineVm(net, guest, { timeoutMs: 120_000 });

    expect(vm.lease.event).toBe('VMPOD-LEASE');
    expect(vm.lease.ip).toBe(net.guestIp);
    expect(vm.lease.prefixLen).toBe(24);
    expect(vm.lease.mac).toBe(net.mac);
    expect(vm.lease.mtu).toBe(1400);
    expect(vm.lease.routers).toEqual([net.serverIp]);
    expect(vm.lease.dns).toEqual([net.serverIp]);
    expect(vm.lease.serverId).toBe(net.serverIp);
    expect(vm.lease.hostname).toBe(net.hostname);
    expect(vm.lease.iface).toBe('eth0');

    await pingFromNetns(net.ns, vm.lease.ip);
    const page = await fetchFromNetns(net.ns, `http://${vm.lease.ip}/`);
    expect(page).toContain(`hostname=${net.hostname}`);
    // The guest's own view: ONE udhcpc (a second one would deconfigure the address), the lease applied.
    const status = await fetchFromNetns(net.ns, `http://${vm.lease.ip}/cgi-bin/status`);
    expect(status).toContain('udhcpc=1\n');
    expect(status).toContain(`addr=${net.guestIp}/24\n`);
    expect(status).toContain('mtu=1400\n');
    expect(status).toContain(`default=${net.serverIp}`);

    const pids = [vm.qemuPid, net.dnsmasqPid];
    const done = net;
    net = undefined;
    await done.teardown.run();
    expect(await baselineLeftovers(done, pids)).toEqual({ netns: [], links: [], pids: [] });
  }, 300_000);
});

describe('parseLeaseLine', () => {
  it('parses every field of the guest hook line', () => {
    const l = parseLeaseLine(
      'VMPOD-LEASE ip=10.251.7.5/24 router=10.251.7.1 mtu=1400 hostname=g1 dns=10.0.0.2,10.0.0.3 ' +
        'mac=52:54:00:AB:cd:01 serverid=10.251.7.1 lease=3600 iface=eth0',
    );
    expect(l).toEqual({
      event: 'VMPOD-LEASE',
      ip: '10.251.7.5',
      prefixLen: 24,
      routers: ['10.251.7.1'],
      mtu: 1400,
      hostname: 'g1',
      dns: ['10.0.0.2', '10.0.0.3'],
      mac: '52:54:00:ab:cd:01',
      serverId: '10.251.7.1',
      leaseSeconds: 3600,
      iface: 'eth0',
    });
  });

  it('treats empty values as absent and accepts console noise before the tag', () => {
    const l = parseLeaseLine(
      '\r[  2.1] VMPOD-RENEW ip=10.1.2.3/8 router= mtu= hostname= dns= mac=52:54:00:00:00:01 serverid=',
    );
    expect(l).toEqual({
      event: 'VMPOD-RENEW',
      ip: '10.1.2.3',
      prefixLen: 8,
      routers: [],
      dns: [],
      mac: '52:54:00:00:00:01',
    });
  });

  it('rejects lines without an address or MAC, and bad numbers', () => {
    expect(() => parseLeaseLine('VMPOD-LEASE router=1.2.3.4 mac=52:54:00:00:00:01')).toThrow(/no ip=/);
    expect(() => parseLeaseLine('VMPOD-LEASE ip=1.2.3.4/24')).toThrow(/no mac=/);
    expect(() => parseLeaseLine('VMPOD-LEASE ip=1.2.3.4/33 mac=52:54:00:00:00:01')).toThrow(/> 32/);
    expect(() => parseLeaseLine('VMPOD-LEASE ip=1.2.3.4/24 mac=52:54:00:00:00:01 mtu=big')).toThrow(/not a number/);
    expect(() => parseLeaseLine('udhcpc: lease obtained')).toThrow(/not a VMPOD-LEASE/);
  });
});

describe('parseLease6Line', () => {
  it('parses the udhcpc6 hook line, addresses in canonical text', () => {
    expect(
      parseLease6Line(
        '[  3.2] VMPOD-LEASE6 ip=fd12:3456:789a:0:0:0:0:5/128 dns=FD53::53,fd53:0:0:0:0:0:0:54 search=a.example,b.example iface=eth0',
      ),
    ).toEqual({
      event: 'VMPOD-LEASE6',
      ip: 'fd12:3456:789a::5',
      prefixLen: 128,
      dns: ['fd53::53', 'fd53::54'],
      search: ['a.example', 'b.example'],
      iface: 'eth0',
    });
    expect(parseLease6Line('VMPOD-RENEW6 ip=fd12::5/128 dns= search=')).toEqual({
      event: 'VMPOD-RENEW6',
      ip: 'fd12::5',
      prefixLen: 128,
      dns: [],
      search: [],
    });
  });

  it('rejects lines without a valid IPv6 address and length, and bad DNS servers', () => {
    expect(() => parseLease6Line('VMPOD-LEASE6 dns=fd53::53')).toThrow(/no ip=/);
    expect(() => parseLease6Line('VMPOD-LEASE6 ip=10.1.2.3/24')).toThrow(/is not <IPv6 address>\/<len>/);
    expect(() => parseLease6Line('VMPOD-LEASE6 ip=fd12::5')).toThrow(/is not <IPv6 address>\/<len>/);
    expect(() => parseLease6Line('VMPOD-LEASE6 ip=fd12::5/129')).toThrow(/> 128/);
    expect(() => parseLease6Line('VMPOD-LEASE6 ip=fd12::5/128 dns=nameserver')).toThrow(
      /dns nameserver is not an IPv6 address/,
    );
    expect(() => parseLease6Line('VMPOD-LEASE ip=10.1.2.3/24 mac=52:54:00:00:00:01')).toThrow(/not a VMPOD-LEASE6/);
  });
});

describe('uniqueName', () => {
  it('fills the name up to 15 bytes with random hex', () => {
    const a = uniqueName('vme');
    expect(a).toMatch(/^vme[0-9a-f]{8}$/);
    expect(uniqueName('vmpodsmk')).toMatch(/^vmpodsmk[0-9a-f]{7}$/);
    expect(Buffer.byteLength(uniqueName('abcdefghijk'))).toBe(MAX_LINK_NAME_BYTES);
    expect(uniqueName('vme')).not.toBe(a);
  });

  it('refuses prefixes that leave fewer than 4 random chars, and odd characters', () => {
    expect(() => uniqueName('abcdefghijkl')).toThrow(/leaves 3 bytes/);
    expect(() => uniqueName('a/b')).toThrow(/only/);
    expect(() => uniqueName('vme', 13)).toThrow(/asked 13/);
  });
});
