// Every network shape a cluster runs, with Debian's plugins and a VM stand-in whose frames go through the pod's tap fd
// (test/helpers/taprelay.ts): bridge, ptp, macvlan, host-device, the meta-plugin chain (portmap with a hostPort, tuning,
// firewall), and ipvlan/vlan (on a kernel that cannot make them: the add fails clearly, leaving nothing). Each
// shows the guest's DHCP lease equal to the CNI IP, traffic both ways, and nothing left after release. macvlan and
// ipvlan get the tc-redirect binding (their MAC stays), and so does a veth; the bridge binding is the NIC's and
// VLAN's, and any link's under --binding bridge.
import { execFileSync } from 'node:child_process';
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { execa, type ResultPromise } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FdClient } from '../../src/client/fdclient.js';
import { native } from '../../src/native.js';
import type { ContainerSideNetwork, PodNetworkDesc } from '../../src/protocol/payloads.js';
import { BIN, removeDir, startDaemon, type Daemon } from '../helpers/daemon.js';
import { guestOnTap, type GuestNetns } from '../helpers/taprelay.js';
import { listLinks, listNetns, run } from '../helpers/netns.js';
import { uniqueSubnet } from '../helpers/cniconf.js';
import { ensureUdhcpc6, UDHCPC6_BUILD_TIMEOUT_MS } from '../helpers/guest.js';
import { normaliseIpv6 } from '../../src/net/ipv6.js';
import { KEPT_FROM_NETWORK, KEPT_FROM_VM, REDIRECT_PRIO } from '../../src/podnet/tcredirect.js';
import { kernelMakes, makeLan, ping, udhcpcLease, writeConfList, type Lan } from '../helpers/shapes.js';

const rand = () => randomBytes(3).toString('hex');
/** what a plugin's error says when the kernel has no such link type (netlink's EOPNOTSUPP) */
const KERNEL_LACKS = 'not supported';
/** generous rates: shaped, not slowed (bits per second and bits) */
const BANDWIDTH = {
  ingressRate: 1_000_000_000,
  ingressBurst: 100_000_000,
  egressRate: 1_000_000_000,
  egressBurst: 100_000_000,
};

let d: Daemon;
let client: FdClient;
let root = '';
let confDir = '';
let ipamDir = '';
const lans: Lan[] = [];
const bridges: string[] = [];
const children: ResultPromise[] = [];
/** pods podOn made and releaseAll has not released yet: a test that fails midway leaves them to afterAll */
const unreleased = new Map<string, { guest?: GuestNetns; fd?: number }>();
/** busybox with udhcpc6 (Debian's busybox has none): built once by test/guest/udhcpc6.sh */
let busybox6 = '';

beforeAll(async () => {
  busybox6 = await ensureUdhcpc6();
}, UDHCPC6_BUILD_TIMEOUT_MS);

beforeAll(async () => {
  root = mkdtempSync(join(tmpdir(), 'vmpod-shapes-'));
  confDir = join(root, 'net.d');
  ipamDir = join(root, 'ipam');
  writeConfList(confDir, 'placeholder', [{ type: 'loopback' }]);
  d = await startDaemon({ confDir, binDirs: ['/usr/lib/cni'], cacheDir: join(root, 'cache') });
  client = new FdClient(d.socket, { timeoutMs: 60_000 });
}, 60_000);

afterAll(async () => {
  for (const c of children) c.kill('SIGKILL');
  for (const [key, { guest, fd }] of unreleased) {
    await guest?.close();
    if (fd !== undefined) native().close(fd);
    try {
      client.release(key);
    } catch {
      // the daemon says why in its log; the checks below still run
    }
  }
  const code = await d?.stop();
  for (const l of lans) await l.cleanup();
  for (const b of bridges) await execa('ip', ['link', 'del', b], { reject: false });
  removeDir(d.dir);
  rmSync(root, { recursive: true, force: true });
  expect(code).toBe(0);
}, 60_000);

const hostLocal = (subnet: string, gateway: string) => ({
  type: 'host-local',
  dataDir: ipamDir,
  ranges: [[{ subnet, gateway }]],
  routes: [{ dst: '0.0.0.0/0' }],
});

function allocations(net: string): string[] {
  const dir = join(ipamDir, net);
  return existsSync(dir) ? readdirSync(dir).filter((f) => !/^(last_reserved_ip\.\d+|lock)$/.test(f)) : [];
}

interface Pod {
  key: string;
  net: string;
  csn: ContainerSideNetwork;
  ip: string;
  guest: GuestNetns;
  fd: number;
}

/** add on this conflist, the guest on the tap takes its lease (equal to the CNI IP), and pings `peer` from `peerNs`. */
async function podOn(
  plugins: Record<string, unknown>[],
  peer: { ns: string | undefined; ip: string },
  add?: (key: string) => ContainerSideNetwork,
): Promise<Pod> {
  const net = `vmshape-${rand()}`;
  writeConfList(confDir, net, plugins);
  const key = `vmsh-${rand()}`;
  const left: { guest?: GuestNetns; fd?: number } = {};
  unreleased.set(key, left);
  const csn = add ? add(key) : client.add(key, { podId: key, podNs: 'default', podName: 'vm-shape', DNS: null });
  const ip = csn.Result!.ips!.find((i) => i.version === '4')!.address.split('/')[0]!;
  const { fds } = client.get(key);
  left.fd = fds[0]!;
  const guest = await guestOnTap(fds[0]!, csn.Interfaces[0]!.mac!, csn.Interfaces[0]!.MTU);
  left.guest = guest;
  const lease = await udhcpcLease(guest.ns, join(root, key));
  expect(lease.ip).toBe(ip);
  expect(await ping(guest.ns, peer.ip), `the VM reaches ${peer.ip}`).toBe(0);
  expect(await ping(peer.ns, ip), `${peer.ip} reaches the VM`).toBe(0);
  return { key, net, csn, ip, guest, fd: fds[0]! };
}

/** release, then: no netns, no IPAM allocation, no CNI cache file, nothing in the state dir of the pod. */
async function releaseAll(p: Pod, stateDir = d.stateDir): Promise<void> {
  unreleased.delete(p.key);
  await p.guest.close();
  native().close(p.fd);
  client.release(p.key);
  expect(await listNetns()).not.toContain(p.key);
  expect(allocations(p.net)).toEqual([]);
  expect(
    readdirSync(join(root, 'cache', 'results'), { withFileTypes: true })
      .map((e) => e.name)
      .filter((n) => n.includes(p.key)),
  ).toEqual([]);
  expect(readdirSync(stateDir).filter((n) => n.includes(p.key))).toEqual([]);
}

/**
 * add on this conflist fails (a plugin the kernel cannot serve): the error names the plugin and the kernel's reason,
 * and nothing of the pod is left: no netns, no IPAM allocation, no CNI cache file, nothing in the state dir.
 */
async function refusedOn(plugins: Record<string, unknown>[], why: string): Promise<void> {
  const net = `vmshape-${rand()}`;
  writeConfList(confDir, net, plugins);
  const key = `vmsh-${rand()}`;
  expect(() => client.add(key, { podId: key, podNs: 'default', podName: 'vm-shape', DNS: null })).toThrow(
    new RegExp(`${plugins[0]!.type}.*${why}`, 's'),
  );
  expect(await listNetns()).not.toContain(key);
  expect(allocations(net)).toEqual([]);
  const results = join(root, 'cache', 'results');
  expect(existsSync(results) ? readdirSync(results).filter((n) => n.includes(key)) : []).toEqual([]);
  expect(readdirSync(d.stateDir).filter((n) => n.includes(key))).toEqual([]);
}

/** tc's filters as `tc -j` shows them: one entry per prio, and one per filter (with options) */
async function tcFilters(
  ns: string,
  dev: string,
): Promise<
  {
    pref: number;
    protocol: string;
    kind?: string;
    options?: { actions?: { kind: string; to_dev?: string }[]; flowid?: string; fh?: string };
  }[]
> {
  return JSON.parse(
    await run(['ip', 'netns', 'exec', ns, 'tc', '-j', 'filter', 'show', 'dev', dev, 'ingress']),
  ) as never;
}

async function hostBridge(): Promise<{ name: string; subnet: string; gateway: string }> {
  const name = `vmsb${rand()}`;
  bridges.push(name);
  const { prefix } = await uniqueSubnet();
  return { name, subnet: `${prefix}.0/24`, gateway: `${prefix}.1` };
}

describe('CNI shapes with a VM stand-in on the tap fd', () => {
  it('bridge + host-local, IPv4: tc-redirect (no bridge in the pod netns); the veth shares its MAC with the VM; the host bridge reaches the VM and back', async () => {
    const br = await hostBridge();
    const p = await podOn(
      [{ type: 'bridge', bridge: br.name, isGateway: true, ipMasq: false, ipam: hostLocal(br.subnet, br.gateway) }],
      { ns: undefined, ip: br.gateway },
    );
    const links = JSON.parse(await run(['ip', '-n', p.key, '-j', 'link', 'show'])) as {
      ifname: string;
      address: string;
    }[];
    expect(links.map((l) => l.ifname).sort()).toEqual(['lo', 'tap0', 'virtlet-eth0']);
    expect(links.find((l) => l.ifname === 'virtlet-eth0')!.address).toBe(p.csn.Interfaces[0]!.mac);
    expect(
      (await tcFilters(p.key, 'virtlet-eth0')).flatMap((f) => f.options?.actions ?? []).map((a) => a.to_dev),
    ).toEqual(['tap0']);
    await releaseAll(p);
    expect(JSON.parse(await run(['ip', '-j', 'link', 'show', 'master', br.name])) as unknown[]).toEqual([]);
  }, 90_000);

  it('ptp + host-local (the shape of Calico, Cilium, AWS VPC CNI): routed by the host side', async () => {
    const { prefix } = await uniqueSubnet();
    const p = await podOn([{ type: 'ptp', ipMasq: false, ipam: hostLocal(`${prefix}.0/24`, `${prefix}.1`) }], {
      ns: undefined,
      ip: `${prefix}.1`,
    });
    await releaseAll(p);
    // the host side (the veth holding the gateway address) went with the DEL
    expect(await run(['ip', '-4', '-o', 'addr', 'show'])).not.toContain(`${prefix}.1/`);
  }, 90_000);

  it('macvlan + host-local: tc-redirect, the VM and the macvlan share its MAC, the LAN reaches the VM and back', async () => {
    const lan = await makeLan('m');
    lans.push(lan);
    // what reaches the LAN's side of the wire: DHCP (udp 67/68) counted
    await run(['ip', 'netns', 'exec', lan.ns, 'nft', '-f', '-'], {
      input:
        'table netdev vmcount {\n chain in {\n  type filter hook ingress device "lan0" priority 0;\n  udp dport { 67, 68 } counter\n }\n}\n',
    });
    const p = await podOn(
      [{ type: 'macvlan', master: lan.parent, mode: 'bridge', ipam: hostLocal(lan.subnet, lan.gateway) }],
      { ns: lan.ns, ip: lan.gateway },
    );
    const links = JSON.parse(await run(['ip', '-n', p.key, '-j', '-d', 'link', 'show'])) as {
      ifname: string;
      address: string;
      linkinfo?: { info_kind?: string };
    }[];
    const mv = links.find((l) => l.ifname === 'virtlet-eth0')!;
    expect(mv.linkinfo?.info_kind).toBe('macvlan');
    expect(mv.address).toBe(p.csn.Interfaces[0]!.mac);
    expect(links.map((l) => l.ifname)).not.toContain('br0');
    // what tc itself shows: the keep filters, then the redirect each way
    const onMv = await tcFilters(p.key, 'virtlet-eth0');
    expect(onMv.flatMap((f) => f.options?.actions ?? []).map((a) => [a.kind, a.to_dev])).toEqual([['mirred', 'tap0']]);
    // each keep filter at its prio with its protocol, as the plan wrote them, then the redirect last
    const kept = (fs: Awaited<ReturnType<typeof tcFilters>>) =>
      fs.filter((f) => f.options?.flowid === 'ffff:1').map((f) => `${f.pref} ${f.protocol}`);
    expect(kept(onMv)).toEqual(KEPT_FROM_NETWORK.map(([proto], n) => `${n + 1} ${proto}`));
    expect(onMv.filter((f) => f.options?.actions).map((f) => `${f.pref} ${f.protocol}`)).toEqual([
      `${REDIRECT_PRIO} all`,
    ]);
    const onTap = await tcFilters(p.key, 'tap0');
    expect(kept(onTap)).toEqual(KEPT_FROM_VM.map(([proto], n) => `${n + 1} ${proto}`));
    expect(onTap.flatMap((f) => f.options?.actions ?? []).map((a) => [a.kind, a.to_dev])).toEqual([
      ['mirred', 'virtlet-eth0'],
    ]);
    // the VM's DHCP stayed in the pod: not one DHCP frame reached the LAN
    const counted = JSON.parse(
      await run(['ip', 'netns', 'exec', lan.ns, 'nft', '-j', 'list', 'table', 'netdev', 'vmcount']),
    ) as { nftables: { rule?: { expr: { counter?: { packets: number } }[] } }[] };
    const counters = counted.nftables.flatMap(
      (e) => e.rule?.expr.flatMap((x) => (x.counter ? [x.counter.packets] : [])) ?? [],
    );
    expect(counters).toEqual([0]);
    await releaseAll(p);
    expect(
      JSON.parse(await run(['ip', '-j', '-d', 'link', 'show'])).filter(
        (l: { link?: string; linkinfo?: { info_kind?: string } }) =>
          l.linkinfo?.info_kind === 'macvlan' && l.link === lan.parent,
      ),
    ).toEqual([]);
  }, 90_000);

  it('macvlan dual-stack: the macvlan gives up the link-local it shares with the VM; the VM gets its IPv6 by DHCPv6 on the tap and reaches the LAN', async () => {
    const lan = await makeLan('6');
    lans.push(lan);
    const p6 = randomBytes(5).toString('hex');
    const prefix6 = `fd${p6.slice(0, 2)}:${parseInt(p6.slice(2, 6), 16).toString(16)}:${parseInt(p6.slice(6, 10), 16).toString(16)}:`;
    await run(['ip', '-n', lan.ns, 'addr', 'add', `${prefix6}:1/64`, 'dev', 'lan0', 'nodad']);
    const ipam = {
      type: 'host-local',
      dataDir: ipamDir,
      ranges: [[{ subnet: lan.subnet, gateway: lan.gateway }], [{ subnet: `${prefix6}:/64`, gateway: `${prefix6}:1` }]],
      routes: [{ dst: '0.0.0.0/0' }],
    };
    const p = await podOn([{ type: 'macvlan', master: lan.parent, mode: 'bridge', ipam }], {
      ns: lan.ns,
      ip: lan.gateway,
    });
    const ip6 = p.csn.Result!.ips!.find((i) => i.version === '6')!.address.split('/')[0]!;
    // the pod netns holds no IPv6 address on the macvlan: not the pod's (the VM's), not the EUI-64 link-local (the VM's too)
    const mvAddrs = JSON.parse(await run(['ip', '-n', p.key, '-j', '-6', 'addr', 'show', 'dev', 'virtlet-eth0'])) as {
      addr_info: unknown[];
    }[];
    expect(mvAddrs.flatMap((l) => l.addr_info)).toEqual([]);
    const dir = join(root, `${p.key}-6`);
    const hook = join(dir, 'hook6.sh');
    mkdirSync(dir, { recursive: true });
    writeFileSync(
      hook,
      `#!/bin/sh\ncase "$1" in bound|renew) echo "$ipv6" > "${dir}/ipv6"; ip -6 addr replace "$ipv6/128" dev "$interface" nodad ;; esac\nexit 0\n`,
    );
    chmodSync(hook, 0o755);
    const u = execa(
      'ip',
      ['netns', 'exec', p.guest.ns, busybox6, 'udhcpc6', '-i', 'eth0', '-f', '-q', '-s', hook, '-t', '10', '-T', '1'],
      { reject: false, all: true, timeout: 40_000 },
    );
    children.push(u);
    const r = await u;
    expect(r.exitCode, r.all).toBe(0);
    expect(normaliseIpv6(readFileSync(join(dir, 'ipv6'), 'utf8').trim())).toBe(ip6);
    // the VM's own link-local passed DAD: nothing in the pod netns answered for it
    let ll: { local: string; tentative?: boolean; dadfailed?: boolean } | undefined;
    for (let i = 0; i < 50; i++) {
      const a = (
        JSON.parse(await run(['ip', '-n', p.guest.ns, '-j', '-6', 'addr', 'show', 'dev', 'eth0'])) as {
          addr_info: { local: string; scope: string; tentative?: boolean; dadfailed?: boolean }[];
        }[]
      )[0]!.addr_info;
      ll = a.find((x) => x.scope === 'link');
      if (ll && !ll.tentative) break;
      await new Promise((res) => setTimeout(res, 100));
    }
    expect(ll?.dadfailed).toBeUndefined();
    expect(ll?.tentative).toBeUndefined();
    const ping6 = async (ns: string, dst: string) =>
      (await execa('ip', ['netns', 'exec', ns, 'ping', '-6', '-c', '1', '-W', '3', dst], { reject: false })).exitCode ??
      -1;
    // the RA's on-link prefix: the LAN's address is a neighbour, reached through the redirect, and it reaches the VM
    let out = -1;
    for (let i = 0; i < 10 && out !== 0; i++) out = await ping6(p.guest.ns, `${prefix6}:1`);
    expect(out).toBe(0);
    expect(await ping6(lan.ns, ip6)).toBe(0);
    await releaseAll(p);
  }, 90_000);

  it('host-device + host-local: the NIC moves into the pod and back on release, as it was', async () => {
    const lan = await makeLan('h');
    lans.push(lan);
    const linkOf = async () =>
      (JSON.parse((await execa('ip', ['-j', 'link', 'show', 'dev', lan.parent])).stdout) as { address: string }[])[0]!;
    const mac = (await linkOf()).address;
    const p = await podOn([{ type: 'host-device', device: lan.parent, ipam: hostLocal(lan.subnet, lan.gateway) }], {
      ns: lan.ns,
      ip: lan.gateway,
    });
    expect(await listLinks()).not.toContain(lan.parent);
    const ingress = async (netns: string[], dev: string) =>
      (
        JSON.parse((await execa('tc', [...netns, '-j', 'qdisc', 'show', 'dev', dev])).stdout) as { kind: string }[]
      ).some((q) => q.kind === 'ingress');
    // a veth here: the tc-redirect binding, its ingress qdisc on the NIC in the pod
    expect(await ingress(['-n', p.key], 'virtlet-eth0')).toBe(true);
    await releaseAll(p);
    expect(await listLinks()).toContain(lan.parent);
    // nothing of the binding came back with it: its MAC, and no ingress qdisc redirecting its frames to a tap gone
    expect((await linkOf()).address).toBe(mac);
    expect(await ingress([], lan.parent)).toBe(false);
  }, 90_000);

  it('bridge chained with portmap, tuning, bandwidth and firewall: a TCP connection to the node hostPort reaches a listener in the VM', async () => {
    const br = await hostBridge();
    const hostPort = 20000 + Math.floor(Math.random() * 20000);
    // the bandwidth plugin's egress shaping makes an ifb per pod: counted before, counted after release
    const ifbs = async () => (await listLinks()).filter((l) => l.startsWith('bwp')).sort();
    const ifbsBefore = await ifbs();
    const p = await podOn(
      [
        { type: 'bridge', bridge: br.name, isGateway: true, ipMasq: false, ipam: hostLocal(br.subnet, br.gateway) },
        { type: 'portmap', capabilities: { portMappings: true }, snat: true },
        { type: 'tuning', sysctl: { 'net.ipv4.conf.virtlet-eth0.accept_redirects': '0' } },
        { type: 'bandwidth', capabilities: { bandwidth: true } },
        { type: 'firewall', backend: 'iptables' },
      ],
      { ns: undefined, ip: br.gateway },
      // through tapctl, as a person would: the request carries the port mapping
      (key) =>
        JSON.parse(
          execFileSync(
            process.execPath,
            [
              BIN.tapctl,
              '--socket',
              d.socket,
              'add',
              key,
              '--pod-name',
              'vm-shape',
              '--pod-namespace',
              'default',
              '--port',
              `${hostPort}:8080/tcp`,
              '--bandwidth',
              JSON.stringify(BANDWIDTH),
            ],
            { encoding: 'utf8' },
          ),
        ) as ContainerSideNetwork,
    );
    // the bandwidth plugin got its runtimeConfig: a tbf on the host side of the pod's veth shapes what goes to the pod
    const [hostVeth] = (
      JSON.parse(await run(['ip', '-j', 'link', 'show', 'master', br.name])) as { ifname: string }[]
    ).map((l) => l.ifname);
    expect(
      (JSON.parse(await run(['tc', '-j', 'qdisc', 'show', 'dev', hostVeth!])) as { kind: string }[]).map((q) => q.kind),
    ).toContain('tbf');
    // kept with the pod, for its DEL and a restart: in the state record and, as libcni keeps it, the CNI cache
    const mapping = { hostPort, containerPort: 8080, protocol: 'tcp', hostIP: '' };
    expect(
      (JSON.parse(readFileSync(join(d.stateDir, `${p.key}.json`), 'utf8')) as { desc: PodNetworkDesc }).desc
        .portMappings,
    ).toEqual([mapping]);
    const cached = readdirSync(join(root, 'cache', 'results')).find((f) => f.includes(p.key))!;
    expect(
      (JSON.parse(readFileSync(join(root, 'cache', 'results', cached), 'utf8')) as { capabilityArgs?: unknown })
        .capabilityArgs,
    ).toEqual({ portMappings: [mapping], bandwidth: BANDWIDTH });
    const listener = execa(
      'ip',
      ['netns', 'exec', p.guest.ns, 'busybox', 'nc', '-l', '-p', '8080', '-e', 'echo', 'vm-listener'],
      { reject: false, timeout: 30_000 },
    );
    children.push(listener);
    // the node's own address on the CNI bridge: portmap's OUTPUT rule DNATs a local destination to the pod
    let answer = '';
    for (let i = 0; i < 20 && !answer.includes('vm-listener'); i++) {
      const r = await execa('busybox', ['nc', '-w', '2', br.gateway, String(hostPort)], {
        reject: false,
        timeout: 5_000,
        input: '',
      });
      answer = r.stdout;
      if (!answer.includes('vm-listener')) await new Promise((res) => setTimeout(res, 200));
    }
    expect(answer).toContain('vm-listener');
    listener.kill('SIGKILL');
    await releaseAll(p);
    expect(await ifbs()).toEqual(ifbsBefore);
    // portmap's DNAT chain of the pod went with its DEL
    expect((await execa('iptables', ['-t', 'nat', '-S'], { reject: false })).stdout).not.toContain(
      `--dport ${hostPort} `,
    );
  }, 90_000);

  it('VMPOD_BINDING=bridge: a bridge plugin veth gives its MAC to the VM, and br0 joins it and the tap', async () => {
    const forced = await startDaemon({
      confDir,
      binDirs: ['/usr/lib/cni'],
      cacheDir: join(root, 'cache'),
      env: { VMPOD_BINDING: 'bridge' },
    });
    const saved = client;
    client = new FdClient(forced.socket, { timeoutMs: 60_000 });
    try {
      const br = await hostBridge();
      const p = await podOn(
        [{ type: 'bridge', bridge: br.name, isGateway: true, ipMasq: false, ipam: hostLocal(br.subnet, br.gateway) }],
        { ns: undefined, ip: br.gateway },
      );
      const links = JSON.parse(await run(['ip', '-n', p.key, '-j', 'link', 'show'])) as {
        ifname: string;
        address: string;
        master?: string;
      }[];
      const veth = links.find((l) => l.ifname === 'virtlet-eth0')!;
      expect(veth.master).toBe('br0');
      expect(links.find((l) => l.ifname === 'tap0')!.master).toBe('br0');
      expect(veth.address).not.toBe(p.csn.Interfaces[0]!.mac);
      expect(await tcFilters(p.key, 'virtlet-eth0')).toEqual([]);
      const listed = client.list() as { key: string; interfaces: { binding: string; bridge: string }[] }[];
      expect(listed.find((x) => x.key === p.key)?.interfaces[0]).toMatchObject({ binding: 'bridge', bridge: 'br0' });
      await releaseAll(p, forced.stateDir);
    } finally {
      client = saved;
      expect(await forced.stop()).toBe(0);
      removeDir(forced.dir);
    }
  }, 90_000);

  it('ipvlan + host-local: tc-redirect; on a kernel that makes no ipvlan, the add fails saying so', async () => {
    const k = await kernelMakes('ipvlan');
    const lan = await makeLan('i');
    lans.push(lan);
    const plugins = [{ type: 'ipvlan', master: lan.parent, mode: 'l2', ipam: hostLocal(lan.subnet, lan.gateway) }];
    if (!k.ok) {
      // (the plan for an ipvlan link is covered by test/unit/podnet-binding.test.ts)
      await refusedOn(plugins, KERNEL_LACKS);
      return;
    }
    const p = await podOn(plugins, { ns: lan.ns, ip: lan.gateway });
    expect(
      (await tcFilters(p.key, 'virtlet-eth0')).flatMap((f) => f.options?.actions ?? []).map((a) => a.to_dev),
    ).toEqual(['tap0']);
    await releaseAll(p);
  }, 90_000);

  it('vlan + host-local: the bridge binding on a VLAN of the LAN; on a kernel that makes no vlan, the add fails saying so', async () => {
    const k = await kernelMakes('vlan');
    const lan = await makeLan('v');
    lans.push(lan);
    const { prefix } = await uniqueSubnet();
    if (!k.ok) {
      await refusedOn(
        [{ type: 'vlan', master: lan.parent, vlanId: 7, ipam: hostLocal(`${prefix}.0/24`, `${prefix}.1`) }],
        KERNEL_LACKS,
      );
      return;
    }
    await run(['ip', '-n', lan.ns, 'link', 'add', 'link', 'lan0', 'name', 'lan0.7', 'type', 'vlan', 'id', '7']);
    await run(['ip', '-n', lan.ns, 'addr', 'add', `${prefix}.1/24`, 'dev', 'lan0.7']);
    await run(['ip', '-n', lan.ns, 'link', 'set', 'dev', 'lan0.7', 'up']);
    const p = await podOn(
      [{ type: 'vlan', master: lan.parent, vlanId: 7, ipam: hostLocal(`${prefix}.0/24`, `${prefix}.1`) }],
      { ns: lan.ns, ip: `${prefix}.1` },
    );
    await releaseAll(p);
  }, 90_000);
});
