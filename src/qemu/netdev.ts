// -netdev tap + -device virtio-net-pci for one pod interface (style: Kata govmm NetDevice.QemuParams).
import { escapeQemuValue, type IdAllocator } from './ids.js';
import { IdPrefix, MAX_MTU, MAX_QUEUES, MIN_MTU, NetdevBackend, QemuDriver, type TapNet } from './types.js';

const MAC_RE = /^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$/;

function isFd(n: unknown): n is number {
  return typeof n === 'number' && Number.isInteger(n) && n >= 0;
}

export class QemuNetdev {
  readonly net: TapNet;

  constructor(n: TapNet) {
    this.net = n;
  }

  /** Every problem at once, each quoting the bad value. Empty when the interface can be rendered. */
  validate(): string[] {
    const { fds, vhost, mac, mtu, index } = this.net;
    const p: string[] = [];
    if (!isFd(index)) p.push(`index ${JSON.stringify(index)} is not a non-negative integer`);
    if (!Array.isArray(fds) || fds.length === 0) p.push('no tap fd');
    else {
      if (fds.length > MAX_QUEUES) p.push(`${fds.length} queues, at most ${MAX_QUEUES}`);
      for (const fd of fds) {
        if (!isFd(fd)) p.push(`tap fd ${JSON.stringify(fd)} is not a non-negative integer`);
        // fds 0-2 are qemu's stdio: a tap there means the fd numbering went wrong upstream
        else if (fd < 3) p.push(`tap fd ${fd} is a stdio fd`);
      }
      const dup = fds.filter((fd, i) => fds.indexOf(fd) !== i);
      if (dup.length > 0) p.push(`fd ${[...new Set(dup)].join(', ')} used twice`);
    }
    if (vhost !== undefined && typeof vhost !== 'boolean') p.push(`vhost ${JSON.stringify(vhost)} is not a boolean`);
    if (typeof mac !== 'string' || !MAC_RE.test(mac)) p.push(`MAC ${JSON.stringify(mac)} is not colon-hex of 6 bytes`);
    // bit 0 of the first octet is the group bit (IEEE 802): a NIC cannot have a multicast address
    else if ((parseInt(mac.slice(0, 2), 16) & 1) === 1) p.push(`MAC ${mac} is a multicast address`);
    if (mtu !== undefined && !(Number.isInteger(mtu) && mtu >= MIN_MTU && mtu <= MAX_MTU))
      p.push(`MTU ${JSON.stringify(mtu)} is outside ${MIN_MTU}..${MAX_MTU}`);
    return p;
  }

  /** The -netdev/-device pair. Reserves vmpodnet<n>/vmpodnic<n>, n = index when free. Pure apart from `ids`. */
  toArgs(ids: IdAllocator): string[] {
    const { fds, vhost, mac, mtu, index } = this.net;
    const n = ids.allocate([IdPrefix.Netdev, IdPrefix.Nic], index);
    const netdevId = `${IdPrefix.Netdev}${n}`;
    const nicId = `${IdPrefix.Nic}${n}`;
    const queues = fds.length;

    // qemu net/tap.c: fds= takes a ':'-separated list, one fd per queue (Kata govmm NetDevice: fds= and vhost=)
    const netdev = [
      NetdevBackend.Tap as string,
      `id=${netdevId}`,
      queues === 1 ? `fd=${fds[0]}` : `fds=${fds.join(':')}`,
    ];
    if (vhost !== undefined) netdev.push(`vhost=${vhost ? 'on' : 'off'}`);

    const dev = [
      QemuDriver.VirtioNetPci as string,
      `netdev=${netdevId}`,
      `id=${nicId}`,
      `mac=${escapeQemuValue(mac.toLowerCase())}`,
    ];
    // host_mtu: virtio-net advertises VIRTIO_NET_F_MTU, so the guest driver starts with the pod's MTU
    if (mtu !== undefined) dev.push(`host_mtu=${mtu}`);
    if (queues > 1) {
      // MSI-X vectors: one per rx and per tx queue (2N), one for config changes, one for the control vq
      // (Kata's mqParameter)
      dev.push('mq=on', `vectors=${2 * queues + 2}`);
    }
    return ['-netdev', netdev.join(','), '-device', dev.join(',')];
  }
}
