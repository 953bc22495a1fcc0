// Read-mostly model of the parts of sysfs we use, under a configurable root (devices.md). Every path is
// built from validated components, so no input can escape the root.
import { existsSync, readFileSync, readdirSync, readlinkSync, realpathSync, writeFileSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { ErrorCode, VmpodError } from '../errors.js';
import { isPciAddress, MDEV_UUID_RE, parsePciAddress } from './pci.js';

export interface PciDeviceInfo {
  address: string;
  /** 24-bit class code, e.g. 0x020000 (Ethernet), 0x0b4000 (co-processor: QAT) */
  class: number;
  /** as sysfs prints them: "0x8086" */
  vendor: string;
  device: string;
  /** basename of the driver link; absent when no driver is bound */
  driver?: string;
  /** the IOMMU group number */
  iommuGroup?: string;
  /** the PF's address, for an SR-IOV VF */
  physfn?: string;
  /** n of the PF's virtfn<n> link that points here */
  virtfnIndex?: number;
}

export interface VfInfo {
  address: string;
  pfAddress: string;
  pfIfname?: string;
  vfIndex: number;
}

// IFNAMSIZ is 16 with the NUL; '/' and whitespace are not allowed, '.' and '..' would walk the tree
function checkIfname(ifname: string): void {
  if (
    typeof ifname !== 'string' ||
    ifname === '' ||
    Buffer.byteLength(ifname) > 15 ||
    /[/\s:]/.test(ifname) ||
    ifname === '.' ||
    ifname === '..'
  )
    throw new VmpodError(
      ErrorCode.BadRequest,
      `interface name ${JSON.stringify(ifname)} is not a valid Linux interface name`,
    );
}

function checkGroup(group: string): void {
  if (typeof group !== 'string' || !/^\d+$/.test(group))
    throw new VmpodError(ErrorCode.BadRequest, `IOMMU group ${JSON.stringify(group)} is not a number`);
}

function isENOENT(e: unknown): boolean {
  const code = (e as NodeJS.ErrnoException | undefined)?.code;
  return code === 'ENOENT' || code === 'ENOTDIR';
}

export class Sysfs {
  readonly root: string;

  constructor(root: string) {
    this.root = root;
  }

  /** Absolute path of a sysfs-relative one ("bus/pci/drivers_probe"). */
  path(rel: string): string {
    return join(this.root, rel);
  }

  exists(rel: string): boolean {
    return existsSync(this.path(rel));
  }

  /** File contents, trimmed; undefined when missing. */
  readText(rel: string): string | undefined {
    try {
      return readFileSync(this.path(rel), 'utf8').trim();
    } catch (e) {
      if (isENOENT(e)) return undefined;
      throw new VmpodError(ErrorCode.Device, `read ${this.path(rel)}`, { cause: e });
    }
  }

  /** basename of a symlink's target; undefined when the link is missing. */
  linkBase(rel: string): string | undefined {
    try {
      return basename(readlinkSync(this.path(rel)));
    } catch (e) {
      if (isENOENT(e)) return undefined;
      throw new VmpodError(ErrorCode.Device, `read link ${this.path(rel)}`, { cause: e });
    }
  }

  /** Directory entries, sorted; [] when missing. */
  list(rel: string): string[] {
    try {
      return readdirSync(this.path(rel)).sort();
    } catch (e) {
      if (isENOENT(e)) return [];
      throw new VmpodError(ErrorCode.Device, `list ${this.path(rel)}`, { cause: e });
    }
  }

  /** One write(2) of `data` to a sysfs attribute. The kernel acts on the write; errors name the file and data. */
  write(rel: string, data: string): void {
    try {
      writeFileSync(this.path(rel), data);
    } catch (e) {
      throw new VmpodError(ErrorCode.Device, `write ${JSON.stringify(data)} to ${this.path(rel)}`, { cause: e });
    }
  }

  pciDevice(addr: string): PciDeviceInfo | undefined {
    const address = parsePciAddress(addr);
    const dir = `bus/pci/devices/${address}`;
    if (!this.exists(dir)) return undefined;
    const info: PciDeviceInfo = {
      address,
      class: parseInt(this.readText(`${dir}/class`) ?? '0', 16) || 0,
      vendor: this.readText(`${dir}/vendor`) ?? '',
      device: this.readText(`${dir}/device`) ?? '',
    };
    const driver = this.linkBase(`${dir}/driver`);
    if (driver !== undefined) info.driver = driver;
    const group = this.linkBase(`${dir}/iommu_group`);
    if (group !== undefined) info.iommuGroup = group;
    const pf = this.linkBase(`${dir}/physfn`);
    if (pf !== undefined && isPciAddress(pf)) {
      info.physfn = pf;
      const idx = this.virtfnIndexOf(pf, address);
      if (idx !== undefined) info.virtfnIndex = idx;
    }
    return info;
  }

  /** n such that the PF's virtfn<n> link points at `vf`. */
  private virtfnIndexOf(pf: string, vf: string): number | undefined {
    for (const e of this.list(`bus/pci/devices/${pf}`)) {
      const m = /^virtfn(\d+)$/.exec(e);
      if (m && this.linkBase(`bus/pci/devices/${pf}/${e}`) === vf) return Number(m[1]);
    }
    return undefined;
  }

  /** Addresses of every device in an IOMMU group, sorted; [] when the group does not exist. */
  iommuGroupDevices(group: string): string[] {
    checkGroup(group);
    return this.list(`kernel/iommu_groups/${group}/devices`).filter(isPciAddress);
  }

  /** basename of /sys/class/net/<if>/device: the PCI address of a PCI NIC; undefined for virtual links. */
  netDevicePci(ifname: string): string | undefined {
    checkIfname(ifname);
    const a = this.linkBase(`class/net/${ifname}/device`);
    return a !== undefined && isPciAddress(a) ? a : undefined;
  }

  /** SR-IOV VF detection: /sys/class/net/<if>/device/physfn exists only for a VF. */
  isVf(ifname: string): boolean {
    checkIfname(ifname);
    return this.exists(`class/net/${ifname}/device/physfn`);
  }

  /** Net interfaces of a PCI device (/sys/bus/pci/devices/<addr>/net/<ifname>). */
  pciNetInterfaces(addr: string): string[] {
    return this.list(`bus/pci/devices/${parsePciAddress(addr)}/net`);
  }

  vfInfo(ifname: string): VfInfo {
    checkIfname(ifname);
    const address = this.netDevicePci(ifname);
    const pfAddress = this.linkBase(`class/net/${ifname}/device/physfn`);
    if (address === undefined || pfAddress === undefined || !isPciAddress(pfAddress))
      throw new VmpodError(
        ErrorCode.Device,
        `${ifname} is not an SR-IOV VF (no ${this.path(`class/net/${ifname}/device/physfn`)})`,
      );
    const vfIndex = this.virtfnIndexOf(pfAddress, address);
    if (vfIndex === undefined)
      throw new VmpodError(ErrorCode.Device, `${ifname} (${address}): no virtfn link of PF ${pfAddress} points to it`);
    const info: VfInfo = { address, pfAddress, vfIndex };
    const pfIfname = this.pciNetInterfaces(pfAddress)[0];
    if (pfIfname !== undefined) info.pfIfname = pfIfname;
    return info;
  }

  /** A mediated device: its parent PCI address (the directory its sysfs node lives in) and IOMMU group. */
  mdevDevice(uuid: string): { uuid: string; parent?: string; iommuGroup?: string } | undefined {
    if (!MDEV_UUID_RE.test(uuid))
      throw new VmpodError(ErrorCode.BadRequest, `mediated device uuid ${JSON.stringify(uuid)} is malformed`);
    const rel = `bus/mdev/devices/${uuid}`;
    let real: string;
    try {
      real = realpathSync(this.path(rel));
    } catch (e) {
      if (isENOENT(e)) return undefined;
      throw new VmpodError(ErrorCode.Device, `resolve ${this.path(rel)}`, { cause: e });
    }
    const out: { uuid: string; parent?: string; iommuGroup?: string } = { uuid };
    const parent = basename(dirname(real));
    if (isPciAddress(parent)) out.parent = parent.toLowerCase();
    const g = this.linkBase(`${rel}/iommu_group`);
    if (g !== undefined) out.iommuGroup = g;
    return out;
  }
}
