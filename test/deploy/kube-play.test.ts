// deploy/'s DaemonSet pod, run for real with `podman kube play` from the images scripts/images.sh builds: tapmanager
// comes up in its container; the host's tapctl, through the socket on a host path, adds a pod whose netns appears on
// the host; the libvirt container boots the tiny guest through /vmwrapper, and the guest takes the pod's IP by DHCP.
// Then the VM, the pod network and the pod go, and nothing of theirs is left on the host.
// Host paths: the node's CNI config, libvirt and state dirs become private dirs (test/helpers/kubeplay.ts); /dev,
// /sys and /var/run/netns are the machine's own on purpose (the pod netns must appear there).
import { copyFileSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';
import { stringify } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ContainerSideNetwork } from '../../src/protocol/payloads.js';
import { makeCniConf, SYSTEM_CNI_BIN, type CniTestNet } from '../helpers/cniconf.js';
import { BIN, REPO } from '../helpers/daemon.js';
import { ensureGuest, GUEST_BUILD_TIMEOUT_MS, GUEST_CMDLINE, LEASE_LINE_RE, parseLeaseLine, waitForSerialLine, type GuestImages } from '../helpers/guest.js';
import { domainXml } from '../helpers/libvirt.js';
import { containerImages, kubePlayDocs, kustomize, type KubeDoc } from '../helpers/kubeplay.js';
import { listNetns, run, runStatus, uniqueName } from '../helpers/netns.js';
import { POD_DNS, newPod, pingFromHost, podAddress } from '../helpers/pairvm.js';

const MTU = 1400;
/** A cold build (debootstrap, npm ci, apt in three stages) takes minutes on a busy machine; a cached one seconds. */
const BUILD_TIMEOUT_MS = 1_800_000;
const SOCKET_IN_POD = '/var/lib/virtlet/tapfdserver.sock';

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

describe('deploy/ under podman kube play', () => {
  let images: string[] = [];
  let guest: GuestImages;
  let net: CniTestNet | undefined;
  let dir: string | undefined;
  let kubeFile: string | undefined;
  let podName = '';
  let domain: string | undefined;
  let podKey: string | undefined;
  const paths: Record<string, string> = {};
  const socket = (): string => join(paths['/var/lib/virtlet'] as string, 'tapfdserver.sock');
  const tapctl = (args: string[], timeoutMs = 90_000): Promise<string> =>
    run([process.execPath, BIN.tapctl, '--socket', socket(), ...args], { timeoutMs });
  const virsh = (args: string[]): Promise<string> => podman(['exec', `${podName}-libvirt`, 'virsh', '-c', 'qemu:///system', ...args], 60_000);

  beforeAll(async () => {
    // both images, as an operator builds them (the engine's layer cache makes a second build quick)
    const r = await execa('bash', [join(REPO, 'scripts/images.sh')], { cwd: REPO, timeout: BUILD_TIMEOUT_MS, reject: false, stdin: 'ignore' });
    if (r.exitCode !== 0) throw new Error(`scripts/images.sh: exit ${r.exitCode}\n${r.stderr.split('\n').slice(-30).join('\n')}`);
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
    ] as const) {
      paths[node] = join(dir, mine);
    }
    // host-local runs in the tapmanager container: its dataDir is the container's /var/lib/cni/networks
    net = await makeCniConf({ mtu: MTU, ipamDataDir: { conf: '/var/lib/cni/networks', host: join(dir, 'cni', 'networks') } });
    paths['/etc/cni/net.d'] = net.confDir;
    paths['/opt/cni/bin'] = SYSTEM_CNI_BIN;
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
    await net?.cleanup();
    if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
  }, 300_000);

  it('runs the DaemonSet pod: host tapctl adds a pod, the guest boots through /vmwrapper and takes its IP; nothing is left', async () => {
    // the manifests as `kubectl apply -k deploy/` would send them, the images they name being the ones just built
    const docs: KubeDoc[] = await kustomize('deploy');
    expect(Object.values(containerImages(docs)).sort()).toEqual([...images].sort());

    podName = `vmpod-kp-${randomBytes(3).toString('hex')}`;
    const httpPort = 20_000 + (randomBytes(2).readUInt16BE() % 20_000);
    const play = kubePlayDocs(docs, {
      podName,
      hostPaths: paths,
      sharedHostPaths: ['/dev', '/sys', '/sys/fs/cgroup', '/var/run/netns'],
      // loopback on a port of its own: other tests on this machine may listen on the default port
      configMapData: { 'vmpod-node-config': { VMPOD_HTTP_LISTEN: `127.0.0.1:${httpPort}`, VMPOD_LOG_LEVEL: 'debug' } },
    });
    kubeFile = join(dir as string, 'kube.yaml');
    writeFileSync(kubeFile, play.map((d) => stringify(d)).join('---\n'));
    await podman(['kube', 'play', kubeFile], 300_000);

    // tapmanager listens on the socket in the host path, and answers the host's tapctl
    const deadline = Date.now() + 60_000;
    for (;;) {
      if ((await runStatus([process.execPath, BIN.tapctl, '--socket', socket(), 'status'], 30_000)) === 0) break;
      if (Date.now() > deadline) throw new Error(`tapmanager did not answer on ${socket()}:\n${await podman(['logs', `${podName}-tapmanager`]).catch((e: Error) => e.message)}`);
      await new Promise((r) => setTimeout(r, 250));
    }
    // inside the pod too, as the readiness probe runs it (the socket path comes from the ConfigMap)
    await podman(['exec', `${podName}-tapmanager`, 'tapctl', 'status']);
    expect((await podman(['exec', `${podName}-tapmanager`, 'ebtables', '--version'])).trim()).toMatch(/nf_tables/);

    const { key, desc } = newPod('vmpkp');
    podKey = key;
    const csn = JSON.parse(
      await tapctl(['add', key, '--pod-name', desc.podName, '--pod-namespace', desc.podNs, '--pod-id', desc.podId, '--dns', JSON.stringify(desc.DNS)]),
    ) as ContainerSideNetwork;
    const a = podAddress(csn);
    // the netns made in the container is a real netns on the host, with the pod's bridge and tap in it
    expect(await listNetns()).toContain(key);
    expect(readFileSync('/proc/self/mountinfo', 'utf8')).toMatch(new RegExp(` /run/netns/${key} [^\\n]* - nsfs `));
    const links = (JSON.parse(await run(['ip', '-n', key, '-d', '-j', 'link', 'show'])) as { ifname: string; linkinfo?: { info_kind?: string } }[]);
    expect(links.map((l) => l.linkinfo?.info_kind)).toEqual(expect.arrayContaining(['bridge', 'tun']));

    // libvirtd answers in its container (the liveness probe's command, as kube play made it a healthcheck)
    const lvDeadline = Date.now() + 120_000;
    while ((await runStatus(['podman', 'healthcheck', 'run', `${podName}-libvirt`], 60_000)) !== 0) {
      if (Date.now() > lvDeadline) throw new Error(`libvirtd did not answer:\n${await podman(['logs', `${podName}-libvirt`]).catch((e: Error) => e.message)}`);
      await new Promise((r) => setTimeout(r, 500));
    }

    // a domain whose emulator is /vmwrapper, as Virtlet writes it: vmwrapper finds the socket at its default path
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
    const line = await waitForSerialLine(join(paths['/var/log/virtlet/vms'] as string, `${domain}.log`), LEASE_LINE_RE, 90_000, { intervalMs: 50 }).catch(
      (e: Error) => {
        throw new Error(`${e.message}\ndomain log:\n${domainLog()}`);
      },
    );
    const lease = parseLeaseLine(line);
    expect(`${lease.ip}/${lease.prefixLen}`).toBe(`${a.ip}/${a.prefixLen}`);
    expect(lease.mac).toBe(a.mac);
    expect(lease.routers).toEqual([(net as CniTestNet).gateway]);
    expect(lease.mtu).toBe(MTU);
    expect(lease.hostname).toBe(desc.podName);
    expect(lease.dns).toContain(POD_DNS.nameservers[0]);
    // vmwrapper execve'd qemu with the tap it fetched (its JSON line is in the domain log)
    expect(domainLog()).toMatch(/"msg":"exec emulator"/);
    expect(processesMentioning(domain).length).toBeGreaterThan(0);
    await pingFromHost(a.ip);

    // ---- teardown, as an operator would, and the host keeps nothing of it ----
    await virsh(['destroy', domain]);
    await virsh(['undefine', domain]);
    expect(processesMentioning(domain)).toEqual([]);
    domain = undefined;
    await tapctl(['release', key]);
    podKey = undefined;
    expect(await listNetns()).not.toContain(key);

    // SIGTERM: tapmanager exits 0 (libvirtd under tini too), then the pod and its containers go
    await podman(['pod', 'stop', '-t', '60', podName], 120_000);
    expect((await podman(['inspect', `${podName}-tapmanager`, '--format', '{{.State.ExitCode}}'])).trim()).toBe('0');
    expect((await podman(['inspect', `${podName}-libvirt`, '--format', '{{.State.ExitCode}}'])).trim()).toBe('0');
    await podman(['kube', 'down', kubeFile]);
    kubeFile = undefined;
    expect(await runStatus(['podman', 'pod', 'exists', podName])).toBe(1);
    expect((await podman(['ps', '-a', '--filter', `name=${podName}`, '--format', '{{.Names}}'])).trim()).toBe('');

    const c = net as CniTestNet;
    const left = await c.leftovers();
    expect(left.veths).toEqual([]);
    expect(left.allocations).toEqual([]);
    expect(filesUnder(join(paths['/var/lib/cni'] as string, 'results'))).toEqual([]);
    expect(readdirSync(paths['/var/lib/vmpod-node'] as string).filter((f) => f.includes(key))).toEqual([]);
    // the CNI bridge is the node's (the bridge plugin never deletes it): the test's network removes it
    await c.cleanup();
    net = undefined;
    expect((await runStatus(['ip', 'link', 'show', 'dev', c.bridge]))).not.toBe(0);
    rmSync(dir as string, { recursive: true, force: true });
    dir = undefined;
  }, 600_000);
});
