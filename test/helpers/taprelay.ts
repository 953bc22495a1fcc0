// A "guest" netns wired to a pod's tap the way a virtio-net VM is: the pod tap's fd (from tapmanager's get, opened
// with IFF_VNET_HDR as qemu opens it) on one side; on the other, eth0 with the VM's MAC in the guest netns, one end
// of a veth pair whose other end (vr0, no addresses, IPv6 off) carries a packet socket with PACKET_VNET_HDR. Frames
// are copied both ways by this process with their struct virtio_net_hdr.
//
// Checksum offload, as a virtio-net guest has it: eth0 is a veth, whose tx checksum offload is on, so the guest's
// UDP over ordinary sockets (dhclient -6, systemd-networkd, unicast renewals and releases) leaves the checksum to
// be filled in (CHECKSUM_PARTIAL). The packet socket on vr0 hands such a frame over with VIRTIO_NET_HDR_F_NEEDS_CSUM,
// csum_start and csum_offset in its header, and the pod tap takes it with that header: the frame reaches the pod
// exactly as one from virtio-net does. counts.partial counts them. The other way, the pod tap is told the guest takes
// such frames too (TUNSETOFFLOAD TUN_F_CSUM, as qemu does), and the relay hands them to eth0 with their header.
// Real clients run in the guest netns.
import { spawnSync } from 'node:child_process';
import { execa } from 'execa';
import { native, type Poller } from '../../src/native.js';
import { addNetns, delNetns, run, uniqueName } from './netns.js';

export interface GuestNetns {
  ns: string;
  nsPath: string;
  /**
   * frames copied pod -> guest and guest -> pod, and of each those whose checksum was left to be filled in
   * (virtio_net_hdr flags VIRTIO_NET_HDR_F_NEEDS_CSUM): partial from the guest, partialToGuest from the pod
   */
  counts: { toGuest: number; toPod: number; partial: number; partialToGuest: number };
  close(): Promise<void>;
}

/** struct virtio_net_hdr: flags (1), gso_type (1), hdr_len, gso_size, csum_start, csum_offset (2 each) */
const VNET_HDR_LEN = 10;
const VIRTIO_NET_HDR_F_NEEDS_CSUM = 1;
/** an IPv4 packet of 65535 bytes with its Ethernet and VLAN headers and the virtio header: a whole GSO frame */
const FRAME_MAX = 65_535 + 18 + VNET_HDR_LEN;
/** classic BPF "ret #0x40000": every frame */
const ACCEPT_ALL = Buffer.from([0x06, 0, 0, 0, 0, 0, 0x04, 0]);

function pump(from: number, to: number, count: (f: Buffer) => void): Poller {
  const n = native();
  return n.pollReadable(from, (err) => {
    if (err) return;
    for (let i = 0; i < 64; i++) {
      let f: Buffer | null;
      try {
        f = n.read(from, FRAME_MAX);
      } catch {
        return;
      }
      if (!f || f.length === 0) return;
      try {
        n.writeAll(to, f);
        count(f);
      } catch {
        // the other side is gone or its queue is full: a lost frame, as on a wire
      }
    }
  });
}

/** TUNSETOFFLOAD = _IOW('T', 208, unsigned int) (linux/if_tun.h) and its TUN_F_CSUM */
const TUNSETOFFLOAD = 0x400454d0;
const TUN_F_CSUM = 0x01;

/**
 * What qemu does on the tap fd when the guest negotiates VIRTIO_NET_F_GUEST_CSUM: the tap takes TUN_F_CSUM, so the
 * pod netns hands it frames with the checksum still to fill in (its own UDP: the DHCPv4 replies) and the guest
 * receives them that way. An ioctl on the fd, from a child that inherits it (the addon has no call for it).
 */
function acceptPartialChecksums(tapFd: number): void {
  const py = `import fcntl\nfcntl.ioctl(3, ${TUNSETOFFLOAD}, ${TUN_F_CSUM})`;
  const r = spawnSync('python3', ['-c', py], {
    stdio: ['ignore', 'pipe', 'pipe', tapFd],
    timeout: 10_000,
    encoding: 'utf8',
  });
  if (r.status !== 0) throw new Error(`TUNSETOFFLOAD on the pod tap: ${r.error?.message ?? r.stderr}`);
}

/** A guest netns whose eth0 (MAC `mac`, MTU `mtu`) is relayed to the pod tap fd `podTapFd` (not closed here). */
export async function guestOnTap(podTapFd: number, mac: string, mtu = 1500): Promise<GuestNetns> {
  const ns = uniqueName('vmg6');
  await addNetns(ns);
  const nsPath = `/var/run/netns/${ns}`;
  let fd = -1;
  try {
    await run([
      'ip',
      '-n',
      ns,
      'link',
      'add',
      'eth0',
      'address',
      mac,
      'mtu',
      String(mtu),
      'type',
      'veth',
      'peer',
      'name',
      'vr0',
      'mtu',
      String(mtu),
    ]);
    // the relay's end is no host: it sends nothing of its own (no DAD, no MLD, no RS) and answers nothing
    await run([
      'ip',
      'netns',
      'exec',
      ns,
      'sysctl',
      '-q',
      '-w',
      'net.ipv6.conf.vr0.disable_ipv6=1',
      'net.ipv4.conf.vr0.arp_ignore=8',
    ]);
    await run(['ip', '-n', ns, 'link', 'set', 'dev', 'vr0', 'up']);
    // bound once vr0 is up: a packet socket bound to a link that is down holds ENETDOWN as a pending error, and
    // the poll that sees it (POLLERR) stops
    fd = native().packetSocketInNetns(nsPath, 'vr0', ACCEPT_ALL, { vnetHdr: true });
    await run(['ip', '-n', ns, 'link', 'set', 'dev', 'lo', 'up']);
    await run(['ip', '-n', ns, 'link', 'set', 'dev', 'eth0', 'up']);
    acceptPartialChecksums(podTapFd);
  } catch (e) {
    if (fd >= 0) native().close(fd);
    await delNetns(ns);
    throw e;
  }
  const counts = { toGuest: 0, toPod: 0, partial: 0, partialToGuest: 0 };
  const pollers = [
    pump(podTapFd, fd, (f) => {
      counts.toGuest++;
      if (f[0]! & VIRTIO_NET_HDR_F_NEEDS_CSUM) counts.partialToGuest++;
    }),
    pump(fd, podTapFd, (f) => {
      counts.toPod++;
      if (f[0]! & VIRTIO_NET_HDR_F_NEEDS_CSUM) counts.partial++;
    }),
  ];
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
