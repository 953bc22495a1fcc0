// PCI addresses and the sysfs root: pure helpers.
import { ErrorCode, VmpodError } from '../errors.js';

/** "/sys", unless a flag or VMPOD_SYSFS_ROOT says otherwise (tests build a fake tree). */
export function sysfsRoot(env: Record<string, string | undefined> = process.env, flag?: string): string {
  return flag ?? env['VMPOD_SYSFS_ROOT'] ?? '/sys';
}

// domain (16 bit, 4 hex digits as sysfs prints it), bus (8 bit), slot (5 bit: 00..1f), function (3 bit: 0..7)
const FULL_RE = /^([0-9a-f]{4}):([0-9a-f]{2}):([01][0-9a-f])\.([0-7])$/i;
const SHORT_RE = /^([0-9a-f]{2}):([01][0-9a-f])\.([0-7])$/i;

/**
 * "0000:3D:02.2" or "3d:02.2" -> "0000:3d:02.2" (the short form means domain 0, as lspci prints it).
 * Anything else: VmpodError(BadRequest) quoting the value.
 */
export function parsePciAddress(s: string): string {
  const v = typeof s === 'string' ? s.trim() : '';
  if (FULL_RE.test(v)) return v.toLowerCase();
  if (SHORT_RE.test(v)) return `0000:${v.toLowerCase()}`;
  throw new VmpodError(ErrorCode.BadRequest, `PCI address ${JSON.stringify(s)} is not dddd:bb:dd.f or bb:dd.f`);
}

export function isPciAddress(s: string): boolean {
  return FULL_RE.test(s);
}

/**
 * PCI class codes (PCI Code and ID Assignment spec, base class 06 = bridge): a host bridge (0600) or a
 * PCI-to-PCI bridge (0604) in an IOMMU group is not an endpoint and is not passed through (Kata does the same).
 * The sysfs "class" file holds the 24-bit class/subclass/prog-if.
 */
export const PciClass = { HostBridge: 0x0600, PciBridge: 0x0604 } as const;

export function isBridgeClass(cls: number): boolean {
  const sub = cls >> 8;
  return sub === PciClass.HostBridge || sub === PciClass.PciBridge;
}

/** The uuid of a mediated device, as mdev names it under /sys/bus/mdev/devices. */
export const MDEV_UUID_RE = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** The driver vfio-pci registers as (/sys/bus/pci/drivers/vfio-pci). */
export const VFIO_PCI_DRIVER = 'vfio-pci';

/**
 * vfio drivers by name, for kernels without vfio-dev (before 6.1): vfio-pci and the vendor variant drivers built on
 * vfio-pci-core (live-migration capable NICs, GPUs, accelerators). Their ID tables are override-only, so they bind
 * only through driver_override; qemu still uses -device vfio-pci for them. A name not listed here counts when it
 * has "vfio" as a word (xe-vfio-pci, a future <vendor>_vfio_pci).
 */
export const VFIO_DRIVERS: readonly string[] = [
  VFIO_PCI_DRIVER,
  'mlx5_vfio_pci',
  'hisi_acc_vfio_pci',
  'pds_vfio_pci',
  'virtio_vfio_pci',
  'nvgrace_gpu_vfio_pci',
  'qat_vfio_pci',
  'xe-vfio-pci',
];

export function isVfioDriverName(driver: string | undefined): boolean {
  return driver !== undefined && (VFIO_DRIVERS.includes(driver) || /(^|[_-])vfio([_-]|$)/.test(driver));
}

/** Drivers that leave a group viable (the kernel's driver_managed_dma): pci-stub, and pcieport for bridges. */
export const PCI_STUB_DRIVER = 'pci-stub';
export const PCIEPORT_DRIVER = 'pcieport';
