// Dual-stack and IPv6-only pods against real IPv6 clients (ISC dhclient -6, busybox udhcpc6), each in its own
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
import { formatIpv6, linkLocalFromMac } from '../../src/net/ipv6.js';
import { makeCniConf, type CniTestNet } from '../helpers/cniconf.js';
import { removeDir, startDaemon, type Daemon } from '../helpers/daemon.js';
import { guestOnTap, type GuestNetns } from '../helpers/taprelay.js';

const rand = () => randomBytes(3).toString('hex');

async function waitFor(what: string, cond: () => boolean | Promise<boolean>, timeoutMs = 30_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

async function ipJson<T>(ns: string, ...args: string[]): Promise<T> {
  return JSON.parse((await execa('ip', ['-n', ns, '-j', ...args], { timeout: 10_000 })).stdout || '[]') as T;
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
  writeFileSync(p, `#!/bin/sh\nenv > "${dir}/ev.$(cat /proc/sys/kernel/random/uuid)"\n${apply}\nexit 0\n`);
  chmodSync(p, 0o755);
  return p;
}

function events(dir: string): Record<string, string>[] {
  return readdirSync(dir)
    .filter((f) => f.startsWith('ev.'))
    .map((f) => Object.fromEntries(readFileSync(join(dir, f), 'utf8').split('\n').filter((l) => l.includes('=')).map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)])));
}

const DNS6 = 'fd53::53';
const SEARCH = ['default.svc.cluster.local', 'svc.cluster.local'];

describe.each([['dual'], ['only']] as const)('IPv6 pod (%s-stack) with real clients', (mode) => {
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
    d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir });
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

  async function pod(): Promise<{ key: string; ip6: string; ip4?: string; vmMac: string; router: string; guest: GuestNetns }> {
    const key = `vmp6-${rand()}`;
    keys.push(key);
    const csn = client.add(key, { podId: key, podNs: 'default', podName: 'vm-six', DNS: { nameservers: [DNS6, '10.96.0.10'], search: SEARCH } });
    const result = csn.Result!;
    const v6 = (result.ips ?? []).find((i) => i.version === '6');
    const v4 = (result.ips ?? []).find((i) => i.version === '4');
    expect(v6, 'the wire carries the IPv6 entry with version "6"').toBeDefined();
    const vmMac = csn.Interfaces[0]!.mac!;
    const { fds: got } = client.get(key);
    fds.push(...got);
    const guest = await guestOnTap(got[0]!, vmMac);
    guests.push(guest);
    // the router the guest sees: the pod bridge's link-local, from its MAC (the veth's new MAC)
    const br = (await ipJson<{ address: string }[]>(key, 'link', 'show', 'dev', 'br0'))[0]!;
    return { key, ip6: v6!.address.split('/')[0]!, ...(v4 ? { ip4: v4.address.split('/')[0]! } : {}), vmMac, router: formatIpv6(linkLocalFromMac(br.address)), guest };
  }

  it('add strips both families from the pod interface and makes the pod netns IPv6-ready', async () => {
    const p = await pod();
    const veth = await addrs(p.key, 'virtlet-eth0');
    expect(veth.filter((a) => a.scope === 'global')).toEqual([]);
    const br = await addrs(p.key, 'br0');
    const ll = br.find((a) => a.family === 'inet6');
    expect(ll).toMatchObject({ local: p.router, prefixlen: 64, scope: 'link' });
    expect(ll!.tentative).toBeUndefined();
    const sysctl = async (name: string) => (await execa('ip', ['netns', 'exec', p.key, 'sysctl', '-n', name])).stdout.trim();
    expect(await sysctl('net.ipv6.conf.all.accept_ra')).toBe('0');
    expect(await sysctl('net.ipv6.conf.virtlet-eth0.accept_ra')).toBe('0');
    expect(await sysctl('net.ipv6.conf.all.forwarding')).toBe('1');
    const routes = (await execa('ip', ['-n', p.key, '-6', 'route', 'show'])).stdout;
    expect(routes).toMatch(new RegExp(`^default via ${net.gateway6} dev br0`, 'm'));
    expect(routes).not.toMatch(/dev virtlet-eth0.*via/);
  });

  it('ISC dhclient -6 gets the address, lifetimes, DNS and search list; the RA gives the route and MTU', async () => {
    const p = await pod();
    const dir = mkdtempSync(join(work, 'dhclient-'));
    const script = hook(
      dir,
      `case "$reason" in BOUND6|RENEW6|REBIND6|REBOOT6) ip -6 addr replace "$new_ip6_address/$new_ip6_prefixlen" dev "$interface" valid_lft "$new_max_life" preferred_lft "$new_preferred_life" nodad ;; esac`,
    );
    // the far address on the host's CNI bridge: only the default route (via the pod bridge, forwarded to the CNI gateway) reaches it
    await execa('ip', ['addr', 'add', `${far}/128`, 'dev', net.bridge, 'nodad']);
    const dh = execa('ip', ['netns', 'exec', p.guest.ns, 'dhclient', '-6', '-1', '-v', '-d', '-lf', join(dir, 'lease6'), '-pf', join(dir, 'pid'), '-sf', script, 'eth0'], { reject: false, all: true, timeout: 60_000 });
    children.push(dh);
    await waitFor('dhclient BOUND6', () => events(dir).some((e) => e.reason === 'BOUND6'), 40_000);
    const bound = events(dir).find((e) => e.reason === 'BOUND6')!;
    expect(bound.new_ip6_address).toBe(p.ip6);
    expect(bound.new_max_life).toBe('86400');
    expect(bound.new_preferred_life).toBe('86400');
    expect(bound.new_dhcp6_name_servers).toBe(DNS6);
    expect(bound.new_dhcp6_domain_search?.trim()).toBe(SEARCH.map((s) => `${s}.`).join(' '));
    expect(bound.new_dhcp6_server_id).toBeDefined();
    // the kernel's RA handling: on-link prefix, default route via the pod bridge, MTU
    await waitFor('a default route from the RA', async () => (await execa('ip', ['-n', p.guest.ns, '-6', 'route', 'show', 'default'])).stdout.includes(`via ${p.router} dev eth0`));
    const onlink = (await execa('ip', ['-n', p.guest.ns, '-6', 'route', 'show'])).stdout;
    expect(onlink).toMatch(new RegExp(`^${net.subnet6!.replace('::/64', '::/64')} dev eth0 proto ra`, 'm'));
    const ping = async (dst: string) => (await execa('ip', ['netns', 'exec', p.guest.ns, 'ping', '-6', '-c', '2', '-W', '3', dst], { reject: false })).exitCode;
    expect(await ping(net.gateway6!)).toBe(0);
    expect(await ping(far)).toBe(0);
    // still reachable after NUD probed the router (R flag: the bridge answers as a router)
    await new Promise((r) => setTimeout(r, 7000));
    expect(await ping(far)).toBe(0);
    expect((await execa('ip', ['-n', p.guest.ns, '-6', 'route', 'show', 'default'])).stdout).toContain(`via ${p.router}`);
    dh.kill('SIGTERM');
    await execa('ip', ['addr', 'del', `${far}/128`, 'dev', net.bridge], { reject: false });
  }, 90_000);

  it('busybox udhcpc6 gets the address and DNS; a unicast renewal from its address is answered from the address it asked', async () => {
    const p = await pod();
    const dir = mkdtempSync(join(work, 'udhcpc6-'));
    const script = hook(dir, `case "$1" in bound|renew) ip -6 addr replace "$ipv6/128" dev "$interface" nodad ;; esac`);
    const u = execa('ip', ['netns', 'exec', p.guest.ns, 'busybox', 'udhcpc6', '-i', 'eth0', '-f', '-s', script, '-t', '10', '-T', '1'], { reject: false, all: true, timeout: 60_000 });
    children.push(u);
    await waitFor('udhcpc6 bound', () => events(dir).some((e) => e.ipv6 !== undefined), 30_000);
    const bound = events(dir).find((e) => e.ipv6 !== undefined)!;
    expect(bound.ipv6).toBe(p.ip6);
    expect(bound.dns).toBe(DNS6);
    expect(bound.search?.trim().split(/\s+/)).toEqual(SEARCH);
    const before = events(dir).length;
    // SIGUSR1: renew now (a unicast REQUEST from the leased address to the server's address)
    u.kill('SIGUSR1');
    await waitFor('udhcpc6 renewed', () => events(dir).length > before && events(dir).slice(-1)[0]!.ipv6 === p.ip6, 20_000);
    expect(events(dir).filter((e) => e.ipv6 !== undefined).every((e) => e.ipv6 === p.ip6)).toBe(true);
    u.kill('SIGTERM');
  }, 60_000);

  if (mode === 'dual') {
    it('dual-stack: busybox udhcpc gets the IPv4 lease beside IPv6', async () => {
      const p = await pod();
      const dir = mkdtempSync(join(work, 'udhcpc4-'));
      const script = hook(dir, 'true');
      const r = await execa('ip', ['netns', 'exec', p.guest.ns, 'busybox', 'udhcpc', '-i', 'eth0', '-f', '-n', '-q', '-T', '1', '-t', '10', '-s', script], { reject: false, all: true, timeout: 40_000 });
      expect(r.exitCode, r.all).toBe(0);
      expect(events(dir).find((e) => e.ip !== undefined)?.ip).toBe(p.ip4);
    }, 60_000);
  }

  it('renewal after a tapmanager restart keeps the address (server DUID stable)', async () => {
    const p = await pod();
    const dir = mkdtempSync(join(work, 'restart-'));
    const script = hook(dir, `case "$1" in bound|renew) ip -6 addr replace "$ipv6/128" dev "$interface" nodad ;; esac`);
    const u = execa('ip', ['netns', 'exec', p.guest.ns, 'busybox', 'udhcpc6', '-i', 'eth0', '-f', '-s', script, '-t', '10', '-T', '1'], { reject: false, all: true, timeout: 80_000 });
    children.push(u);
    await waitFor('udhcpc6 bound', () => events(dir).some((e) => e.ipv6 !== undefined), 30_000);
    expect(await d.stop()).toBe(0);
    d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir, reuse: d });
    client = new FdClient(d.socket, { timeoutMs: 60_000 });
    const before = events(dir).length;
    u.kill('SIGUSR1');
    await waitFor('udhcpc6 renewed after restart', () => events(dir).length > before, 20_000);
    const last = events(dir).slice(-1)[0]!;
    expect(last.ipv6).toBe(p.ip6);
    expect(d.lines().some((l) => l.msg === 'dhcp6: REPLY')).toBe(true);
    u.kill('SIGTERM');
  }, 90_000);
});

