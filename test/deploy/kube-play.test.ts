// deploy/'s DaemonSet pod, run for real with `podman kube play` from the images scripts/images.sh builds, as a node
// runs it: the manifests' probes pass as kubelet sends them on hostNetwork (httpGet to the node's address, exec);
// the host's tapctl, through the socket on a host path, adds a pod whose conflist uses the dhcp IPAM plugin, whose
// daemon runs on the host with its socket in the host's /run/cni (a dnsmasq on the test's own bridge is the LAN's
// DHCP server); the libvirt container boots the tiny guest through /vmwrapper and the guest takes that pod IP. Then a
// rollout: the libvirt container restarts while the guest keeps answering ping (the VM in its own cgroup,
// VMPOD_VM_CGROUP from the manifests' ConfigMap) and libvirt lists the domain again; the tapmanager container restarts
// and the VM does not notice either. Then the VM, the pod network and the pod go, and nothing of theirs is left.
// Host paths: the node's CNI config, libvirt and state dirs become private dirs (test/helpers/kubeplay.ts); /dev,
// /sys, /sys/fs/cgroup, /var/run/netns and /run/cni are the machine's own on purpose (the pod netns and the dhcp
// daemon's socket must be there). kube play ignores hostPID: shareProcessNamespace stands in for it (the pod's infra
// container holds the PID namespace, so a container's restart does not end the VM's).
import {
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmdirSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { execa, type ResultPromise } from 'execa';
import { stringify } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ContainerSideNetwork } from '../../src/protocol/payloads.js';
import { SYSTEM_CNI_BIN } from '../helpers/cniconf.js';
import { BIN, REPO } from '../helpers/daemon.js';
import {
  ensureGuest,
  GUEST_BUILD_TIMEOUT_MS,
  GUEST_CMDLINE,
  LEASE_LINE_RE,
  parseLeaseLine,
  waitForSerialLine,
  type GuestImages,
} from '../helpers/guest.js';
import { domainXml } from '../helpers/libvirt.js';
import { containerImages, kubePlayDocs, kustomize, type KubeDoc } from '../helpers/kubeplay.js';
import { listNetns, run, runStatus, uniqueName } from '../helpers/netns.js';
import { POD_DNS, fetchFromHost, newPod, pingFromHost, podAddress } from '../helpers/pairvm.js';
import { cgroupMounts } from '../../src/vmwrapper/cgroup.js';

const MTU = 1400;
/** A cold build (debootstrap, npm ci, apt in three stages) takes minutes on a busy machine; a cached one seconds. */
const BUILD_TIMEOUT_MS = 1_800_000;

/** `podman ARGS` -> stdout; throws with the exit code and stderr. */
function podman(args: string[], timeoutMs = 120_000): Promise<string> {
  return run(['podman', ...args], { timeoutMs });
}

/** Is the mount holding `path` shared (mount propagation), per /proc/self/mountinfo? */
function mountOf(path: string): { mountPoint: string; shared: boolean } {
  let best = { mountPoint: '', shared: false };
  for (const line of readFileSync('/proc/self/mountinfo', 'utf8').split('\n')) {
    const f = line.split(' ');
    const mp = f[4];
    if (mp === undefined) continue;
    if ((path === mp || path.startsWith(mp.endsWith('/') ? mp : `${mp}/`)) && mp.length >= best.mountPoint.length) {
      const optional = f.slice(6, f.indexOf('-'));
      best = { mountPoint: mp, shared: optional.some((o) => o.startsWith('shared:')) };
    }
  }
  return best;
}

/**
 * A netns made in the tapmanager container reaches the host only through a Bidirectional mount of a SHARED host
 * /run/netns. iproute2 makes it so (a bind mount of /run/netns on itself, shared) the first time it adds a netns;
 * on a machine where that never happened, add and delete one netns of our own.
 */
async function ensureSharedNetnsDir(): Promise<void> {
  if (mountOf('/run/netns').mountPoint !== '/run/netns') {
    const probe = uniqueName('vmpkpsh');
    await run(['ip', 'netns', 'add', probe]);
    await run(['ip', 'netns', 'del', probe]);
  }
  expect(mountOf('/run/netns')).toEqual({ mountPoint: '/run/netns', shared: true });
}

/** Processes on the host whose argv mentions `word` (the domain's name is in qemu's argv). */
function processesMentioning(word: string): number[] {
  const pids: number[] = [];
  for (const e of readdirSync('/proc')) {
    if (!/^\d+$/.test(e) || Number(e) === process.pid) continue;
    try {
      if (readFileSync(`/proc/${e}/cmdline`, 'latin1').includes(word)) pids.push(Number(e));
    } catch {
      // gone meanwhile
    }
  }
  return pids;
}

function filesUnder(dir: string): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => !e.isDirectory())
    .map((e) => join(e.parentPath, e.name));
}

/** The node's address as kubelet probes a hostNetwork pod: its first global IPv4 (not one of the tests' bridges). */
async function nodeAddress(): Promise<string> {
  const links = JSON.parse(await run(['ip', '-j', '-4', 'addr', 'show', 'scope', 'global'])) as {
    ifname: string;
    addr_info: { local: string }[];
  }[];
  const l = links.find((x) => !x.ifname.startsWith('vmp') && x.addr_info.length > 0);
  if (l === undefined) throw new Error('no global IPv4 address on this machine to probe');
  return l.addr_info[0]!.local;
}

interface Probe {
  exec?: { command: string[] };
  httpGet?: { path: string; port: number | string };
}
interface PodContainer {
  name: string;
  ports?: { name?: string; containerPort: number }[];
  startupProbe?: Probe;
  readinessProbe?: Probe;
  livenessProbe?: Probe;
}

/**
 * One probe of the played pod as kubelet runs it for a hostNetwork pod: httpGet to the pod's IP, which is the node's
 * address, on the port (a name is looked up in the container's ports); exec in the container. Resolves when it passes.
 */
async function kubeletProbe(
  podName: string,
  c: PodContainer,
  kind: 'startupProbe' | 'readinessProbe' | 'livenessProbe',
  node: string,
): Promise<string> {
  const p = c[kind];
  if (p?.exec) return podman(['exec', `${podName}-${c.name}`, ...p.exec.command], 60_000);
  if (p?.httpGet) {
    const { port, path } = p.httpGet;
    const n = typeof port === 'number' ? port : c.ports?.find((x) => x.name === port)?.containerPort;
    if (n === undefined) throw new Error(`${c.name} ${kind}: no container port named ${String(port)}`);
    return fetchFromHost(`http://${node}:${n}${path}`);
  }
  throw new Error(`${c.name} has no ${kind}`);
}

/** The LAN side of the dhcp IPAM network: a bridge with an address of its own, and dnsmasq serving a range on it. */
interface DhcpLan {
  bridge: string;
  prefix: string;
  server: string;
  leases: string;
  stop(): Promise<void>;
}

async function startDhcpLan(dir: string): Promise<DhcpLan> {
  const routes = await run(['ip', '-4', 'route', 'show', 'table', 'all']);
  let prefix = '';
  for (let i = 0; i < 50 && prefix === ''; i++) {
    const b = randomBytes(2);
    const p = `10.${200 + (b[0]! % 50)}.${b[1]!}`;
    if (!routes.includes(`${p}.`)) prefix = p;
  }
  if (prefix === '') throw new Error('no free 10.200-249.x.0/24 subnet');
  const bridge = uniqueName('vmpkd');
  const server = `${prefix}.1`;
  await run(['ip', 'link', 'add', bridge, 'type', 'bridge']);
  await run(['ip', 'addr', 'add', `${server}/24`, 'dev', bridge]);
  await run(['ip', 'link', 'set', bridge, 'up']);
  const leases = join(dir, 'dnsmasq.leases');
  const dnsmasq = execa(
    'dnsmasq',
    [
      '--keep-in-foreground',
      '--conf-file=/dev/null',
      '--port=0',
      '--bind-interfaces',
      `--interface=${bridge}`,
      '--except-interface=lo',
      `--dhcp-range=${prefix}.100,${prefix}.199,255.255.255.0,1h`,
      `--dhcp-leasefile=${leases}`,
      '--dhcp-authoritative',
      `--pid-file=${join(dir, 'dnsmasq.pid')}`,
      `--log-facility=${join(dir, 'dnsmasq.log')}`,
      '--log-dhcp',
    ],
    { reject: false, stdin: 'ignore' },
  );
  return {
    bridge,
    prefix,
    server,
    leases,
    async stop() {
      dnsmasq.kill('SIGTERM');
      await dnsmasq;
      await runStatus(['ip', 'link', 'del', bridge]);
    },
  };
}

/** The CNI dhcp plugin's daemon, on the host, with its socket where the plugin looks: the host's /run/cni/dhcp.sock. */
const DHCP_SOCKET = '/run/cni/dhcp.sock';
async function startDhcpDaemon(): Promise<{ stop(): Promise<void> }> {
  if (existsSync(DHCP_SOCKET))
    throw new Error(
      `${DHCP_SOCKET} exists: another CNI dhcp daemon runs on this machine; the test needs the socket of its own`,
    );
  const hadDir = existsSync('/run/cni');
  const daemon = execa(join(SYSTEM_CNI_BIN, 'dhcp'), ['daemon'], { reject: false, stdin: 'ignore' });
  const deadline = Date.now() + 30_000;
  while (!existsSync(DHCP_SOCKET)) {
    if (daemon.exitCode !== null || Date.now() > deadline)
      throw new Error(`the CNI dhcp daemon did not listen on ${DHCP_SOCKET}: ${(await daemon).stderr}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    async stop() {
      daemon.kill('SIGTERM');
      await daemon;
      rmSync(DHCP_SOCKET, { force: true });
      if (!hadDir) rmdirSync('/run/cni');
    },
  };
}

/** ping every 0.2 s until stop(); then how many were sent and answered (the last may still be on its way). */
function pingThroughout(ip: string): { stop(): Promise<{ sent: number; answered: number }> } {
  const p: ResultPromise = execa('ping', ['-n', '-i', '0.2', ip], { reject: false, stdin: 'ignore' });
  return {
    async stop() {
      p.kill('SIGINT');
      const r = await p;
      const m = /(\d+) packets transmitted, (\d+) received/.exec(String(r.stdout));
      if (!m) throw new Error(`ping printed no statistics: ${String(r.stdout)} ${String(r.stderr)}`);
      return { sent: Number(m[1]), answered: Number(m[2]) };
    },
  };
}

/** The qemu of a domain: the one process whose argv names it (vmwrapper exec'd qemu in its place, same PID). */
function qemuOf(domain: string): number {
  const pids = processesMentioning(domain).filter((pid) =>
    readFileSync(`/proc/${pid}/comm`, 'utf8').startsWith('qemu'),
  );
  if (pids.length !== 1) throw new Error(`expected one qemu for ${domain}, found ${JSON.stringify(pids)}`);
  return pids[0]!;
}

describe('deploy/ under podman kube play', () => {
  let images: string[] = [];
  let guest: GuestImages;
  let lan: DhcpLan | undefined;
  let dhcpDaemon: { stop(): Promise<void> } | undefined;
  let dir: string | undefined;
  let kubeFile: string | undefined;
  let podName = '';
  let domain: string | undefined;
  let podKey: string | undefined;
  // the VMs' cgroup of this test (VMPOD_VM_CGROUP through the vmwrapper ConfigMap), in every hierarchy of the host
  const vmCgroup = `vmpod-kp-${randomBytes(3).toString('hex')}`;
  const paths: Record<string, string> = {};
  const socket = (): string => join(paths['/var/lib/virtlet'] as string, 'tapfdserver.sock');
  const tapctl = (args: string[], timeoutMs = 90_000): Promise<string> =>
    run([process.execPath, BIN.tapctl, '--socket', socket(), ...args], { timeoutMs });
  const virsh = (args: string[]): Promise<string> =>
    podman(['exec', `${podName}-libvirt`, 'virsh', '-c', 'qemu:///system', ...args], 60_000);
  const cgroupRoots = (): string[] =>
    cgroupMounts(readFileSync('/proc/self/mountinfo', 'utf8'))
      .filter((m) => m.root === '/')
      .map((m) => m.mountPoint);

  beforeAll(async () => {
    // both images, as an operator builds them (the engine's layer cache makes a second build quick)
    const r = await execa('bash', [join(REPO, 'scripts/images.sh')], {
      cwd: REPO,
      timeout: BUILD_TIMEOUT_MS,
      reject: false,
      stdin: 'ignore',
    });
    if (r.exitCode !== 0)
      throw new Error(`scripts/images.sh: exit ${r.exitCode}\n${r.stderr.split('\n').slice(-30).join('\n')}`);
    images = r.stdout.trim().split('\n');
    guest = await ensureGuest();
    dir = mkdtempSync(join(tmpdir(), 'vmpod-kp-'));
    for (const [node, mine] of [
      ['/var/lib/virtlet', 'virtlet'],
      ['/var/lib/cni', 'cni'],
      ['/var/lib/vmpod-node', 'state'],
      ['/run/xtables.lock', 'xtables.lock'],
      ['/var/run/libvirt', 'libvirt-run'],
      ['/var/lib/libvirt', 'libvirt-lib'],
      ['/var/log/libvirt', 'libvirt-log'],
      ['/etc/libvirt/qemu', 'libvirt-qemu'],
      ['/var/log/virtlet/vms', 'vms-log'],
      ['/run/flannel', 'flannel'],
      ['/run/multus', 'multus'],
      ['/var/run/calico', 'calico-run'],
      ['/var/run/cilium', 'cilium'],
      ['/var/lib/calico', 'calico-lib'],
      ['/var/lib/kubelet/pod-resources', 'pod-resources'],
      ['/etc/cdi', 'cdi-etc'],
      ['/var/run/cdi', 'cdi-run'],
      ['/etc/cni/net.d', 'net.d'],
    ] as const) {
      paths[node] = join(dir, mine);
    }
    paths['/opt/cni/bin'] = SYSTEM_CNI_BIN;
    // the pod network: bridge + the dhcp IPAM plugin, whose daemon (on the host) asks the LAN's DHCP server
    lan = await startDhcpLan(dir);
    dhcpDaemon = await startDhcpDaemon();
    mkdirSync(paths['/etc/cni/net.d'] as string);
    writeFileSync(
      join(paths['/etc/cni/net.d'] as string, '10-dhcp.conflist'),
      JSON.stringify({
        cniVersion: '1.0.0',
        name: `vmpkp-dhcp-${randomBytes(3).toString('hex')}`,
        plugins: [{ type: 'bridge', bridge: lan.bridge, mtu: MTU, ipam: { type: 'dhcp' } }],
      }),
    );
    // the guest's kernel and initrd where the libvirt container sees them
    mkdirSync(join(paths['/var/lib/libvirt'] as string, 'vmpod-test'), { recursive: true });
    copyFileSync(guest.kernel, join(paths['/var/lib/libvirt'] as string, 'vmpod-test', 'vmlinuz'));
    copyFileSync(guest.initrd, join(paths['/var/lib/libvirt'] as string, 'vmpod-test', 'initrd.gz'));
    await ensureSharedNetnsDir();
  }, BUILD_TIMEOUT_MS + GUEST_BUILD_TIMEOUT_MS);

  afterAll(async () => {
    // whatever the test did not get to (it tears everything down itself when it passes)
    if (domain !== undefined && podName !== '') {
      await virsh(['destroy', domain]).catch(() => undefined);
      await virsh(['undefine', domain]).catch(() => undefined);
    }
    if (podKey !== undefined) await tapctl(['release', podKey]).catch(() => undefined);
    if (kubeFile !== undefined) await execa('podman', ['kube', 'down', kubeFile], { reject: false, timeout: 120_000 });
    if (podKey !== undefined && (await listNetns()).includes(podKey)) await runStatus(['ip', 'netns', 'del', podKey]);
    await dhcpDaemon?.stop();
    await lan?.stop();
    for (const root of cgroupRoots()) {
      const top = join(root, vmCgroup);
      if (!existsSync(top)) continue;
      for (const leaf of readdirSync(top, { withFileTypes: true }))
        if (leaf.isDirectory()) rmdirSync(join(top, leaf.name));
      rmdirSync(top);
    }
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
  }, 300_000);

  it('runs the DaemonSet pod as shipped: probes pass on hostNetwork; a dhcp-IPAM pod boots through /vmwrapper; rollouts of both containers keep the VM; nothing is left', async () => {
    // the manifests as `kubectl apply -k deploy/` would send them, the images they name being the ones just built
    const docs: KubeDoc[] = await kustomize('deploy');
    // (images.sh builds the device plugin's image too; deploy/device-plugin/ has its own DaemonSet)
    expect(images).toEqual(expect.arrayContaining(Object.values(containerImages(docs))));
    // the tapmanager image stays under 200 MB (podman's Size, decimal)
    const tmImage = containerImages(docs)['tapmanager']!;
    expect(Number((await podman(['image', 'inspect', '--format', '{{.Size}}', tmImage])).trim())).toBeLessThan(
      200_000_000,
    );

    podName = `vmpod-kp-${randomBytes(3).toString('hex')}`;
    const httpPort = 20_000 + (randomBytes(2).readUInt16BE() % 20_000);
    const play = kubePlayDocs(docs, {
      podName,
      hostPaths: paths,
      sharedHostPaths: ['/dev', '/sys', '/sys/fs/cgroup', '/var/run/netns', '/run/cni'],
      // the listener as shipped (every address: kubelet probes the node's), on a port of its own: other tests on this
      // machine may listen on 9731; the container port `metrics` follows it
      configMapData: {
        'vmpod-node-config': { VMPOD_HTTP_LISTEN: `0.0.0.0:${httpPort}`, VMPOD_LOG_LEVEL: 'debug' },
        'vmpod-node-vmwrapper': { 'vmwrapper.env': `VMPOD_VM_CGROUP=/${vmCgroup}\n` },
      },
      ports: { 9731: httpPort },
      podSpec: { shareProcessNamespace: true },
    });
    expect(docs.find((d) => d.metadata?.name === 'vmpod-node-config')?.['data']).toMatchObject({
      VMPOD_HTTP_LISTEN: '0.0.0.0:9731',
    });
    kubeFile = join(dir as string, 'kube.yaml');
    writeFileSync(kubeFile, play.map((d) => stringify(d)).join('---\n'));
    await podman(['kube', 'play', kubeFile], 300_000);
    const podSpec = (play.find((d) => d.kind === 'Pod') as unknown as { spec: { containers: PodContainer[] } }).spec;
    const tm = podSpec.containers.find((c) => c.name === 'tapmanager')!;
    const lv = podSpec.containers.find((c) => c.name === 'libvirt')!;
    const node = await nodeAddress();

    // tapmanager listens on the socket in the host path, and answers the host's tapctl
    const waitReady = async (what: string): Promise<void> => {
      const deadline = Date.now() + 120_000;
      for (;;) {
        if ((await runStatus([process.execPath, BIN.tapctl, '--socket', socket(), 'status', '--ready'], 30_000)) === 0)
          return;
        if (Date.now() > deadline)
          throw new Error(
            `${what}: tapmanager not ready on ${socket()}:\n${await podman(['logs', `${podName}-tapmanager`]).catch((e: Error) => e.message)}`,
          );
        await new Promise((r) => setTimeout(r, 250));
      }
    };
    await waitReady('start');
    // the manifests' probes, as kubelet runs them on hostNetwork: the node's address, the port named `metrics`
    expect((await kubeletProbe(podName, tm, 'startupProbe', node)).trim()).toBe('ok');
    expect((await kubeletProbe(podName, tm, 'livenessProbe', node)).trim()).toBe('ok');
    expect(await kubeletProbe(podName, tm, 'readinessProbe', node)).toMatch(/^ready: /);
    expect(await fetchFromHost(`http://${node}:${httpPort}/readyz`)).toMatch(/^ready/);
    const version = (JSON.parse(readFileSync(join(REPO, 'package.json'), 'utf8')) as { version: string }).version;
    expect(await fetchFromHost(`http://${node}:${httpPort}/metrics`)).toContain(
      `vmpod_build_info{version="${version}"} 1`,
    );
    // its log (stderr) starts with the version
    const logs = await execa('podman', ['logs', `${podName}-tapmanager`], { timeout: 60_000 });
    expect(JSON.parse(logs.stderr.split('\n')[0]!)).toMatchObject({ msg: 'tapmanager starting', version });
    expect((await podman(['exec', `${podName}-tapmanager`, 'ebtables', '--version'])).trim()).toMatch(/nf_tables/);
    // libvirtd answers in its container: its probes (exec), and the liveness probe as kube play made it a healthcheck
    const lvDeadline = Date.now() + 120_000;
    while ((await runStatus(['podman', 'healthcheck', 'run', `${podName}-libvirt`], 60_000)) !== 0) {
      if (Date.now() > lvDeadline)
        throw new Error(
          `libvirtd did not answer:\n${await podman(['logs', `${podName}-libvirt`]).catch((e: Error) => e.message)}`,
        );
      await new Promise((r) => setTimeout(r, 500));
    }
    for (const kind of ['startupProbe', 'readinessProbe', 'livenessProbe'] as const)
      expect(await kubeletProbe(podName, lv, kind, node)).toMatch(/Compiled against library/);

    // a pod whose IP comes from the dhcp IPAM plugin: its daemon on the host, through the host's /run/cni
    const { key, desc } = newPod('vmpkp');
    podKey = key;
    const csn = JSON.parse(
      await tapctl([
        'add',
        key,
        '--pod-name',
        desc.podName,
        '--pod-namespace',
        desc.podNs,
        '--pod-id',
        desc.podId,
        '--dns',
        JSON.stringify(desc.DNS),
      ]),
    ) as ContainerSideNetwork;
    const a = podAddress(csn);
    const l = lan as DhcpLan;
    expect(a.ip.startsWith(`${l.prefix}.`)).toBe(true);
    expect(Number(a.ip.split('.')[3])).toBeGreaterThanOrEqual(100);
    // dnsmasq leased it, to the pod's MAC (the dhcp daemon asked from inside the pod netns)
    expect(readFileSync(l.leases, 'utf8')).toMatch(new RegExp(` ${a.mac} ${a.ip.replace(/\./g, '\\.')} `, 'i'));
    // the netns made in the container is a real netns on the host, with the pod's veth and tap in it (a veth:
    // tc-redirect joins them, no bridge)
    expect(await listNetns()).toContain(key);
    expect(readFileSync('/proc/self/mountinfo', 'utf8')).toMatch(new RegExp(` /run/netns/${key} [^\\n]* - nsfs `));
    const links = JSON.parse(await run(['ip', '-n', key, '-d', '-j', 'link', 'show'])) as {
      ifname: string;
      linkinfo?: { info_kind?: string };
    }[];
    const kinds = links.map((x) => x.linkinfo?.info_kind);
    expect(kinds).toEqual(expect.arrayContaining(['veth', 'tun']));
    expect(kinds).not.toContain('bridge');

    // a domain whose emulator is /vmwrapper, as Virtlet writes it: vmwrapper finds the socket at its default path, and
    // VMPOD_VM_CGROUP in the node's settings file (the ConfigMap), not in the domain's environment
    domain = uniqueName('vmpodkp');
    const serialInPod = `/var/log/vms/${domain}.log`;
    writeFileSync(
      join(paths['/var/lib/libvirt'] as string, 'vmpod-test', 'domain.xml'),
      domainXml({
        name: domain,
        emulator: '/vmwrapper',
        kernel: '/var/lib/libvirt/vmpod-test/vmlinuz',
        initrd: '/var/lib/libvirt/vmpod-test/initrd.gz',
        cmdline: GUEST_CMDLINE,
        env: { VIRTLET_EMULATOR: '/usr/bin/qemu-system-x86_64', VIRTLET_NET_KEY: key },
        memoryMiB: 256,
        serialLog: serialInPod,
      }),
    );
    await virsh(['define', '/var/lib/libvirt/vmpod-test/domain.xml']);
    const domainLog = (): string => {
      try {
        return readFileSync(join(paths['/var/log/libvirt'] as string, 'qemu', `${domain}.log`), 'utf8');
      } catch (e) {
        return `(no domain log: ${(e as Error).message})`;
      }
    };
    await virsh(['start', domain]).catch((e: Error) => {
      throw new Error(`virsh start: ${e.message}\ndomain log:\n${domainLog()}`);
    });
    const line = await waitForSerialLine(
      join(paths['/var/log/virtlet/vms'] as string, `${domain}.log`),
      LEASE_LINE_RE,
      90_000,
      { intervalMs: 50 },
    ).catch((e: Error) => {
      throw new Error(`${e.message}\ndomain log:\n${domainLog()}`);
    });
    const lease = parseLeaseLine(line);
    expect(`${lease.ip}/${lease.prefixLen}`).toBe(`${a.ip}/${a.prefixLen}`);
    expect(lease.mac).toBe(a.mac);
    expect(lease.routers).toEqual([l.server]);
    expect(lease.mtu).toBe(MTU);
    expect(lease.hostname).toBe(desc.podName);
    expect(lease.dns).toContain(POD_DNS.nameservers[0]);
    // vmwrapper execve'd qemu with the tap it fetched (its JSON line is in the domain log), in the VM's own cgroup
    expect(domainLog()).toMatch(/"msg":"exec emulator"/);
    const qemu = qemuOf(domain);
    const cgLines = readFileSync(`/proc/${qemu}/cgroup`, 'utf8').trim().split('\n');
    for (const cg of cgLines) expect(cg).toMatch(new RegExp(`^\\d+:[^:]*:/${vmCgroup}/vm-${domain}$`));
    await pingFromHost(a.ip);

    // ---- a rollout of the libvirt container: the guest keeps answering, libvirt finds its domain again ----
    const ping1 = pingThroughout(a.ip);
    await podman(['restart', '-t', '30', `${podName}-libvirt`], 180_000);
    const back = Date.now() + 120_000;
    for (;;) {
      const state = await virsh(['domstate', domain]).catch((e: Error) => e.message);
      if (state.trim() === 'running') break;
      if (Date.now() > back)
        throw new Error(
          `libvirt does not list ${domain} as running after its restart: ${state}\n${await podman(['logs', '--tail', '30', `${podName}-libvirt`]).catch(() => '')}`,
        );
      await new Promise((r) => setTimeout(r, 500));
    }
    expect((await virsh(['list', '--name'])).split('\n').map((x) => x.trim())).toContain(domain);
    await new Promise((r) => setTimeout(r, 2_000)); // a few more pings after libvirt is back
    const p1 = await ping1.stop();
    expect(p1.sent).toBeGreaterThan(5);
    expect(p1.answered, `ping across the libvirt restart: ${JSON.stringify(p1)}`).toBeGreaterThanOrEqual(p1.sent - 1);
    expect(qemuOf(domain)).toBe(qemu);

    // ---- a rollout of the tapmanager container: the VM does not notice, tapmanager restores the pod ----
    const ping2 = pingThroughout(a.ip);
    await podman(['restart', '-t', '60', `${podName}-tapmanager`], 180_000);
    await waitReady('after its restart');
    // the pod restored from its record (a get would say "the VM holds it": the running VM has the tap open)
    expect(JSON.parse(await tapctl(['list', '--json']))).toEqual([expect.objectContaining({ key, state: 'ready' })]);
    expect((await kubeletProbe(podName, tm, 'livenessProbe', node)).trim()).toBe('ok');
    await new Promise((r) => setTimeout(r, 2_000));
    const p2 = await ping2.stop();
    expect(p2.sent).toBeGreaterThan(5);
    expect(p2.answered, `ping across the tapmanager restart: ${JSON.stringify(p2)}`).toBeGreaterThanOrEqual(
      p2.sent - 1,
    );
    expect(qemuOf(domain)).toBe(qemu);
    expect((await virsh(['domstate', domain])).trim()).toBe('running');

    // ---- teardown, as an operator would, and the host keeps nothing of it ----
    await virsh(['destroy', domain]);
    await virsh(['undefine', domain]);
    expect(processesMentioning(domain)).toEqual([]);
    // the VM's leaf is empty once its qemu is gone (the next vmwrapper start sweeps old empty leaves)
    for (const root of cgroupRoots())
      expect(readFileSync(join(root, vmCgroup, `vm-${domain}`, 'cgroup.procs'), 'utf8')).toBe('');
    domain = undefined;
    await tapctl(['release', key]);
    podKey = undefined;
    expect(await listNetns()).not.toContain(key);

    // SIGTERM: tapmanager exits 0 (libvirtd under tini too), then the pod and its containers go. Each container on
    // its own first: a pod stop may end the infra container, which holds the shared PID namespace, before them
    await podman(['stop', '-t', '60', `${podName}-tapmanager`, `${podName}-libvirt`], 120_000);
    expect((await podman(['inspect', `${podName}-tapmanager`, '--format', '{{.State.ExitCode}}'])).trim()).toBe('0');
    expect((await podman(['inspect', `${podName}-libvirt`, '--format', '{{.State.ExitCode}}'])).trim()).toBe('0');
    await podman(['kube', 'down', kubeFile]);
    kubeFile = undefined;
    expect(await runStatus(['podman', 'pod', 'exists', podName])).toBe(1);
    expect((await podman(['ps', '-a', '--filter', `name=${podName}`, '--format', '{{.Names}}'])).trim()).toBe('');

    const veths = JSON.parse(await run(['ip', '-j', 'link', 'show', 'master', l.bridge])) as unknown[];
    expect(veths).toEqual([]);
    expect(filesUnder(join(paths['/var/lib/cni'] as string, 'results'))).toEqual([]);
    expect(readdirSync(paths['/var/lib/vmpod-node'] as string).filter((f) => f.includes(key))).toEqual([]);
  }, 900_000);
});
