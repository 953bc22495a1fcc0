// A fake sysfs tree in a temp dir, shaped like the kernel's (devices.md), for the devices tests.
// Writes to the fake attribute files do nothing by themselves; FakeSysfs records them and, like the kernel,
// re-points the driver link on unbind and drivers_probe, so bindToVfio can be tested end to end.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { expect } from 'vitest';
import { Sysfs } from '../../src/devices/sysfs.js';
import { ErrorCode, VmpodError } from '../../src/errors.js';

export interface FakePci {
  address: string;
  /** 24-bit class, default 0x020000 (Ethernet) */
  class?: number;
  vendor?: string;
  device?: string;
  driver?: string;
  iommuGroup?: string;
  /** PF address, for a VF (the PF's virtfn<n> link is added with vfIndex) */
  physfn?: string;
  vfIndex?: number;
  /** net interfaces of this function: bus/pci/devices/<addr>/net/<if> and class/net/<if>/device */
  net?: { ifname: string; mac?: string }[];
  /** vfio-dev/<name> under the device (Linux 6.1+ while a vfio driver is bound), e.g. "vfio3" */
  vfioDev?: string;
}

export class FakeSysfsTree {
  readonly root: string;

  constructor(root: string) {
    this.root = root;
    for (const d of ['bus/pci/devices', 'bus/pci/drivers', 'bus/mdev/devices', 'kernel/iommu_groups', 'class/net'])
      fs.mkdirSync(path.join(root, d), { recursive: true });
    fs.writeFileSync(path.join(root, 'bus/pci/drivers_probe'), '');
  }

  p(rel: string): string {
    return path.join(this.root, rel);
  }

  ensureDriver(name: string): void {
    const dir = this.p(`bus/pci/drivers/${name}`);
    if (fs.existsSync(dir)) return;
    fs.mkdirSync(dir, { recursive: true });
    fs.writeFileSync(path.join(dir, 'bind'), '');
    fs.writeFileSync(path.join(dir, 'unbind'), '');
  }

  /** Point bus/pci/devices/<addr>/driver at drivers/<name>, or remove the link. */
  setDriver(address: string, name: string | undefined): void {
    const link = this.p(`bus/pci/devices/${address}/driver`);
    fs.rmSync(link, { force: true });
    if (name === undefined) return;
    this.ensureDriver(name);
    fs.symlinkSync(`../../../../bus/pci/drivers/${name}`, link);
  }

  addPci(d: FakePci): this {
    const dir = this.p(`bus/pci/devices/${d.address}`);
    fs.mkdirSync(dir, { recursive: true });
    fs.writeFileSync(path.join(dir, 'class'), `0x${(d.class ?? 0x020000).toString(16).padStart(6, '0')}\n`);
    fs.writeFileSync(path.join(dir, 'vendor'), `${d.vendor ?? '0x8086'}\n`);
    fs.writeFileSync(path.join(dir, 'device'), `${d.device ?? '0x1889'}\n`);
    fs.writeFileSync(path.join(dir, 'driver_override'), '(null)\n');
    if (d.driver !== undefined) this.setDriver(d.address, d.driver);
    if (d.vfioDev !== undefined) fs.mkdirSync(path.join(dir, 'vfio-dev', d.vfioDev), { recursive: true });
    if (d.iommuGroup !== undefined) {
      const g = this.p(`kernel/iommu_groups/${d.iommuGroup}/devices`);
      fs.mkdirSync(g, { recursive: true });
      fs.symlinkSync(`../../../../bus/pci/devices/${d.address}`, path.join(g, d.address));
      fs.symlinkSync(`../../../../kernel/iommu_groups/${d.iommuGroup}`, path.join(dir, 'iommu_group'));
    }
    if (d.physfn !== undefined) {
      fs.symlinkSync(`../${d.physfn}`, path.join(dir, 'physfn'));
      fs.symlinkSync(`../${d.address}`, this.p(`bus/pci/devices/${d.physfn}/virtfn${d.vfIndex ?? 0}`));
    }
    for (const n of d.net ?? []) {
      fs.mkdirSync(path.join(dir, 'net', n.ifname), { recursive: true });
      const cn = this.p(`class/net/${n.ifname}`);
      fs.mkdirSync(cn, { recursive: true });
      fs.symlinkSync(`../../../bus/pci/devices/${d.address}`, path.join(cn, 'device'));
      fs.writeFileSync(path.join(cn, 'address'), `${n.mac ?? '02:00:00:00:00:01'}\n`);
    }
    return this;
  }

  /** Marks a group as vfio's no-IOMMU group: kernel/iommu_groups/<N>/name reads "vfio-noiommu". */
  markNoiommu(group: string): this {
    fs.writeFileSync(this.p(`kernel/iommu_groups/${group}/name`), 'vfio-noiommu\n');
    return this;
  }

  /** A virtual link (no device link), like a veth or a bridge. */
  addVirtualNet(ifname: string): this {
    fs.mkdirSync(this.p(`class/net/${ifname}`), { recursive: true });
    return this;
  }

  /** A mediated device under its parent, linked from bus/mdev/devices, in its own IOMMU group. */
  addMdev(uuid: string, parent: string, iommuGroup?: string): this {
    const dir = this.p(`bus/pci/devices/${parent}/${uuid}`);
    fs.mkdirSync(dir, { recursive: true });
    fs.symlinkSync(`../../../bus/pci/devices/${parent}/${uuid}`, this.p(`bus/mdev/devices/${uuid}`));
    if (iommuGroup !== undefined) {
      const g = this.p(`kernel/iommu_groups/${iommuGroup}/devices`);
      fs.mkdirSync(g, { recursive: true });
      fs.symlinkSync(`../../../../bus/pci/devices/${parent}/${uuid}`, path.join(g, uuid));
      fs.symlinkSync(`../../../../../kernel/iommu_groups/${iommuGroup}`, path.join(dir, 'iommu_group'));
    }
    return this;
  }

  read(rel: string): string {
    return fs.readFileSync(this.p(rel), 'utf8');
  }

  driverOf(address: string): string | undefined {
    try {
      return path.basename(fs.readlinkSync(this.p(`bus/pci/devices/${address}/driver`)));
    } catch {
      return undefined;
    }
  }

  cleanup(): void {
    fs.rmSync(this.root, { recursive: true, force: true });
  }
}

export function makeFakeSysfs(): FakeSysfsTree {
  return new FakeSysfsTree(fs.mkdtempSync(path.join(os.tmpdir(), 'vmpod-sysfs-')));
}

/**
 * For afterEach: removes the tree the test made, if any, and checks that it is gone. Returns undefined, to clear the
 * test file's slot: `afterEach(() => { tree = removeFakeSysfs(tree); });`
 */
export function removeFakeSysfs(tree: FakeSysfsTree | undefined): undefined {
  if (tree) {
    tree.cleanup();
    expect(fs.existsSync(tree.root)).toBe(false);
  }
  return undefined;
}

/** The kernel's probe, by hand: bind `address` to its driver_override (if set and not "(null)"). */
export function simulateProbe(tree: FakeSysfsTree, address: string): void {
  const ov = tree.read(`bus/pci/devices/${address}/driver_override`).trim();
  if (tree.driverOf(address) !== undefined) return; // the kernel does not re-probe a bound device
  if (ov !== '' && ov !== '(null)') tree.setDriver(address, ov);
}

export interface SysfsWrite {
  path: string;
  data: string;
}

/**
 * A Sysfs over a fake tree that records every write and acts like the kernel on the three files binding uses:
 * driver/unbind drops the driver link, driver_override stores the value, drivers_probe binds to the override.
 * probe = 'nothing' models a kernel where nothing binds (vfio-pci not loaded).
 */
export class FakeSysfs extends Sysfs {
  readonly writes: SysfsWrite[] = [];
  /** rel paths whose writes fail with EINVAL, as a refusing kernel would */
  readonly failing = new Set<string>();
  probe: 'override' | 'nothing' = 'override';

  constructor(readonly tree: FakeSysfsTree) {
    super(tree.root);
  }

  override write(rel: string, data: string): void {
    this.writes.push({ path: rel, data });
    if (this.failing.has(rel)) {
      const cause = Object.assign(new Error(`EINVAL: invalid argument, write '${this.path(rel)}'`), { code: 'EINVAL' });
      throw new VmpodError(ErrorCode.Device, `write ${JSON.stringify(data)} to ${this.path(rel)}`, { cause });
    }
    super.write(rel, data);
    const m = /^bus\/pci\/devices\/([^/]+)\/driver\/unbind$/.exec(rel);
    if (m && m[1] === data) this.tree.setDriver(data, undefined);
    if (rel === 'bus/pci/drivers_probe' && this.probe === 'override') simulateProbe(this.tree, data);
  }
}

/**
 * A fake host root (VMPOD_DEV_ROOT) with dev/vfio and proc: a process holding a group open is proc/<pid>/fd/<n>,
 * a symlink to the node's path as the kernel shows it (/dev/vfio/<N>), with comm and cmdline beside it.
 */
export class FakeHostRoot {
  constructor(readonly root: string) {
    fs.mkdirSync(path.join(root, 'dev/vfio'), { recursive: true });
    fs.mkdirSync(path.join(root, 'proc'), { recursive: true });
  }

  /** /dev/vfio/<name> as an empty file (enough for existence checks) */
  addNode(name: string): this {
    fs.writeFileSync(path.join(this.root, 'dev/vfio', name), '');
    return this;
  }

  addProcess(pid: number, comm: string, argv: string[], openFiles: string[]): this {
    const dir = path.join(this.root, 'proc', String(pid));
    fs.mkdirSync(path.join(dir, 'fd'), { recursive: true });
    fs.writeFileSync(path.join(dir, 'comm'), `${comm}\n`);
    fs.writeFileSync(path.join(dir, 'cmdline'), `${argv.join('\0')}\0`);
    openFiles.forEach((f, i) => fs.symlinkSync(f, path.join(dir, 'fd', String(i + 3))));
    return this;
  }

  cleanup(): void {
    fs.rmSync(this.root, { recursive: true, force: true });
  }
}

export function makeFakeHostRoot(): FakeHostRoot {
  return new FakeHostRoot(fs.mkdtempSync(path.join(os.tmpdir(), 'vmpod-host-')));
}
