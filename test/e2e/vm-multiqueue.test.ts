// Multiqueue end to end with a real VM: a tiny guest with -smp 4 under qemu (TCG here) boots THROUGH vmwrapper, which
// asks tapmanager for 4 queues of the pod's multi-queue tap; qemu holds 4 fds of the tap, the guest's virtio-net runs 4
// queue pairs, gets its lease and answers ping. After the VM exits, a new start with 2 queues (VMPOD_NET_QUEUES=2)
// works, and release leaves nothing behind.
import { mkdtempSync, readFileSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { FdClient } from '../../src/client/fdclient.js';
import { makeCniConf, type CniTestNet } from '../helpers/cniconf.js';
import { startDaemon, type Daemon } from '../helpers/daemon.js';
import { ensureGuest, GUEST_BUILD_TIMEOUT_MS, type GuestImages } from '../helpers/guest.js';
import { run } from '../helpers/netns.js';
import {
  NOTHING_LEFT,
  bootPairVm,
  endPairDaemon,
  fetchFromHost,
  newPod,
  pingFromHost,
  podAddress,
  podLeftovers,
  processArgv,
  stopVmsAndRelease,
  type PairVm,
} from '../helpers/pairvm.js';

describe('multiqueue tap + vhost fallback, a real guest with 4 vCPUs', () => {
  let guest: GuestImages;
  let net: CniTestNet;
  let d: Daemon | undefined;
  let dir: string;
  const vms: PairVm[] = [];
  const pods = new Set<string>();

  const client = (): FdClient => new FdClient((d as Daemon).socket, { timeoutMs: 60_000 });

  beforeAll(async () => {
    guest = await ensureGuest();
    net = await makeCniConf();
    dir = mkdtempSync(join(tmpdir(), 'vmpod-mq-'));
    d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir });
  }, GUEST_BUILD_TIMEOUT_MS);

  afterEach(async () => {
    await stopVmsAndRelease(vms, pods, client);
  }, 60_000);

  afterAll(async () => {
    const { code, stateLeft } = await endPairDaemon(d, net, dir);
    expect(code).toBe(0);
    expect(stateLeft).toEqual([]);
  }, 60_000);

  /** The fds a process holds on a tap, by the tap's name in fdinfo ("iff:\ttap0"). */
  function tapFds(pid: number): { fd: number; iff: string }[] {
    return readdirSync(`/proc/${pid}/fdinfo`)
      .map((fd) => ({
        fd: Number(fd),
        iff: /^iff:[ \t]*(\S+)/m.exec(readFileSync(`/proc/${pid}/fdinfo/${fd}`, 'utf8'))?.[1],
      }))
      .filter((x): x is { fd: number; iff: string } => x.iff !== undefined);
  }

  /** The guest's /cgi-bin/status, one key=value a line. */
  async function guestStatus(ip: string): Promise<Record<string, string>> {
    const text = await fetchFromHost(`http://${ip}/cgi-bin/status`);
    return Object.fromEntries(text.split('\n').map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
  }

  async function boot(key: string, name: string, env: Record<string, string> = {}): Promise<PairVm> {
    const vm = await bootPairVm({
      socket: (d as Daemon).socket,
      key,
      guest,
      dir,
      name,
      timeoutMs: 240_000,
      qemuArgs: ['-smp', '4'],
      env,
    });
    vms.push(vm);
    return vm;
  }

  it('boots with 4 queue pairs on a multi-queue tap, and again with 2 after it exits', async () => {
    const { key, desc } = newPod('vmpmq');
    pods.add(key);
    const a = podAddress(client().add(key, desc));

    const vm = await boot(key, 'mq4.serial.log');
    expect(vm.lease.ip).toBe(a.ip);
    // the tap: IFF_MULTI_QUEUE (0x100) in tun_flags
    expect(
      Number((await run(['ip', 'netns', 'exec', key, 'cat', '/sys/class/net/tap0/tun_flags'])).trim()) & 0x100,
    ).toBe(0x100);
    // qemu (vmwrapper's PID after the execve) holds 4 fds of it, all named in -netdev fds=
    const held = tapFds(vm.pid);
    expect(held.map((t) => t.iff)).toEqual(['tap0', 'tap0', 'tap0', 'tap0']);
    const argv = processArgv(vm.pid).join(' ');
    const fds = /-netdev tap,id=vmpodnet0,fds=(\d+):(\d+):(\d+):(\d+),vhost=(on|off) /.exec(argv);
    expect(fds).not.toBeNull();
    expect(
      fds!
        .slice(1, 5)
        .map(Number)
        .sort((x, y) => x - y),
    ).toEqual(held.map((t) => t.fd).sort((x, y) => x - y));
    expect(argv).toContain(`mac=${a.mac},host_mtu=${a.mtu},mq=on,vectors=10`);
    // no vhost_net on this machine: vmwrapper fell back and said so in its line
    if (fds![5] === 'off')
      expect(vm.output()).toMatch(/"vhost":"off: cannot open \/dev\/vhost-net: E[A-Z]+; virtio-net runs in qemu"/);

    await pingFromHost(a.ip);
    // the offloads the guest's virtio-net negotiated, which qemu set on the tap (TUNSETOFFLOAD): nothing on the pod
    // side turned them off
    const k = await run(['ip', 'netns', 'exec', key, 'ethtool', '-k', 'tap0']);
    for (const f of ['tx-checksumming', 'tcp-segmentation-offload', 'generic-segmentation-offload', 'scatter-gather']) {
      expect(k).toMatch(new RegExp(`^${f}: on`, 'm'));
    }
    // the guest's virtio-net runs a queue pair per vCPU
    expect((await guestStatus(a.ip)).queues).toBe('rx-0,rx-1,rx-2,rx-3,tx-0,tx-1,tx-2,tx-3');

    await vm.stop();
    vms.splice(vms.indexOf(vm), 1);
    // its queues went with it: tapmanager's own is left
    const info = JSON.parse(await run(['ip', '-n', key, '-j', '-d', 'link', 'show', 'tap0'])) as {
      linkinfo: { info_data: { numqueues: number } };
    }[];
    expect(info[0]!.linkinfo.info_data.numqueues).toBe(1);

    const two = await boot(key, 'mq2.serial.log', { VMPOD_NET_QUEUES: '2' });
    expect(two.lease.ip).toBe(a.ip);
    expect(tapFds(two.pid)).toHaveLength(2);
    await pingFromHost(a.ip);
    expect((await guestStatus(a.ip)).queues).toBe('rx-0,rx-1,tx-0,tx-1');
    await two.stop();
    vms.splice(vms.indexOf(two), 1);

    client().release(key);
    pods.delete(key);
    expect(await podLeftovers(net, (d as Daemon).stateDir, key)).toEqual(NOTHING_LEFT);
  }, 600_000);
});
