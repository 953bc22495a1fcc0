// The real tiny guest on a macvlan pod: the macvlan cannot give its MAC away, so tapmanager joins it to the tap with
// the tc-redirect binding; qemu, started through vmwrapper, boots the guest with the macvlan's MAC, which gets the CNI
// IP from tapmanager's DHCP on the tap, and answers ping and HTTP from the LAN the macvlan's parent is on. Release
// leaves nothing: no netns, no macvlan, no IPAM allocation, no record.
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FdClient } from '../../src/client/fdclient.js';
import { removeDir, startDaemon, type Daemon } from '../helpers/daemon.js';
import { ensureGuest, GUEST_BUILD_TIMEOUT_MS, type GuestImages } from '../helpers/guest.js';
import { bootPairVm, newPod, podAddress, type PairVm } from '../helpers/pairvm.js';
import { listNetns } from '../helpers/netns.js';
import { makeLan, ping, writeConfList, type Lan } from '../helpers/shapes.js';

describe('the tiny guest on a macvlan pod (tc-redirect)', () => {
  let guest: GuestImages;
  let lan: Lan;
  let d: Daemon;
  let root = '';
  let vm: PairVm | undefined;
  let key = '';

  beforeAll(async () => {
    guest = await ensureGuest();
    root = mkdtempSync(join(tmpdir(), 'vmpod-macvlan-'));
    lan = await makeLan('q');
    writeConfList(join(root, 'net.d'), `vmmv-${randomBytes(3).toString('hex')}`, [
      {
        type: 'macvlan',
        master: lan.parent,
        mode: 'bridge',
        ipam: {
          type: 'host-local',
          dataDir: join(root, 'ipam'),
          ranges: [[{ subnet: lan.subnet, gateway: lan.gateway }]],
          routes: [{ dst: '0.0.0.0/0' }],
        },
      },
    ]);
    d = await startDaemon({ confDir: join(root, 'net.d'), binDirs: ['/usr/lib/cni'], cacheDir: join(root, 'cache') });
  }, GUEST_BUILD_TIMEOUT_MS);

  afterAll(async () => {
    await vm?.stop();
    if (key !== '' && (await listNetns()).includes(key)) new FdClient(d.socket, { timeoutMs: 60_000 }).release(key);
    const code = await d?.stop();
    await lan?.cleanup();
    if (d) removeDir(d.dir);
    rmSync(root, { recursive: true, force: true });
    expect(code).toBe(0);
  }, 60_000);

  it('boots with the macvlan MAC, gets the CNI IP from tapmanager, and the LAN reaches it', async () => {
    const client = new FdClient(d.socket, { timeoutMs: 60_000 });
    const pod = newPod('vmpmv');
    key = pod.key;
    const a = podAddress(client.add(key, pod.desc));
    const mvMac = JSON.parse((await execa('ip', ['-n', key, '-j', 'link', 'show', 'dev', 'virtlet-eth0'])).stdout)[0]
      .address as string;
    expect(a.mac).toBe(mvMac);

    vm = await bootPairVm({ socket: d.socket, key, guest, dir: root, name: 'macvlan.serial.log', timeoutMs: 120_000 });
    expect(`${vm.lease.ip}/${vm.lease.prefixLen}`).toBe(`${a.ip}/${a.prefixLen}`);
    expect(vm.lease.mac).toBe(mvMac);
    expect(vm.lease.routers).toEqual([lan.gateway]);
    expect(await ping(lan.ns, a.ip)).toBe(0);
    const page = await execa(
      'ip',
      ['netns', 'exec', lan.ns, 'curl', '-sS', '--fail', '--max-time', '5', `http://${a.ip}/`],
      { timeout: 10_000 },
    );
    expect(page.stdout).toContain(`hostname=${pod.desc.podName}`);

    await vm.stop();
    vm = undefined;
    client.release(key);
    expect(await listNetns()).not.toContain(key);
    const ipam = readdirSync(join(root, 'ipam'), { recursive: true })
      .map(String)
      .filter((f) => /\d+\.\d+\.\d+\.\d+$/.test(f));
    expect(ipam).toEqual([]);
    expect(existsSync(d.stateDir) ? readdirSync(d.stateDir).filter((f) => f.includes(key)) : []).toEqual([]);
    const macvlans = JSON.parse((await execa('ip', ['-j', '-d', 'link', 'show'])).stdout).filter(
      (l: { link?: string }) => l.link === lan.parent,
    );
    expect(macvlans).toEqual([]);
  }, 300_000);
});
