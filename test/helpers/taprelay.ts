// A "guest" netns wired to a pod's tap the way qemu is: the pod tap's fd (from tapmanager's get) on one side, a tap
// named eth0 with the VM's MAC in the guest netns on the other, frames copied both ways by this process (both
// fds with IFF_VNET_HDR, so the 10-byte virtio header goes across unchanged). Real clients run in the guest netns.
import { execa } from 'execa';
import { native, type Poller } from '../../src/native.js';
import { addNetns, delNetns, run, uniqueName } from './netns.js';

export interface GuestNetns {
  ns: string;
  nsPath: string;
  /** frames copied pod -> guest and guest -> pod */
  counts: { toGuest: number; toPod: number };
  close(): Promise<void>;
}

function pump(from: number, to: number, count: () => void): Poller {
  const n = native();
  return n.pollReadable(from, (err) => {
    if (err) return;
    for (let i = 0; i < 64; i++) {
      let f: Buffer | null;
      try {
        f = n.read(from, 65536);
      } catch {
        return;
      }
      if (!f || f.length === 0) return;
      try {
        n.writeAll(to, f);
        count();
      } catch {
        // the other side is gone or its queue is full: a lost frame, as on a wire
      }
    }
  });
}

/** A guest netns whose eth0 (MAC `mac`, MTU `mtu`) is relayed to the pod tap fd `podTapFd` (not closed here). */
export async function guestOnTap(podTapFd: number, mac: string, mtu = 1500): Promise<GuestNetns> {
  const ns = uniqueName('vmg6');
  await addNetns(ns);
  const nsPath = `/var/run/netns/${ns}`;
  let fd = -1;
  const pollers: Poller[] = [];
  try {
    await run(['ip', '-n', ns, 'tuntap', 'add', 'dev', 'eth0', 'mode', 'tap', 'vnet_hdr']);
    await run(['ip', '-n', ns, 'link', 'set', 'dev', 'eth0', 'address', mac, 'mtu', String(mtu)]);
    fd = await native().openTap(nsPath, 'eth0', { vnetHdr: true });
    await run(['ip', '-n', ns, 'link', 'set', 'dev', 'lo', 'up']);
    await run(['ip', '-n', ns, 'link', 'set', 'dev', 'eth0', 'up']);
  } catch (e) {
    if (fd >= 0) native().close(fd);
    await delNetns(ns);
    throw e;
  }
  const counts = { toGuest: 0, toPod: 0 };
  pollers.push(pump(podTapFd, fd, () => counts.toGuest++));
  pollers.push(pump(fd, podTapFd, () => counts.toPod++));
  return {
    ns,
    nsPath,
    counts,
    async close() {
      for (const p of pollers) p.stop();
      native().close(fd);
      // what a client forked and left behind in this netns (dhcpcd's privilege-separation helpers outlive its
      // manager's SIGTERM) ends with it: only processes inside our own test netns
      const left = await execa('ip', ['netns', 'pids', ns], { reject: false, timeout: 10_000 });
      for (const pid of String(left.stdout).split('\n').filter(Boolean).map(Number)) {
        try {
          process.kill(pid, 'SIGKILL');
        } catch {
          /* gone already */
        }
      }
      await delNetns(ns);
    },
  };
}
