// Dual-stack and IPv6-only pods against real IPv6 clients (ISC dhclient -6, busybox udhcpc6, dhcpcd, systemd-networkd), each in its own
// netns relayed to the pod's tap (the fd tapmanager hands a VM): the guest must end with exactly the CNI result's
// address, lifetimes, DNS and search list, a default route that reaches beyond the CNI gateway, and for dual-stack
// the IPv4 lease too; renewals keep the address across a tapmanager restart.
import { chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { execa, type ResultPromise } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FdClient } from '../../src/client/fdclient.js';
import { native } from '../../src/native.js';
import { formatIpv6, linkLocalFromMac, normaliseIpv6 } from '../../src/net/ipv6.js';
import { makeCniConf, type CniTestNet } from '../helpers/cniconf.js';
import { removeDir, startDaemon, type Daemon } from '../helpers/daemon.js';
import { ensureUdhcpc6, UDHCPC6_BUILD_TIMEOUT_MS } from '../helpers/guest.js';
import { guestOnTap, type GuestNetns } from '../helpers/taprelay.js';

const rand = () => randomBytes(3).toString('hex');

async function waitFor(what: string, cond: () => boolean | Promise<boolean>, timeoutMs = 30_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** `ip -j` in netns `ns` ('': the host's) */
async function ipJson<T>(ns: string, ...args: string[]): Promise<T> {
  const where = ns === '' ? [] : ['-n', ns];
  return JSON.parse((await execa('ip', [...where, '-j', ...args], { timeout: 10_000 })).stdout || '[]') as T;
}

interface Addr {
  family: string;
  local: string;
  prefixlen: number;
  scope: string;
  valid_life_time?: number;
  preferred_life_time?: number;
  tentative?: boolean;
}
interface Link {
  ifname: string;
  addr_info: Addr[];
}

async function addrs(ns: string, dev: string): Promise<Addr[]> {
  return (await ipJson<Link[]>(ns, 'addr', 'show', 'dev', dev))[0]?.addr_info ?? [];
}

/** A hook script recording each event's environment into dir, then applying the IPv6 address as a guest would. */
function hook(dir: string, apply: string): string {
  const p = join(dir, 'hook.sh');
  // one file per event, named by the time (ordered), with the event's first argument (udhcpc6: bound, renew, ...)
  writeFileSync(
    p,
    `#!/bin/sh\nf="${dir}/ev.$(date +%s%N)"\n{ env; echo "event=$1"; } > "$f.tmp" && mv "$f.tmp" "$f"\n${apply}\nexit 0\n`,
  );
  chmodSync(p, 0o755);
  return p;
}

function events(dir: string): Record<string, string>[] {
  return readdirSync(dir)
    .filter((f) => f.startsWith('ev.') && !f.endsWith('.tmp'))
    .sort()
    .map((f) =>
      Object.fromEntries(
        readFileSync(join(dir, f), 'utf8')
          .split('\n')
          .filter((l) => l.includes('='))
          .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
      ),
    );
}

/** udhcpc6's events after its first bound (it starts with a deconfig) */
const afterBound = (dir: string): string[] => {
  const ev = events(dir).map((e) => e.event ?? '');
  return ev.slice(ev.indexOf('bound') + 1);
};
/** udhcpc6 passes $ipv6 uncompressed (fd00:0000:...): the canonical text of it */
const ipv6Of = (e: Record<string, string>): string | undefined =>
  e.ipv6 === undefined ? undefined : normaliseIpv6(e.ipv6);

const DNS6 = 'fd53::53';

/** Frames reached the pod with their checksum still to be filled in (tx checksum offload on, as in a virtio-net guest). */
function expectPartial(g: GuestNetns): void {
  expect(g.counts.partial, 'frames relayed with VIRTIO_NET_HDR_F_NEEDS_CSUM').toBeGreaterThan(0);
}
/** busybox with udhcpc6 (Debian's busybox has none): built once by test/guest/udhcpc6.sh */
let busybox6 = '';

beforeAll(async () => {
  busybox6 = await ensureUdhcpc6();
}, UDHCPC6_BUILD_TIMEOUT_MS);
const SEARCH = ['default.svc.cluster.local', 'svc.cluster.local'];

// auto gives the bridge plugin's veth tc-redirect, the pod netns routing for the VM; the bridge binding routes as well
describe.each([
  ['dual', 'auto'],
  ['only', 'auto'],
  ['dual', 'bridge'],
] as const)('IPv6 pod (%s-stack, binding %s) with real clients', (mode, binding) => {
  let net: CniTestNet;
  let d: Daemon;
  let client: FdClient;
  let work: string;
  const children: ResultPromise[] = [];
  const guests: GuestNetns[] = [];
  const fds: number[] = [];
  const keys: string[] = [];
  /** an address of the host beyond the pod prefix: reachable only through the default route */
  const far = `fd${randomBytes(1).toString('hex')}:${randomBytes(2).toString('hex')}::7`;

  beforeAll(async () => {
    net = await makeCniConf({ ipv6: mode });
    d = await startDaemon({
      confDir: net.confDir,
      binDirs: net.binDirs,
      cacheDir: net.cacheDir,
      env: { VMPOD_BINDING: binding },
    });
    client = new FdClient(d.socket, { timeoutMs: 60_000 });
    work = mkdtempSync(join(tmpdir(), 'vmpod-v6-'));
  }, 60_000);

  afterAll(async () => {
    for (const c of children) c.kill('SIGKILL');
    for (const g of guests) await g.close();
    for (const fd of fds) native().close(fd);
    for (const k of keys) {
      try {
        client.release(k);
      } catch {
        // already released
      }
    }
    const code = await d?.stop();
    expect(code).toBe(0);
    expect((await net.leftovers()).allocations).toEqual([]);
    await net?.cleanup();
    removeDir(d.dir);
    rmSync(work, { recursive: true, force: true });
  }, 60_000);

  const routerDev = binding === 'bridge' ? 'br0' : 'tap0';

  async function pod(): Promise<{
    key: string;
    ip6: string;
    ip4?: string;
    vmMac: string;
    router: string;
    guest: GuestNetns;
  }> {
    const key = `vmp6-${rand()}`;
    keys.push(key);
    const csn = client.add(key, {
      podId: key,
      podNs: 'default',
      podName: 'vm-six',
      DNS: { nameservers: [DNS6, '10.96.0.10'], search: SEARCH },
    });
    const result = csn.Result!;
    const v6 = (result.ips ?? []).find((i) => i.version === '6');
    const v4 = (result.ips ?? []).find((i) => i.version === '4');
    expect(v6, 'the wire carries the IPv6 entry with version "6"').toBeDefined();
    const vmMac = csn.Interfaces[0]!.mac!;
    const { fds: got } = client.get(key);
    fds.push(...got);
    const guest = await guestOnTap(got[0]!, vmMac);
    guests.push(guest);
    // the router the guest sees: the link-local of the pod bridge (the bridge binding) or of the tap (tc-redirect),
    // from its MAC
    const br = (await ipJson<{ address: string }[]>(key, 'link', 'show', 'dev', routerDev))[0]!;
    return {
      key,
      ip6: v6!.address.split('/')[0]!,
      ...(v4 ? { ip4: v4.address.split('/')[0]! } : {}),
      vmMac,
      router: formatIpv6(linkLocalFromMac(br.address)),
      guest,
    };
  }

  it('add strips both families from the pod interface and makes the pod netns IPv6-ready', async () => {
    const p = await pod();
    const veth = await addrs(p.key, 'virtlet-eth0');
    expect(veth.filter((a) => a.scope === 'global')).toEqual([]);
    const vmLinkLocal = formatIpv6(linkLocalFromMac(p.vmMac));
    if (binding === 'bridge') {
      // nor a link-local: the one made from the VM's MAC is the VM's own (the veth has a new MAC and makes none)
      expect(veth.filter((a) => a.family === 'inet6')).toEqual([]);
      const ll = (await addrs(p.key, 'br0')).find((a) => a.family === 'inet6');
      expect(ll).toMatchObject({ local: p.router, prefixlen: 64, scope: 'link' });
      expect(ll!.tentative).toBeUndefined();
    } else {
      // the veth shares the VM's MAC: not the VM's link-local but one of the pod netns's own, to reach the gateway
      // from (a /128 and the link-local route: no subnet-router anycast address once forwarding is on); the tap holds
      // none (the RA server answers for the router's)
      const own = veth.filter((a) => a.family === 'inet6');
      expect(own).toHaveLength(1);
      expect(own[0]).toMatchObject({ prefixlen: 128, scope: 'link' });
      const routes = (await execa('ip', ['-n', p.key, '-6', 'route', 'show', 'dev', 'virtlet-eth0'])).stdout;
      expect(routes).toMatch(/^fe80::\/64 /m);
      expect(own[0]!.local).not.toBe(vmLinkLocal);
      expect(own[0]!.tentative).toBeUndefined();
      expect((await addrs(p.key, 'tap0')).filter((a) => a.family === 'inet6')).toEqual([]);
    }
    const sysctl = async (name: string) =>
      (await execa('ip', ['netns', 'exec', p.key, 'sysctl', '-n', name])).stdout.trim();
    expect(await sysctl('net.ipv6.conf.all.accept_ra')).toBe('0');
    expect(await sysctl('net.ipv6.conf.virtlet-eth0.accept_ra')).toBe('0');
    expect(await sysctl('net.ipv6.conf.all.forwarding')).toBe('1');
    const routes = (await execa('ip', ['-n', p.key, '-6', 'route', 'show'])).stdout;
    if (binding === 'bridge') {
      expect(routes).toMatch(new RegExp(`^default via ${net.gateway6} dev br0`, 'm'));
      // the result's routes left the pod interface: none goes through it any more ("default via <gw> dev virtlet-eth0")
      expect(routes).not.toMatch(/via \S+ dev virtlet-eth0/);
    } else {
      expect(routes).toMatch(new RegExp(`^default via ${net.gateway6} dev virtlet-eth0`, 'm'));
      expect(routes).not.toMatch(/br0/);
    }
  });

  it("the network's router finds the pod netns's link-local by solicitation after forgetting it", async () => {
    const p = await pod();
    // the address the pod netns routes the VM's IPv6 from: its own on the veth (tc-redirect), the bridge's (bridge)
    const dev = binding === 'bridge' ? 'br0' : 'virtlet-eth0';
    const own = (await addrs(p.key, dev)).find((a) => a.family === 'inet6' && a.scope === 'link')!.local;
    // the host bridge (made by the first pod's ADD) pings from its link-local, once that is out of DAD
    await waitFor(
      'the host bridge link-local out of DAD',
      async () => (await addrs('', net.bridge)).some((a) => a.scope === 'link' && !a.tentative),
      20_000,
    );
    // the host's neighbour cache forgets it: its next packet there starts with a multicast solicitation, sent to the
    // solicited-node group that address shares with the VM's under tc-redirect (the same MAC)
    await execa('ip', ['-6', 'neigh', 'flush', 'dev', net.bridge]);
    const r = await execa('ping', ['-6', '-c', '1', '-W', '3', `${own}%${net.bridge}`], { reject: false });
    expect(r.exitCode, r.stdout + r.stderr).toBe(0);
  }, 30_000);

  it('ISC dhclient -6 gets the address, lifetimes, DNS and search list; the RA gives the route and MTU', async () => {
    const p = await pod();
    const dir = mkdtempSync(join(work, 'dhclient-'));
    const script = hook(
      dir,
      `case "$reason" in BOUND6|RENEW6|REBIND6|REBOOT6) ip -6 addr replace "$new_ip6_address/$new_ip6_prefixlen" dev "$interface" valid_lft "$new_max_life" preferred_lft "$new_preferred_life" nodad ;; esac`,
    );
    // the far address on the host's CNI bridge: only the default route (via the pod bridge, forwarded to the CNI gateway) reaches it
    await execa('ip', ['addr', 'add', `${far}/128`, 'dev', net.bridge, 'nodad']);
    // dhclient -6 binds to the link-local address: started while it is still in DAD it exits ("Cannot assign
    // requested address"); Debian's ifupdown waits for it the same way (/lib/ifupdown/wait-for-ll6.sh)
    await waitFor(
      'the guest link-local out of DAD',
      async () => (await addrs(p.guest.ns, 'eth0')).some((a) => a.scope === 'link' && !a.tentative),
      20_000,
    );
    const dh = execa(
      'ip',
      [
        'netns',
        'exec',
        p.guest.ns,
        'dhclient',
        '-6',
        '-1',
        '-v',
        '-d',
        '-lf',
        join(dir, 'lease6'),
        '-pf',
        join(dir, 'pid'),
        '-sf',
        script,
        'eth0',
      ],
      { reject: false, all: true, timeout: 60_000 },
    );
    children.push(dh);
    await waitFor('dhclient BOUND6', () => events(dir).some((e) => e.reason === 'BOUND6'), 40_000).catch((e: Error) => {
      throw new Error(
        `${e.message}\ndhclient: ${(dh as unknown as { all?: string }).all ?? ''}\n${d
          .logs()
          .split('\n')
          .filter((l) => l.includes('dhcp6'))
          .slice(-20)
          .join('\n')}`,
      );
    });
    const bound = events(dir).find((e) => e.reason === 'BOUND6')!;
    expect(bound.new_ip6_address).toBe(p.ip6);
    // its SOLICIT and REQUEST left their UDP checksum to be filled in, as from a virtio-net guest
    expectPartial(p.guest);
    expect(bound.new_max_life).toBe('86400');
    expect(bound.new_preferred_life).toBe('86400');
    expect(bound.new_dhcp6_name_servers).toBe(DNS6);
    expect(bound.new_dhcp6_domain_search?.trim()).toBe(SEARCH.map((s) => `${s}.`).join(' '));
    expect(bound.new_dhcp6_server_id).toBeDefined();
    // the kernel's RA handling: on-link prefix, default route via the pod bridge, MTU
    await waitFor('a default route from the RA', async () =>
      (await execa('ip', ['-n', p.guest.ns, '-6', 'route', 'show', 'default'])).stdout.includes(
        `via ${p.router} dev eth0`,
      ),
    );
    const onlink = (await execa('ip', ['-n', p.guest.ns, '-6', 'route', 'show'])).stdout;
    // the kernel files the RA's on-link prefix as proto kernel, expiring with the Prefix Information's valid lifetime
    expect(onlink).toMatch(new RegExp(`^${net.subnet6!} dev eth0 proto kernel metric \\d+ expires 259\\d{4}sec`, 'm'));
    const ping = async (dst: string) =>
      (await execa('ip', ['netns', 'exec', p.guest.ns, 'ping', '-6', '-c', '2', '-W', '3', dst], { reject: false }))
        .exitCode;
    expect(await ping(net.gateway6!)).toBe(0);
    expect(await ping(far)).toBe(0);
    // still reachable after NUD probed the router (R flag: the bridge answers as a router)
    await new Promise((r) => setTimeout(r, 7000));
    expect(await ping(far)).toBe(0);
    expect((await execa('ip', ['-n', p.guest.ns, '-6', 'route', 'show', 'default'])).stdout).toContain(
      `via ${p.router}`,
    );
    dh.kill('SIGTERM');
    await execa('ip', ['addr', 'del', `${far}/128`, 'dev', net.bridge], { reject: false });
  }, 90_000);

  it('busybox udhcpc6 gets the address and DNS; a unicast renewal from its address is answered from the address it asked', async () => {
    const p = await pod();
    const dir = mkdtempSync(join(work, 'udhcpc6-'));
    const script = hook(dir, `case "$1" in bound|renew) ip -6 addr replace "$ipv6/128" dev "$interface" nodad ;; esac`);
    const u = execa(
      'ip',
      ['netns', 'exec', p.guest.ns, busybox6, 'udhcpc6', '-i', 'eth0', '-f', '-s', script, '-t', '10', '-T', '1'],
      { reject: false, all: true, timeout: 60_000 },
    );
    children.push(u);
    await waitFor('udhcpc6 bound', () => events(dir).some((e) => e.event === 'bound'), 30_000);
    const bound = events(dir).find((e) => e.event === 'bound')!;
    expect(ipv6Of(bound)).toBe(p.ip6);
    expect(
      bound.dns
        ?.trim()
        .split(/\s+/)
        .map((a) => normaliseIpv6(a)),
    ).toEqual([DNS6]);
    expect(bound.search?.trim().split(/\s+/)).toEqual(SEARCH);
    const before = events(dir).length;
    // SIGUSR1: renew now (a unicast REQUEST from the leased address to the server's address)
    u.kill('SIGUSR1');
    await waitFor(
      'udhcpc6 renewed',
      () =>
        events(dir)
          .slice(before)
          .some((e) => e.event === 'renew'),
      20_000,
    );
    expect(
      ipv6Of(
        events(dir)
          .slice(before)
          .find((e) => e.event === 'renew')!,
      ),
    ).toBe(p.ip6);
    // never deconfigured: the renewal was answered (a REQUEST to the server's address, answered from it)
    expect(afterBound(dir)).not.toContain('deconfig');
    expect(d.lines().some((l) => l.msg === 'dhcp6: REPLY' && String(l.from).startsWith(`[${p.ip6}]`))).toBe(true);
    // SIGUSR2: release (a unicast RELEASE from the leased address to the server's link-local, over an ordinary UDP
    // socket: its checksum left to be filled in); the server answers it
    const partial = p.guest.counts.partial;
    u.kill('SIGUSR2');
    const releaseReply = () =>
      d
        .lines()
        .find((l) => l.msg === 'dhcp6: REPLY' && l.request === 'RELEASE' && String(l.from).startsWith(`[${p.ip6}]`));
    await waitFor('the RELEASE answered', () => releaseReply() !== undefined, 20_000).catch((e: Error) => {
      throw new Error(
        `${e.message}\n${d
          .logs()
          .split('\n')
          .filter((l) => l.includes('dhcp6'))
          .slice(-10)
          .join('\n')}`,
      );
    });
    const released = releaseReply()!;
    expect(String(released.from)).toMatch(new RegExp(`^\\[${p.ip6}\\]:546 `));
    expect(released.note).toBe(`addresses ${p.ip6}`);
    expect(p.guest.counts.partial).toBeGreaterThan(partial);
    u.kill('SIGTERM');
  }, 60_000);

  /** The guest's IPv6 state a client left: exactly the CNI address (a /128, as these clients apply it) and routes. */
  async function expectLeased(p: { guest: GuestNetns; ip6: string; router: string }): Promise<void> {
    const global = (await addrs(p.guest.ns, 'eth0')).filter((a) => a.family === 'inet6' && a.scope === 'global');
    expect(global.map((a) => `${a.local}/${a.prefixlen}`)).toEqual([`${p.ip6}/128`]);
    // the lease's lifetimes (86400 s, a few seconds spent)
    expect(global[0]!.valid_life_time).toBeGreaterThan(86_000);
    expect(global[0]!.valid_life_time).toBeLessThanOrEqual(86_400);
    expect(global[0]!.preferred_life_time).toBeGreaterThan(86_000);
    const routes = (await execa('ip', ['-n', p.guest.ns, '-6', 'route', 'show'])).stdout;
    expect(routes).toMatch(new RegExp(`^default via ${p.router} dev eth0 proto ra`, 'm'));
    expect(routes).toMatch(new RegExp(`^${net.subnet6!} dev eth0`, 'm'));
    const ping = async (dst: string) =>
      (await execa('ip', ['netns', 'exec', p.guest.ns, 'ping', '-6', '-c', '2', '-W', '3', dst], { reject: false }))
        .exitCode;
    expect(await ping(net.gateway6!)).toBe(0);
  }

  async function expectIpv4Lease(p: { guest: GuestNetns; ip4?: string }): Promise<void> {
    if (mode !== 'dual') return;
    await waitFor(
      'the IPv4 lease',
      async () => (await addrs(p.guest.ns, 'eth0')).some((a) => a.family === 'inet' && a.local === p.ip4),
      30_000,
    );
    const v4 = (await addrs(p.guest.ns, 'eth0')).filter((a) => a.family === 'inet');
    expect(v4.map((a) => `${a.local}/${a.prefixlen}`)).toEqual([`${p.ip4}/24`]);
    expect((await execa('ip', ['-n', p.guest.ns, '-4', 'route', 'show', 'default'])).stdout).toContain(
      `via ${net.gateway} dev eth0`,
    );
    // the DHCPv4 replies (the pod netns's own UDP) reached the guest with their checksum left to fill in, as a
    // virtio-net guest with VIRTIO_NET_F_GUEST_CSUM receives them, and the client took them
    expect(p.guest.counts.partialToGuest, 'frames to the guest with VIRTIO_NET_HDR_F_NEEDS_CSUM').toBeGreaterThan(0);
  }

  it('dhcpcd (handles RAs itself) gets the address, lifetimes, route, DNS and search list', async () => {
    const p = await pod();
    const dir = mkdtempSync(join(work, 'dhcpcd-'));
    const script = hook(dir, 'true');
    writeFileSync(join(dir, 'dhcpcd.conf'), 'option rapid_commit\n');
    // dhcpcd keeps its pid files, control sockets and leases in /run/dhcpcd and /var/lib/dhcpcd: private tmpfs
    // mounts in the mount namespace `ip netns exec` makes, so clients in other netns do not see each other
    const cmd = `mkdir -p /run/dhcpcd /var/lib/dhcpcd && mount -t tmpfs tmpfs /run/dhcpcd && mount -t tmpfs tmpfs /var/lib/dhcpcd && exec dhcpcd -B -d ${mode === 'only' ? '-6 ' : ''}-f ${dir}/dhcpcd.conf -c ${script} eth0`;
    const c = execa('ip', ['netns', 'exec', p.guest.ns, 'sh', '-c', cmd], {
      reject: false,
      all: true,
      timeout: 80_000,
    });
    children.push(c);
    await waitFor('dhcpcd BOUND6', () => events(dir).some((e) => e.reason === 'BOUND6'), 40_000).catch((e: Error) => {
      throw new Error(
        `${e.message}\n${d
          .logs()
          .split('\n')
          .filter((l) => l.includes('dhcp6') || l.includes('"ra"'))
          .slice(-20)
          .join('\n')}`,
      );
    });
    const bound = events(dir).find((e) => e.reason === 'BOUND6')!;
    expect(bound.new_dhcp6_ia_na1_ia_addr1).toBe(p.ip6);
    expect(bound.new_dhcp6_ia_na1_ia_addr1_vltime).toBe('86400');
    expect(bound.new_dhcp6_ia_na1_ia_addr1_pltime).toBe('86400');
    expect(bound.new_dhcp6_name_servers).toBe(DNS6);
    expect(bound.new_dhcp6_domain_search).toBe(SEARCH.join(' '));
    await waitFor(
      'dhcpcd default route',
      async () =>
        (await execa('ip', ['-n', p.guest.ns, '-6', 'route', 'show', 'default'])).stdout.includes(`via ${p.router}`),
      30_000,
    );
    await expectLeased(p);
    // the RA as dhcpcd read it: managed, the pod prefix on-link without SLAAC, RDNSS and DNSSL, the pod MTU
    const ra = events(dir).find((e) => e.reason === 'ROUTERADVERT')!;
    expect(ra).toMatchObject({
      nd1_flags: 'MO',
      nd1_prefix_information1_flags: 'L',
      nd1_prefix_information1_length: '64',
      nd1_rdnss1_servers: DNS6,
      nd1_dnssl1_search: SEARCH.join(' '),
      nd1_mtu: '1500',
    });
    await expectIpv4Lease(p);
    c.kill('SIGTERM');
    await c;
  }, 120_000);

  it('systemd-networkd (solicits after the RA) gets the address, lifetimes, route, DNS and search list', async () => {
    const p = await pod();
    const dir = mkdtempSync(join(work, 'networkd-'));
    writeFileSync(
      join(dir, '10-vmpod-test.network'),
      `[Match]\nName=eth0\n[Network]\nDHCP=${mode === 'dual' ? 'yes' : 'ipv6'}\nIPv6AcceptRA=yes\n` +
        // search domains are used only when asked for (networkd's default UseDomains=no)
        '[DHCPv4]\nUseDomains=yes\n[DHCPv6]\nUseDomains=yes\n[IPv6AcceptRA]\nUseDomains=yes\n',
    );
    // networkd outside systemd, in the mount namespace `ip netns exec` makes: a private /run/systemd (its state
    // and our .network file), and /sys read-only, which tells networkd there is no udev to wait for
    const cmd = `mount -t tmpfs tmpfs /run/systemd && mkdir -p /run/systemd/network && cp ${dir}/10-vmpod-test.network /run/systemd/network/ && mount -o remount,ro /sys && exec /lib/systemd/systemd-networkd`;
    const c = execa('ip', ['netns', 'exec', p.guest.ns, 'sh', '-c', cmd], {
      reject: false,
      all: true,
      timeout: 80_000,
      env: { SYSTEMD_LOG_LEVEL: 'debug' },
    });
    children.push(c);
    const ifindex = (await ipJson<{ ifindex: number }[]>(p.guest.ns, 'link', 'show', 'dev', 'eth0'))[0]!.ifindex;
    // the link's state file, as networkd wrote it in its mount namespace (the same pid: sh and ip exec'd it)
    const state = () => {
      try {
        return readFileSync(`/proc/${c.pid}/root/run/systemd/netif/links/${ifindex}`, 'utf8');
      } catch {
        return '';
      }
    };
    await waitFor(
      'networkd configured',
      async () =>
        state().includes('ADMIN_STATE=configured') &&
        (await addrs(p.guest.ns, 'eth0')).some((a) => a.local === p.ip6 && !a.tentative),
      50_000,
    ).catch((e: Error) => {
      throw new Error(`${e.message}\nstate:\n${state()}\nnetworkd:\n${(c as unknown as { all?: string }).all ?? ''}`);
    });
    await waitFor(
      'networkd default route',
      async () =>
        (await execa('ip', ['-n', p.guest.ns, '-6', 'route', 'show', 'default'])).stdout.includes(`via ${p.router}`),
      30_000,
    );
    await expectLeased(p);
    expectPartial(p.guest);
    // DNS from DHCPv6 and the RA's RDNSS/DNSSL, merged by networkd (IPv4's DNS too, on dual-stack)
    const st = Object.fromEntries(
      state()
        .split('\n')
        .filter((l) => l.includes('='))
        .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
    );
    expect(st.DNS?.split(' ')).toContain(DNS6);
    expect(st.DOMAINS?.split(' ')).toEqual(expect.arrayContaining(SEARCH));
    await expectIpv4Lease(p);
    c.kill('SIGTERM');
    await c;
  }, 120_000);

  if (mode === 'dual') {
    it('dual-stack: busybox udhcpc gets the IPv4 lease beside IPv6', async () => {
      const p = await pod();
      const dir = mkdtempSync(join(work, 'udhcpc4-'));
      const script = hook(dir, 'true');
      const r = await execa(
        'ip',
        [
          'netns',
          'exec',
          p.guest.ns,
          'busybox',
          'udhcpc',
          '-i',
          'eth0',
          '-f',
          '-n',
          '-q',
          '-T',
          '1',
          '-t',
          '10',
          '-s',
          script,
        ],
        { reject: false, all: true, timeout: 40_000 },
      );
      expect(r.exitCode, r.all).toBe(0);
      expect(events(dir).find((e) => e.ip !== undefined)?.ip).toBe(p.ip4);
      expect(p.guest.counts.partialToGuest, 'frames to the guest with VIRTIO_NET_HDR_F_NEEDS_CSUM').toBeGreaterThan(0);
    }, 60_000);
  }

  it('renewal after a tapmanager restart keeps the address (server DUID stable)', async () => {
    const p = await pod();
    const dir = mkdtempSync(join(work, 'restart-'));
    const script = hook(dir, `case "$1" in bound|renew) ip -6 addr replace "$ipv6/128" dev "$interface" nodad ;; esac`);
    const u = execa(
      'ip',
      ['netns', 'exec', p.guest.ns, busybox6, 'udhcpc6', '-i', 'eth0', '-f', '-s', script, '-t', '10', '-T', '1'],
      { reject: false, all: true, timeout: 80_000 },
    );
    children.push(u);
    await waitFor('udhcpc6 bound', () => events(dir).some((e) => e.event === 'bound'), 30_000);
    expect(await d.stop()).toBe(0);
    d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir, reuse: d });
    client = new FdClient(d.socket, { timeoutMs: 60_000 });
    const before = events(dir).length;
    u.kill('SIGUSR1');
    await waitFor(
      'udhcpc6 renewed after restart',
      () =>
        events(dir)
          .slice(before)
          .some((e) => e.event === 'renew'),
      20_000,
    );
    expect(
      ipv6Of(
        events(dir)
          .slice(before)
          .find((e) => e.event === 'renew')!,
      ),
    ).toBe(p.ip6);
    expect(afterBound(dir)).not.toContain('deconfig');
    expect(d.lines().some((l) => l.msg === 'dhcp6: REPLY')).toBe(true);
    u.kill('SIGTERM');
  }, 90_000);
});

describe("IPv6 pod with the tc-redirect binding (no bridge: nothing in the pod netns holds the servers' link-local)", () => {
  let net: CniTestNet;
  let d: Daemon;
  let client: FdClient;
  let work: string;
  let guest: GuestNetns | undefined;
  let u: ResultPromise | undefined;
  const fds: number[] = [];
  const key = `vmp6t-${rand()}`;

  beforeAll(async () => {
    net = await makeCniConf({ ipv6: 'dual' });
    d = await startDaemon({
      confDir: net.confDir,
      binDirs: net.binDirs,
      cacheDir: net.cacheDir,
      env: { VMPOD_BINDING: 'tc-redirect' },
    });
    client = new FdClient(d.socket, { timeoutMs: 60_000 });
    work = mkdtempSync(join(tmpdir(), 'vmpod-v6t-'));
  }, 60_000);

  afterAll(async () => {
    u?.kill('SIGKILL');
    await guest?.close();
    for (const fd of fds) native().close(fd);
    try {
      client.release(key);
    } catch {
      // not added
    }
    expect(await d?.stop()).toBe(0);
    expect((await net.leftovers()).allocations).toEqual([]);
    await net?.cleanup();
    removeDir(d.dir);
    rmSync(work, { recursive: true, force: true });
  }, 60_000);

  it("udhcpc6 renews and releases by unicast to the server's link-local: its neighbour solicitation is answered, then the REQUEST and the RELEASE", async () => {
    const csn = client.add(key, { podId: key, podNs: 'default', podName: 'vm-six-tc' });
    const ip6 = (csn.Result!.ips ?? []).find((i) => i.version === '6')!.address.split('/')[0]!;
    const { fds: got } = client.get(key);
    fds.push(...got);
    guest = await guestOnTap(got[0]!, csn.Interfaces[0]!.mac!);
    const dir = mkdtempSync(join(work, 'udhcpc6-'));
    const script = hook(dir, `case "$1" in bound|renew) ip -6 addr replace "$ipv6/128" dev "$interface" nodad ;; esac`);
    u = execa(
      'ip',
      ['netns', 'exec', guest.ns, busybox6, 'udhcpc6', '-i', 'eth0', '-f', '-s', script, '-t', '10', '-T', '1'],
      { reject: false, all: true, timeout: 60_000 },
    );
    await waitFor('udhcpc6 bound', () => events(dir).some((e) => e.event === 'bound'), 30_000);
    expect(ipv6Of(events(dir).find((e) => e.event === 'bound')!)).toBe(ip6);
    const fromLease = (request: string) =>
      d.lines().some((l) => l.msg === 'dhcp6: REPLY' && l.request === request && String(l.from).startsWith(`[${ip6}]`));
    // the RA's source link-layer address option put the server's MAC in the guest's neighbour table; a guest whose
    // entry expired (NUD probes unanswered, then failed) must solicit it again: start from there
    const forget = () => execa('ip', ['-n', guest!.ns, '-6', 'neigh', 'flush', 'dev', 'eth0']);
    await forget();
    const before = events(dir).length;
    u.kill('SIGUSR1');
    await waitFor(
      'udhcpc6 renewed',
      () =>
        events(dir)
          .slice(before)
          .some((e) => e.event === 'renew'),
      20_000,
    );
    expect(afterBound(dir)).not.toContain('deconfig');
    // the renewal went by unicast, from the leased address: the guest had resolved the server's link-local
    expect(fromLease('REQUEST')).toBe(true);
    await forget();
    u.kill('SIGUSR2');
    await waitFor('the RELEASE answered', () => fromLease('RELEASE'), 20_000).catch((e: Error) => {
      throw new Error(
        `${e.message}\n${d
          .logs()
          .split('\n')
          .filter((l) => l.includes('dhcp6') || l.includes('"ra"'))
          .slice(-10)
          .join('\n')}`,
      );
    });
    // the guest's neighbour entry for the server: the RA server's answer (the router MAC, a router)
    const neigh = (await execa('ip', ['-n', guest.ns, '-6', 'neigh', 'show', 'dev', 'eth0'])).stdout;
    const server = d.lines().find((l) => l.msg === 'dhcp6 server listening')!;
    expect(neigh).toMatch(new RegExp(`^${String(server.serverIp)} lladdr \\S+ router`, 'm'));
    u.kill('SIGTERM');
  }, 90_000);
});
