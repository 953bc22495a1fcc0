// dhcp IPAM on a macvlan pod, for as long as the pod lives: dnsmasq on our own LAN is the network's server (2-minute
// leases, the shortest it gives), the CNI dhcp daemon (its own socket) takes the pod's lease and renews it from inside
// the pod netns at T1. With the tc-redirect binding the renewal's ACK must reach the daemon, not the VM stand-in on the
// tap, which keeps its own lease from tapmanager (the same address) and reaches the LAN all along; a tapmanager restart
// keeps serving it; release frees the lease.
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { execa, type ResultPromise } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FdClient } from '../../src/client/fdclient.js';
import { native } from '../../src/native.js';
import { removeDir, startDaemon, type Daemon } from '../helpers/daemon.js';
import { guestOnTap, type GuestNetns } from '../helpers/taprelay.js';
import { listNetns, run } from '../helpers/netns.js';
import { makeLan, ping, udhcpcLease, writeConfList, type Lan } from '../helpers/shapes.js';

const rand = () => randomBytes(3).toString('hex');

async function waitFor(what: string, cond: () => boolean | Promise<boolean>, timeoutMs: number): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 500));
  }
}

/** A DHCP counter on the guest's eth0: answers (udp sport 67) from anyone but tapmanager's server (169.254.254.2). */
async function countForeignDhcp(ns: string): Promise<void> {
  await run(['ip', 'netns', 'exec', ns, 'nft', '-f', '-'], {
    input:
      'table netdev vmdhcp {\n chain in {\n  type filter hook ingress device "eth0" priority 0;\n  ip saddr != 169.254.254.2 udp sport 67 counter\n }\n}\n',
  });
}

async function foreignDhcp(ns: string): Promise<number> {
  const j = JSON.parse(await run(['ip', 'netns', 'exec', ns, 'nft', '-j', 'list', 'table', 'netdev', 'vmdhcp'])) as {
    nftables: { rule?: { expr: { counter?: { packets: number } }[] } }[];
  };
  return j.nftables
    .flatMap((e) => e.rule?.expr.flatMap((x) => (x.counter ? [x.counter.packets] : [])) ?? [])
    .reduce((a, b) => a + b, 0);
}

describe('dhcp IPAM on a macvlan pod (tc-redirect), through a renewal', () => {
  let root = '';
  let lan: Lan;
  let d: Daemon;
  let dnsmasq: ResultPromise | undefined;
  let cniDhcp: ResultPromise | undefined;
  let guest: GuestNetns | undefined;
  let fd = -1;
  let key = '';
  /** what the CNI dhcp daemon logs: "<client id>: lease renewed, expiration is ..." when a renewal's ACK reached it */
  let daemonOut = '';

  beforeAll(async () => {
    root = mkdtempSync(join(tmpdir(), 'vmpod-dhcpipam-'));
    lan = await makeLan('d');
    dnsmasq = execa(
      'ip',
      [
        'netns',
        'exec',
        lan.ns,
        'dnsmasq',
        '--keep-in-foreground',
        '--conf-file=/dev/null',
        '--port=0',
        '--user=root',
        '--group=root',
        '--interface=lan0',
        '--bind-interfaces',
        `--dhcp-range=${lan.prefix}.50,${lan.prefix}.150,255.255.255.0,2m`,
        `--dhcp-option=3,${lan.gateway}`,
        `--dhcp-leasefile=${join(root, 'leases')}`,
        '--log-dhcp',
        `--log-facility=${join(root, 'dnsmasq.log')}`,
        `--pid-file=${join(root, 'dnsmasq.pid')}`,
      ],
      { reject: false },
    );
    cniDhcp = execa('/usr/lib/cni/dhcp', ['daemon', '-socketpath', join(root, 'dhcp.sock')], {
      reject: false,
      all: true,
    });
    cniDhcp.all?.on('data', (b: Buffer) => (daemonOut += b.toString()));
    await waitFor('the CNI dhcp daemon socket', () => existsSync(join(root, 'dhcp.sock')), 20_000);
    await waitFor('dnsmasq to start', () => existsSync(join(root, 'dnsmasq.log')), 20_000);
    writeConfList(join(root, 'net.d'), `vmdhcp-${rand()}`, [
      {
        type: 'macvlan',
        master: lan.parent,
        mode: 'bridge',
        ipam: { type: 'dhcp', daemonSocketPath: join(root, 'dhcp.sock') },
      },
    ]);
    d = await startDaemon({ confDir: join(root, 'net.d'), binDirs: ['/usr/lib/cni'], cacheDir: join(root, 'cache') });
  }, 60_000);

  afterAll(async () => {
    await guest?.close();
    if (fd >= 0) native().close(fd);
    if (key !== '' && (await listNetns()).includes(key)) new FdClient(d.socket, { timeoutMs: 60_000 }).release(key);
    const code = await d?.stop();
    cniDhcp?.kill('SIGTERM');
    dnsmasq?.kill('SIGTERM');
    await Promise.all([cniDhcp, dnsmasq]);
    await lan?.cleanup();
    removeDir(d.dir);
    rmSync(root, { recursive: true, force: true });
    expect(code).toBe(0);
  }, 60_000);

  const dnsmasqLog = () => readFileSync(join(root, 'dnsmasq.log'), 'utf8');
  const acks = (ip: string) =>
    dnsmasqLog()
      .split('\n')
      .filter((l) => new RegExp(`DHCPACK\\(lan0\\) ${ip.replace(/\./g, '\\.')} `).test(l)).length;

  it('the VM keeps the address the daemon leased, across its renewal, and reaches the LAN; release frees the lease', async () => {
    let client = new FdClient(d.socket, { timeoutMs: 60_000 });
    key = `vmdh-${rand()}`;
    const csn = client.add(key, { podId: key, podNs: 'default', podName: 'vm-dhcp', DNS: null });
    const ip = csn.Result!.ips!.find((i) => i.version === '4')!.address.split('/')[0]!;
    expect(acks(ip), 'dnsmasq leased the pod its address').toBe(1);
    expect(readFileSync(join(root, 'leases'), 'utf8')).toContain(` ${ip} `);
    fd = client.get(key).fds[0]!;
    guest = await guestOnTap(fd, csn.Interfaces[0]!.mac!, csn.Interfaces[0]!.MTU);
    await countForeignDhcp(guest.ns);
    const lease = await udhcpcLease(guest.ns, join(root, 'guest'));
    expect(lease.ip).toBe(ip);
    expect(lease.router).toBe(lan.gateway);
    expect(await ping(guest.ns, lan.gateway)).toBe(0);
    expect(await ping(lan.ns, ip)).toBe(0);

    // T1 of a 2-minute lease: the daemon renews from the pod netns, through the macvlan the VM shares
    await waitFor('the renewal ACK', () => acks(ip) >= 2, 110_000);
    // the daemon got the ACK (it says so), and the VM did not see it
    await waitFor('the daemon to take the renewal', () => /lease renewed/.test(daemonOut), 20_000);
    expect(await foreignDhcp(guest.ns)).toBe(0);
    const addrs = await run(['ip', '-n', guest.ns, '-4', '-o', 'addr', 'show', 'dev', 'eth0']);
    expect(addrs).toContain(`${ip}/`);
    expect(await ping(guest.ns, lan.gateway)).toBe(0);
    expect(await ping(lan.ns, ip)).toBe(0);

    // a tapmanager restart: the record says tc-redirect, and DHCP is served on the tap again
    const code = await d.stop();
    expect(code).toBe(0);
    d = await startDaemon({ confDir: join(root, 'net.d'), binDirs: ['/usr/lib/cni'], reuse: d });
    client = new FdClient(d.socket, { timeoutMs: 60_000 });
    const again = await udhcpcLease(guest.ns, join(root, 'guest2'));
    expect(again.ip).toBe(ip);
    expect(await ping(lan.ns, ip)).toBe(0);

    await guest.close();
    guest = undefined;
    native().close(fd);
    fd = -1;
    client.release(key);
    expect(await listNetns()).not.toContain(key);
    // the daemon's DHCPRELEASE: dnsmasq forgets the lease
    await waitFor(
      'dnsmasq to drop the lease',
      () => !readFileSync(join(root, 'leases'), 'utf8').includes(` ${ip} `),
      20_000,
    );
    expect(dnsmasqLog()).toMatch(new RegExp(`DHCPRELEASE\\(lan0\\) ${ip.replace(/\./g, '\\.')} `));
  }, 240_000);
});
