// The pair end to end with a real VM: tapmanager builds the pod network (bridge + host-local, MTU 1400), qemu is started
// THROUGH vmwrapper (which fetches the tap fd and execve's qemu in place), and the guest receives exactly the CNI
// result over DHCP, answers ping and HTTP from the host, boots again on the same pod, stays reachable across a
// tapmanager restart (and boots again through the restarted daemon), and release leaves nothing behind.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { FdClient } from '../../src/client/fdclient.js';
import { makeCniConf, type CniTestNet } from '../helpers/cniconf.js';
import { startDaemon, type Daemon } from '../helpers/daemon.js';
import { ensureGuest, GUEST_BUILD_TIMEOUT_MS, QEMU_BINARY, type GuestImages } from '../helpers/guest.js';
import {
  NOTHING_LEFT,
  POD_DNS,
  bootPairVm,
  endPairDaemon,
  stopVmsAndRelease,
  fetchFromHost,
  newPod,
  pingFromHost,
  podAddress,
  podLeftovers,
  processArgv,
  processExe,
  type PairVm,
  type PodAddress,
} from '../helpers/pairvm.js';
import type { GuestLease } from '../helpers/guest.js';

const MTU = 1400;

describe('tapmanager + vmwrapper + qemu', () => {
  let guest: GuestImages;
  let net: CniTestNet;
  let d: Daemon | undefined;
  let dir: string;
  /** VMs and pods of the running test, stopped and released in afterEach if the test did not get there */
  const vms: PairVm[] = [];
  const pods = new Set<string>();

  const client = (): FdClient => new FdClient((d as Daemon).socket, { timeoutMs: 60_000 });

  beforeAll(async () => {
    guest = await ensureGuest();
    net = await makeCniConf({ mtu: MTU });
    dir = mkdtempSync(join(tmpdir(), 'vmpod-pair-'));
    d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir });
  }, GUEST_BUILD_TIMEOUT_MS);

  afterEach(async () => {
    await stopVmsAndRelease(vms, pods, client, async () => {
      // a test that failed between stopping tapmanager and starting it again: bring it back to release its pods
      if (d !== undefined && !d.alive())
        d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, reuse: d });
    });
  }, 60_000);

  afterAll(async () => {
    const { code, stateLeft } = await endPairDaemon(d, net, dir);
    expect(code).toBe(0);
    expect(stateLeft).toEqual([]);
  }, 60_000);

  function expectLease(lease: GuestLease, a: PodAddress, podName: string): void {
    expect(lease.event).toBe('VMPOD-LEASE');
    expect(`${lease.ip}/${lease.prefixLen}`).toBe(`${a.ip}/${a.prefixLen}`);
    expect(lease.mac).toBe(a.mac);
    expect(lease.routers).toEqual([net.gateway]);
    expect(lease.mtu).toBe(MTU);
    expect(lease.hostname).toBe(podName);
    expect(lease.dns).toContain(POD_DNS.nameservers[0]);
    expect(lease.iface).toBe('eth0');
  }

  async function boot(key: string, name: string): Promise<PairVm> {
    const vm = await bootPairVm({ socket: (d as Daemon).socket, key, guest, dir, name, timeoutMs: 120_000 });
    vms.push(vm);
    return vm;
  }

  async function stopVm(vm: PairVm): Promise<void> {
    await vm.stop();
    vms.splice(vms.indexOf(vm), 1);
    expect(vm.alive()).toBe(false);
  }

  it('boots a VM on the pod network through vmwrapper, twice, and release leaves nothing', async () => {
    const { key, desc } = newPod();
    pods.add(key);
    const csn = client().add(key, desc);
    const a = podAddress(csn);
    expect(a.gateway).toBe(net.gateway);
    expect(a.mtu).toBe(MTU);

    const vm = await boot(key, 'first.serial.log');
    expectLease(vm.lease, a, desc.podName);

    // vmwrapper execve'd qemu in place: the PID spawned for vmwrapper runs qemu now, with the tap vmwrapper added.
    expect(processExe(vm.pid)).toBe(QEMU_BINARY);
    const argv = processArgv(vm.pid);
    expect(argv.join(' ')).toMatch(
      /-netdev tap,id=vmpodnet0,fd=\d+,vhost=(on|off) -device virtio-net-pci,netdev=vmpodnet0,id=vmpodnic0,mac=/,
    );
    expect(argv.at(-1)).toBe(`virtio-net-pci,netdev=vmpodnet0,id=vmpodnic0,mac=${a.mac},host_mtu=${a.mtu}`);
    expect(vm.output()).toMatch(/"msg":"exec emulator"/);

    await pingFromHost(a.ip);
    const page = await fetchFromHost(`http://${a.ip}/`);
    expect(page).toContain(`hostname=${desc.podName}`);
    const status = await fetchFromHost(`http://${a.ip}/cgi-bin/status`);
    // the guest's own view (one key=value a line; the final newline is stripped): ONE udhcpc, the lease applied
    const fields = new Map(status.split('\n').map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
    expect(Object.fromEntries(fields)).toEqual({
      hostname: desc.podName,
      udhcpc: '1',
      addr: `${a.ip}/${a.prefixLen}`,
      mtu: String(MTU),
      default: net.gateway,
      // no -smp: one vCPU, one queue pair
      queues: 'rx-0,tx-0',
    });

    // Stop the VM (qemu by its PID); the pod keeps its tap, and a second start gets it again from get.
    await stopVm(vm);
    const again = await boot(key, 'second.serial.log');
    expect(again.pid).not.toBe(vm.pid);
    expectLease(again.lease, a, desc.podName);
    await pingFromHost(a.ip);
    await stopVm(again);

    client().release(key);
    pods.delete(key);
    expect(await podLeftovers(net, (d as Daemon).stateDir, key)).toEqual(NOTHING_LEFT);
    expect(await net.bridgeExists()).toBe(true); // the CNI bridge is the node's, shared by pods: it stays
  }, 400_000);

  it('keeps a running VM reachable across a tapmanager restart, then releases it', async () => {
    const { key, desc } = newPod();
    pods.add(key);
    const a = podAddress(client().add(key, desc));
    const vm = await boot(key, 'restart.serial.log');
    expectLease(vm.lease, a, desc.podName);
    await pingFromHost(a.ip);

    const first = d as Daemon;
    expect(await first.stop()).toBe(0);
    // tapmanager is down: the VM holds its own tap fd, the pod network stays.
    expect(vm.alive()).toBe(true);
    await pingFromHost(a.ip);

    d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, reuse: first });
    expect(d.pid).not.toBe(first.pid);
    const listed = client().list() as { key: string; interfaces: { ip?: string; mac: string }[] }[];
    expect(listed.find((p) => p.key === key)?.interfaces[0]).toMatchObject({ mac: a.mac });
    await pingFromHost(a.ip);
    expect(await fetchFromHost(`http://${a.ip}/`)).toContain(`hostname=${desc.podName}`);

    // The restarted daemon re-opened the tap from its record and serves DHCP again: a new start works as before.
    await stopVm(vm);
    const after = await boot(key, 'after-restart.serial.log');
    expectLease(after.lease, a, desc.podName);
    await pingFromHost(a.ip);
    await stopVm(after);

    client().release(key);
    pods.delete(key);
    expect(await podLeftovers(net, d.stateDir, key)).toEqual(NOTHING_LEFT);
  }, 400_000);
});
