// A pod netns made while idle (src/podnet/sparens.ts), against the real kernel and the real bridge + host-local
// plugins: an add after an idle spell runs in the netns made meanwhile, which already has lo up, the bridge, the tap
// and the DHCP filter; the pod is what an add without it makes; nothing of it is left after close.
import { describe, it, expect } from 'vitest';
import { existsSync, mkdtempSync, readdirSync, readlinkSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';
import { PodNetwork } from '../../src/podnet/index.js';
import { CniClient, loadConfList } from '../../src/cni/index.js';
import { silentLogger } from '../../src/log.js';
import { makeCniConf } from '../helpers/cniconf.js';

const NETNS_DIR = '/var/run/netns';
const desc = (key: string) => ({ podId: `uid-${key}`, podNs: 'default', podName: `vm-${key}`, DNS: null });

/** The inodes of the netns this process holds fds of (a spare is one; nothing else holds one while idle). */
function heldNetns(): number[] {
  const inos: number[] = [];
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      const m = /^net:\[(\d+)\]$/.exec(readlinkSync(`/proc/self/fd/${fd}`));
      if (m) inos.push(Number(m[1]));
    } catch {
      /* closed meanwhile */
    }
  }
  return inos;
}

async function until(what: string, ok: () => boolean, ms = 5000): Promise<void> {
  const end = Date.now() + ms;
  while (!ok()) {
    if (Date.now() > end) throw new Error(`not within ${ms} ms: ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

async function links(
  key: string,
): Promise<{ ifname: string; address: string; master?: string; operstate: string; flags: string[] }[]> {
  return JSON.parse((await execa('ip', ['-j', '-n', key, 'link', 'show'])).stdout);
}

describe('spare pod netns', () => {
  it('an add after an idle spell takes the netns made meanwhile, with its links; it works as any pod; close leaves nothing', async () => {
    const net = await makeCniConf();
    const stateDir = mkdtempSync(join(tmpdir(), 'vmpod-sparens-state-'));
    const keys = [1, 2].map(() => `vmpods-${randomBytes(4).toString('hex')}`);
    const pn = new PodNetwork({
      stateDir,
      cni: new CniClient({ binDirs: net.binDirs, cacheDir: net.cacheDir }),
      loadConfList: () => loadConfList(net.confDir),
      log: silentLogger(),
      spareNetns: 1,
    });
    const before = heldNetns();
    try {
      // none before the first add; the first add makes its own
      expect(heldNetns()).toEqual(before);
      await pn.add(keys[0]!, desc(keys[0]!));
      await pn.release(keys[0]!);
      // 100 ms without an add or release: one spare, held by an fd and mounted nowhere (its fd exists from the
      // start of its making: the add below must come once it is ready, or it makes its own)
      await until('a spare netns', () => pn.sparesReady === 1);
      expect(heldNetns().length).toBe(before.length + 1);
      const spare = heldNetns().find((i) => !before.includes(i))!;
      expect(readdirSync(NETNS_DIR).filter((n) => statSync(join(NETNS_DIR, n)).ino === spare)).toEqual([]);

      const st = await pn.add(keys[1]!, desc(keys[1]!));
      // the pod's netns is the spare, and the spare is taken
      expect(statSync(join(NETNS_DIR, keys[1]!)).ino).toBe(spare);
      expect(heldNetns()).toEqual(before);
      // as any IPv4 pod of a veth: the tap up and joined to the veth by tc-redirect, no bridge; the VM's MAC is the
      // veth's own, which it keeps
      const ls = await links(keys[1]!);
      const by = (n: string) => ls.find((l) => l.ifname === n);
      expect(ls.map((l) => l.ifname).sort()).toEqual(['lo', 'tap0', 'virtlet-eth0']);
      expect(by('tap0')?.flags).toContain('UP');
      expect(by('virtlet-eth0')?.master).toBeUndefined();
      expect(by('lo')?.flags).toContain('UP');
      expect(st.interfaces.map((i) => [i.binding, i.tapName, i.vmMac])).toEqual([
        ['tc-redirect', 'tap0', by('virtlet-eth0')?.address],
      ]);
      const filters = (
        await execa('ip', ['netns', 'exec', keys[1]!, 'tc', 'filter', 'show', 'dev', 'virtlet-eth0', 'ingress'])
      ).stdout;
      expect(filters).toMatch(/mirred \(Egress Redirect to device tap0\)/);

      await pn.release(keys[1]!);
      expect(existsSync(join(NETNS_DIR, keys[1]!))).toBe(false);
      expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
      // made again after the release, and gone with close
      await until('the spare made again', () => pn.sparesReady === 1);
      expect(heldNetns().length).toBe(before.length + 1);
      pn.closeAll();
      expect(heldNetns()).toEqual(before);
    } finally {
      pn.closeAll();
      for (const k of keys)
        if (existsSync(join(NETNS_DIR, k))) await execa('ip', ['netns', 'del', k], { reject: false });
      await net.cleanup();
      rmSync(stateDir, { recursive: true, force: true });
    }
  }, 60_000);
});
