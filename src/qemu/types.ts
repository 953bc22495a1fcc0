// Plain data that the qemu argv builder renders. No I/O here.

/** One tap interface of the pod, as vmwrapper received it from tapmanager. */
export interface TapNet {
  /** one fd per queue, as numbered in qemu's process; more than one makes the NIC multiqueue */
  fds: number[];
  /**
   * vhost=on|off: whether qemu opens /dev/vhost-net itself and the kernel carries the packets (absent: qemu's
   * default, off). No vhost fds are passed in: qemu opens one per queue.
   */
  vhost?: boolean;
  /** the guest NIC's MAC, colon-hex: the pod's original MAC */
  mac: string;
  mtu?: number;
  /** the interface's fdIndex in tapmanager's get reply */
  index: number;
}

/** One PCI device (or mediated device) to pass through with vfio-pci. */
export interface VfioDev {
  /** full PCI address 0000:bb:dd.f (for a mediated device: its parent's) */
  address: string;
  /** mediated device: /sys/bus/mdev/devices/<uuid>; rendered as sysfsdev= instead of host= */
  sysfsdev?: string;
  /**
   * where it came from: "tapmanager", "PCIDEVICE_INTEL_COM_SRIOV", "QAT0", "VMPOD_CRI_DEVICES", "cdi
   * vendor.com/class=name", "podresources <resource>" ...
   */
  source: string;
}

/** qemu driver and backend names (a closed vocabulary). */
export const QemuDriver = {
  VirtioNetPci: 'virtio-net-pci',
  VfioPci: 'vfio-pci',
  PcieRootPort: 'pcie-root-port',
} as const;
export type QemuDriver = (typeof QemuDriver)[keyof typeof QemuDriver];

export const NetdevBackend = { Tap: 'tap' } as const;
export type NetdevBackend = (typeof NetdevBackend)[keyof typeof NetdevBackend];

/** Prefixes of the ids we add. Never "hostdevN" / "netN": those are libvirt's alias space. */
export const IdPrefix = {
  Netdev: 'vmpodnet',
  Nic: 'vmpodnic',
  Hostdev: 'vmpodhostdev',
  RootPort: 'vmpodrp',
} as const;

/** Multiqueue taps: at most 256 queues (the kernel's MAX_TAP_QUEUES, drivers/net/tun.c). */
export const MAX_QUEUES = 256;

/** virtio-net's host_mtu range (qemu hw/net/virtio-net.c: ETH_MIN_MTU 68 .. 65535). */
export const MIN_MTU = 68;
export const MAX_MTU = 65535;

/** Full, normalised PCI address: domain:bus:slot.function, lower-case hex. */
export const PCI_ADDRESS_RE = /^[0-9a-f]{4}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]$/;
