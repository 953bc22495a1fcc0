// The CNI network shapes of test/integration/cni-shapes.test.ts: a LAN of our own (a netns holding the network's side of
// a veth pair, its address .1 of a unique /24; the other end in the host netns, the parent of macvlans or the NIC
// host-device moves), conflists of Debian's plugins written into one config dir, and a guest's DHCP lease taken with
// busybox udhcpc in a netns relayed to the pod's tap. Every name unique; cleanup() removes what it made.
import { chmodSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';
import { addNetns, delNetns, run } from './netns.js';
import { uniqueSubnet } from './cniconf.js';

/** A LAN netns with the network's end of a veth (`lanIf`, address `gateway`) and its host end `parent` (no address). */
export interface Lan {
  ns: string;
  parent: string;
  subnet: string;
  prefix: string;
  gateway: string;
  cleanup(): Promise<void>;
}

export async function makeLan(tag: string): Promise<Lan> {
  const id = randomBytes(3).toString('hex');
  const ns = `vmlan${tag}${id}`;
  const parent = `vml${tag}${id}`;
  const { prefix } = await uniqueSubnet();
  await addNetns(ns);
  try {
    await run(['ip', 'link', 'add', parent, 'type', 'veth', 'peer', 'name', 'lan0', 'netns', ns]);
    await run(['ip', '-n', ns, 'addr', 'add', `${prefix}.1/24`, 'dev', 'lan0']);
    await run(['ip', '-n', ns, 'link', 'set', 'dev', 'lan0', 'up']);
    await run(['ip', '-n', ns, 'link', 'set', 'dev', 'lo', 'up']);
    await run(['ip', 'link', 'set', 'dev', parent, 'up']);
  } catch (e) {
    await execa('ip', ['link', 'del', parent], { reject: false });
    await delNetns(ns);
    throw e;
  }
  return {
    ns,
    parent,
    subnet: `${prefix}.0/24`,
    prefix,
    gateway: `${prefix}.1`,
    async cleanup() {
      await execa('ip', ['link', 'del', parent], { reject: false, timeout: 10_000 });
      await delNetns(ns);
    },
  };
}

/** Writes the conflist the daemon's next add reads (the only file of the dir). */
export function writeConfList(confDir: string, name: string, plugins: Record<string, unknown>[]): void {
  mkdirSync(confDir, { recursive: true });
  for (const f of readdirSync(confDir)) if (f.endsWith('.conflist')) writeFileSync(join(confDir, f), '');
  writeFileSync(join(confDir, '10-test.conflist'), JSON.stringify({ cniVersion: '1.0.0', name, plugins }, null, 1));
}

export interface GuestLease {
  ip: string;
  mask: string;
  router: string;
  serverid: string;
}

/**
 * busybox udhcpc in the guest netns: one lease (-q), applied by the hook (address, default route) so the guest can
 * send; the hook's environment is the lease.
 */
export async function udhcpcLease(guestNs: string, dir: string): Promise<GuestLease> {
  mkdirSync(dir, { recursive: true });
  const script = join(dir, 'hook.sh');
  writeFileSync(
    script,
    `#!/bin/sh
case "$1" in
  bound|renew)
    env > "${dir}/lease.env"
    ip addr replace "$ip/$mask" dev "$interface"
    [ -n "$router" ] && ip route replace default via "$router" dev "$interface"
    ;;
esac
exit 0
`,
  );
  chmodSync(script, 0o755);
  const r = await execa(
    'ip',
    [
      'netns',
      'exec',
      guestNs,
      'busybox',
      'udhcpc',
      '-i',
      'eth0',
      '-f',
      '-n',
      '-q',
      '-T',
      '1',
      '-t',
      '15',
      '-s',
      script,
    ],
    { reject: false, all: true, timeout: 40_000 },
  );
  if (r.exitCode !== 0) throw new Error(`udhcpc in ${guestNs} got no lease: ${r.all}`);
  const env = Object.fromEntries(
    readFileSync(join(dir, 'lease.env'), 'utf8')
      .split('\n')
      .filter((l) => l.includes('='))
      .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
  );
  return {
    ip: env.ip ?? '',
    mask: env.mask ?? '',
    router: (env.router ?? '').split(' ')[0] ?? '',
    serverid: env.serverid ?? '',
  };
}

/** One ICMP echo from netns `ns` (undefined: the host netns) to `ip`: its exit code (0: answered). */
export async function ping(ns: string | undefined, ip: string): Promise<number> {
  const argv = ['ping', '-c', '1', '-W', '3', ip];
  const r = await execa(
    ns === undefined ? argv[0]! : 'ip',
    ns === undefined ? argv.slice(1) : ['netns', 'exec', ns, ...argv],
    { reject: false, timeout: 10_000 },
  );
  return r.exitCode ?? -1;
}

/** Can this kernel make a link of this kind (ipvlan, vlan)? Probed with a throwaway link in a throwaway netns. */
export async function kernelMakes(kind: 'ipvlan' | 'vlan'): Promise<{ ok: boolean; why: string }> {
  const ns = `vmprobe${randomBytes(3).toString('hex')}`;
  await addNetns(ns);
  try {
    await run(['ip', '-n', ns, 'link', 'add', 'p0', 'type', 'veth', 'peer', 'name', 'p1']);
    const args =
      kind === 'vlan'
        ? ['link', 'add', 'link', 'p0', 'name', 'c0', 'type', 'vlan', 'id', '7']
        : ['link', 'add', 'link', 'p0', 'name', 'c0', 'type', 'ipvlan', 'mode', 'l2'];
    const r = await execa('ip', ['-n', ns, ...args], { reject: false, timeout: 10_000 });
    return { ok: r.exitCode === 0, why: r.stderr.trim() };
  } finally {
    await delNetns(ns);
  }
}
