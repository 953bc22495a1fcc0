// The real guest on IPv6 pods, end to end: tapmanager builds a dual-stack or an IPv6-only pod network (bridge +
// host-local), qemu is started THROUGH vmwrapper, and the tiny guest (its kernel takes the RA, busybox udhcpc6 the
// DHCPv6 lease) ends with exactly the CNI IPv6 address (and on dual-stack its IPv4 lease as before); from the guest it
// pings the pod's IPv6 gateway and fetches over IPv6 from a server in the host-side netns on an address outside the
// pod's /64 (reachable only along the RA's default route: the router the pod netns answers for on the tap, which
// forwards to the CNI gateway); the host fetches the guest's page and status over IPv6; release leaves nothing behind.
import { randomBytes } from 'node:crypto';
import { mkdtempSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { FdClient } from '../../src/client/fdclient.js';
import { formatIpv6, linkLocalFromMac, normaliseIpv6 } from '../../src/net/ipv6.js';
import { makeCniConf, type CniTestNet } from '../helpers/cniconf.js';
import { startDaemon, type Daemon } from '../helpers/daemon.js';
import { ensureGuest, GUEST_BUILD_TIMEOUT_MS, type GuestImages } from '../helpers/guest.js';
import { linkExists, run, uniqueName } from '../helpers/netns.js';
import {
  NOTHING_LEFT,
  POD_DNS,
  bootPairVm,
  endPairDaemon,
  stopVmsAndRelease,
  fetchFromHost,
  newPod,
  podAddress,
  podAddress6,
  podLeftovers,
  type PairVmBase,
  type PairVmOf,
} from '../helpers/pairvm.js';

/** an IPv6 name server in the pod's DNS config: it reaches the guest by DHCPv6 (and the RA's RDNSS) */
const DNS6 = 'fd53::53';

/** `key=value` lines up to a line "output:", and what follows it (test/guest/net6.cgi's answer) */
function parseNet6(text: string): { fields: Record<string, string>; output: string } {
  const lines = text.split('\n');
  const at = lines.indexOf('output:');
  const head = at < 0 ? lines : lines.slice(0, at);
  const fields = Object.fromEntries(
    head.filter((l) => l.includes('=')).map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
  );
  return { fields, output: at < 0 ? '' : lines.slice(at + 1).join('\n') };
}

/** status code and body of a GET from the host netns (curl bounds itself; -g: brackets are no glob) */
async function getFromHost(url: string): Promise<{ code: number; body: string }> {
  const out = await run(['curl', '-sS', '-g', '--max-time', '20', '-w', '\n%{http_code}', url], { timeoutMs: 30_000 });
  const nl = out.lastIndexOf('\n');
  return { code: Number(out.slice(nl + 1)), body: out.slice(0, nl) };
}

describe.each([['dual'], ['only']] as const)('the real guest on an IPv6 (%s-stack) pod', (mode) => {
  let guest: GuestImages;
  let net: CniTestNet;
  let d: Daemon | undefined;
  let dir: string;
  const vms: PairVmBase[] = [];
  const pods = new Set<string>();
  /** the host-side server: a veth pair of our own in the root netns holds `far`, outside every pod prefix */
  const farLink = uniqueName('vmp6far');
  const farPeer = uniqueName('vmp6fp');
  const far = `fd${randomBytes(1).toString('hex')}:${randomBytes(2).toString('hex')}:${randomBytes(2).toString('hex')}::7`;
  const token = `vmpod-ipv6-e2e-${randomBytes(4).toString('hex')}`;
  let server: Server | undefined;
  let farPort = 0;
  /** the source address of each request the host-side server answered */
  const seenFrom: string[] = [];

  const client = (): FdClient => new FdClient((d as Daemon).socket, { timeoutMs: 60_000 });

  beforeAll(async () => {
    guest = await ensureGuest();
    net = await makeCniConf({ ipv6: mode });
    expect(normaliseIpv6(far)?.startsWith(net.subnet6!.replace('::/64', ':'))).toBe(false);
    dir = mkdtempSync(join(tmpdir(), 'vmpod-ipv6e2e-'));
    d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir });

    await run(['ip', 'link', 'add', farLink, 'type', 'veth', 'peer', 'name', farPeer]);
    await run(['ip', 'link', 'set', farPeer, 'up']);
    await run(['ip', 'link', 'set', farLink, 'up']);
    await run(['ip', 'addr', 'add', `${far}/128`, 'dev', farLink, 'nodad']);
    server = createServer((req, res) => {
      seenFrom.push(req.socket.remoteAddress ?? '');
      res.setHeader('Content-Type', 'text/plain');
      res.end(`${token}\n`);
    });
    await new Promise<void>((resolve, reject) => {
      server!.once('error', reject);
      server!.listen(0, far, resolve);
    });
    farPort = (server.address() as AddressInfo).port;
  }, GUEST_BUILD_TIMEOUT_MS);

  afterEach(async () => {
    await stopVmsAndRelease(vms, pods, client);
  }, 60_000);

  afterAll(async () => {
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
    await run(['ip', 'link', 'del', farLink]).catch(() => undefined);
    const { code, stateLeft } = await endPairDaemon(d, net, dir);
    expect(code).toBe(0);
    expect(stateLeft).toEqual([]);
    expect(await linkExists(farLink)).toBe(false);
    expect(await linkExists(farPeer)).toBe(false);
  }, 60_000);

  it('gets exactly the CNI IPv6 address, pings the gateway, serves and fetches over IPv6; release leaves nothing', async () => {
    const { key, desc } = newPod(mode === 'dual' ? 'vmp6d' : 'vmp6o');
    desc.DNS = { nameservers: [...POD_DNS.nameservers, DNS6], search: [...POD_DNS.search] };
    pods.add(key);
    const csn = client().add(key, desc);
    const a6 = podAddress6(csn);
    expect(a6.prefixLen).toBe(64);
    expect(csn.Result?.ips?.some((i) => i.version === '4')).toBe(mode === 'dual');
    const a4 = mode === 'dual' ? podAddress(csn) : undefined;
    // the router the guest learns from the RA: the tap's link-local, made from its MAC (the bridge plugin's veth gets
    // tc-redirect; the pod netns routes for the VM)
    const brMac = (
      JSON.parse(await run(['ip', '-n', key, '-j', 'link', 'show', 'dev', 'tap0'])) as { address: string }[]
    )[0]!.address;
    const router = formatIpv6(linkLocalFromMac(brMac));

    // an IPv6-only pod waits for VMPOD-LEASE6 alone; dual-stack for both lease lines
    const vm = await bootPairVm({
      socket: (d as Daemon).socket,
      key,
      guest,
      dir,
      name: `${key}.serial.log`,
      timeoutMs: 120_000,
      leases: a4 ? 'dual' : 'ipv6',
    }).catch((e: Error) => {
      // what the pod's RA and DHCPv6 servers saw, for the failure message
      const seen = (d as Daemon)
        .logs()
        .split('\n')
        .filter((l) => /dhcp6|"ra[: ]|router advertisements/.test(l));
      throw new Error(`${e.message}\ntapmanager's IPv6 lines:\n${seen.slice(-20).join('\n')}`, { cause: e });
    });
    vms.push(vm);
    expect(vm.lease6).toEqual({
      event: 'VMPOD-LEASE6',
      ip: a6.ip,
      prefixLen: 128,
      dns: [DNS6],
      search: [...POD_DNS.search],
      iface: 'eth0',
    });
    if (a4 !== undefined) {
      // dual-stack: the IPv4 lease as on an IPv4 pod
      const lease = (vm as PairVmOf<'dual'>).lease;
      expect(`${lease.ip}/${lease.prefixLen}`).toBe(`${a4.ip}/${a4.prefixLen}`);
      expect(lease.mac).toBe(a4.mac);
      expect(lease.routers).toEqual([net.gateway]);
      expect(lease.hostname).toBe(desc.podName);
      expect(lease.dns).toContain(POD_DNS.nameservers[0]);
    }

    const base = `http://[${a6.ip}]`;
    // The host reaches the guest over IPv6 (on-link: the CNI bridge holds the gateway of the pod's /64).
    const page = await fetchFromHost(`${base}/`);
    expect(page).toContain('vmpod test guest');
    if (mode === 'dual') expect(page).toContain(`hostname=${desc.podName}`);
    const status = Object.fromEntries(
      (await fetchFromHost(`${base}/cgi-bin/status`))
        .split('\n')
        .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
    );
    // ONE udhcpc either way; an IPv6-only guest has no IPv4 address and no IPv4 default route
    expect(status).toMatchObject({
      udhcpc: '1',
      addr: a4 ? `${a4.ip}/${a4.prefixLen}` : '',
      default: a4 ? net.gateway : '',
    });

    // The guest's IPv6 view: the /128 from DHCPv6 beside its link-local (from the pod's MAC, which the VM owns; no
    // SLAAC address: the RA's prefix has A=0), the RA's default route via the tap's link-local.
    const view = parseNet6((await getFromHost(`${base}/cgi-bin/net6`)).body).fields;
    const vmLinkLocal = formatIpv6(linkLocalFromMac(csn.Interfaces[0]!.mac!));
    expect(view['addr6']?.split(',').sort()).toEqual([`${a6.ip}/128`, `${vmLinkLocal}/64`].sort());
    expect(view['default6']).toMatch(new RegExp(`^default via ${router} dev eth0 `));
    expect(view['udhcpc6']).toBe('1');

    // From the guest: ping -6 the pod's IPv6 gateway (the CNI bridge in the host-side netns).
    const ping = await getFromHost(`${base}/cgi-bin/net6?ping=${a6.gateway}`);
    expect(ping.code).toBe(200);
    expect(parseNet6(ping.body).fields['exit'], ping.body).toBe('0');
    expect(parseNet6(ping.body).output).toMatch(/2 packets transmitted, 2 packets received/);

    // From the guest: HTTP over IPv6 to the host-side server on an address outside the pod's /64, so the packets take
    // the guest's default route; the server saw the guest's DHCPv6 address as the source.
    const url = `http://[${far}]:${farPort}/e2e`;
    const fetched = await getFromHost(`${base}/cgi-bin/net6?fetch=${encodeURIComponent(url)}`);
    expect(parseNet6(fetched.body).fields['exit'], fetched.body).toBe('0');
    expect(parseNet6(fetched.body).output.trim()).toBe(token);
    expect(seenFrom.map((s) => normaliseIpv6(s))).toContain(a6.ip);

    // The CGI takes nothing but an address or such a URL.
    const refused = await getFromHost(`${base}/cgi-bin/net6?ping=${encodeURIComponent('::1;reboot')}`);
    expect(refused.code).toBe(400);
    expect(refused.body).toMatch(/^error=ping= takes an IPv6 address/m);

    await vm.stop();
    vms.splice(vms.indexOf(vm), 1);
    expect(vm.alive()).toBe(false);
    client().release(key);
    pods.delete(key);
    expect(await podLeftovers(net, (d as Daemon).stateDir, key)).toEqual(NOTHING_LEFT);
    expect(await net.bridgeExists()).toBe(true); // the CNI bridge is the node's, shared by pods: it stays
  }, 400_000);
});
