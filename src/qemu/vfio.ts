// -device vfio-pci for one passed-through PCI function or mediated device, and the pcie-root-port it sits
// behind on q35 (style: Kata govmm VFIODevice / PCIeRootPortDevice).
import { escapeQemuValue, type IdAllocator } from './ids.js';
import { IdPrefix, PCI_ADDRESS_RE, QemuDriver, type VfioDev } from './types.js';

const MDEV_RE = /\/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

export class QemuVfioDevice {
  readonly dev: VfioDev;

  constructor(d: VfioDev) {
    this.dev = d;
  }

  /** Every problem at once, each quoting the bad value. */
  validate(): string[] {
    const { address, sysfsdev, source } = this.dev;
    const p: string[] = [];
    // qemu's host= takes domain:bus:slot.fn; Virtlet dropped the domain, which breaks non-zero PCI domains
    if (typeof address !== 'string' || !PCI_ADDRESS_RE.test(address))
      p.push(`PCI address ${JSON.stringify(address)} is not a full lower-case dddd:bb:dd.f`);
    if (
      sysfsdev !== undefined &&
      (typeof sysfsdev !== 'string' || !sysfsdev.startsWith('/') || !MDEV_RE.test(sysfsdev))
    )
      p.push(`sysfsdev ${JSON.stringify(sysfsdev)} is not an absolute path ending in a mediated device uuid`);
    if (typeof source !== 'string' || source === '') p.push('no source');
    return p;
  }

  /**
   * -device vfio-pci,host=..|sysfsdev=..,id=vmpodhostdev<n>[,bus=..]. The id is explicit so that qemu's errors,
   * QMP and device_del can name the device (Kata emits id= for the same reason).
   */
  toArgs(ids: IdAllocator, opts: { bus?: string } = {}): string[] {
    const { address, sysfsdev } = this.dev;
    const id = ids.next(IdPrefix.Hostdev);
    const parts = [QemuDriver.VfioPci as string];
    // a mediated device is named by its sysfs path; its parent's address would pass the whole parent through
    parts.push(sysfsdev !== undefined ? `sysfsdev=${escapeQemuValue(sysfsdev)}` : `host=${escapeQemuValue(address)}`);
    parts.push(`id=${id}`);
    if (opts.bus !== undefined) parts.push(`bus=${escapeQemuValue(opts.bus)}`);
    return ['-device', parts.join(',')];
  }
}

/**
 * A PCIe root port on q35's pcie.0. Each vfio device gets its own: a device behind a root port is a PCIe endpoint
 * with its own hot-plug slot, and large-BAR devices need the root port's own memory window (devices.md; Kata's
 * pcie_root_port). (chassis, slot) must be unique among qemu's PCIe ports, or qemu fails with
 * "Can't add chassis slot"; libvirt numbers its own root ports' chassis from 1, so we take numbers it left free.
 */
export class QemuPcieRootPort {
  constructor(
    readonly chassis: number,
    readonly port: number,
  ) {}

  validate(): string[] {
    const p: string[] = [];
    // both are 8-bit registers (PCIe Slot Capabilities chassis number as qemu models it; Link Capabilities port number)
    if (!(Number.isInteger(this.chassis) && this.chassis >= 0 && this.chassis <= 255))
      p.push(`chassis ${this.chassis} is outside 0..255`);
    if (!(Number.isInteger(this.port) && this.port >= 0 && this.port <= 255))
      p.push(`port ${this.port} is outside 0..255`);
    return p;
  }

  /** Returns the argv and the id that the device behind it names with bus=. */
  toArgs(ids: IdAllocator): { id: string; args: string[] } {
    const id = ids.next(IdPrefix.RootPort);
    const dev = [
      QemuDriver.PcieRootPort,
      `id=${id}`,
      'bus=pcie.0',
      `chassis=${this.chassis}`,
      `port=0x${this.port.toString(16)}`,
    ];
    return { id, args: ['-device', dev.join(',')] };
  }
}
