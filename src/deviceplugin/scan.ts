// What the node has, read from sysfs (under VMPOD_SYSFS_ROOT) and /dev (under VMPOD_DEV_ROOT): every PCI function's
// IDs and driver, and for the functions a resource selects their IOMMU group (every member, through
// src/devices' groupFacts), NUMA node and iommufd nodes. Read whole on every tick; inventory.ts decides on it.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import {
  functionFacts,
  groupFacts,
  isPciAddress,
  type FunctionFacts,
  type GroupFacts,
  type Sysfs,
} from '../devices/index.js';

/** What a selector looks at: vendor and device without 0x, lower case. */
export interface PciIds {
  address: string;
  vendor: string;
  device: string;
  driver?: string;
}

export interface NodeFunction extends FunctionFacts {
  vendor: string;
  device: string;
  /** numa_node; -1: none */
  numa: number;
  /** /dev/vfio/devices/vfioN exists for it (iommufd's per-device node) */
  cdev?: string;
}

export interface NodeView {
  /** where sysfs was read, for the paths in messages */
  sysfsRoot: string;
  /** the selected functions, by address */
  functions: Map<string, NodeFunction>;
  /** the groups of the selected functions, every member read */
  groups: Map<string, GroupFacts>;
  /** /dev/iommu exists: the host has iommufd */
  iommufd: boolean;
}

const hexId = (s: string | undefined) => (s ?? '').toLowerCase().replace(/^0x/, '');

/** Every PCI function of the node with the IDs selectors match on. */
export function listPci(sysfs: Sysfs): PciIds[] {
  return sysfs
    .list('bus/pci/devices')
    .filter(isPciAddress)
    .map((a) => {
      const address = a.toLowerCase();
      const dir = `bus/pci/devices/${a}`;
      const ids: PciIds = {
        address,
        vendor: hexId(sysfs.readText(`${dir}/vendor`)),
        device: hexId(sysfs.readText(`${dir}/device`)),
      };
      const driver = sysfs.linkBase(`${dir}/driver`);
      if (driver !== undefined) ids.driver = driver;
      return ids;
    });
}

/** The selected functions (`select` sees each function's IDs), their groups and the iommufd nodes. */
export function scanNode(sysfs: Sysfs, devRoot: string, select: (f: PciIds) => boolean): NodeView {
  const view: NodeView = {
    sysfsRoot: sysfs.root,
    functions: new Map(),
    groups: new Map(),
    iommufd: existsSync(join(devRoot, 'dev/iommu')),
  };
  for (const ids of listPci(sysfs)) {
    if (!select(ids)) continue;
    const f = functionFacts(sysfs, ids.address);
    if (!f.exists) continue; // removed between the listing and now
    const numa = Number(sysfs.readText(`bus/pci/devices/${ids.address}/numa_node`) ?? '-1');
    const nf: NodeFunction = {
      ...f,
      vendor: ids.vendor,
      device: ids.device,
      numa: Number.isInteger(numa) && numa >= 0 ? numa : -1,
    };
    if (f.vfioDev !== undefined && existsSync(join(devRoot, 'dev/vfio/devices', f.vfioDev))) nf.cdev = f.vfioDev;
    view.functions.set(f.address, nf);
    if (f.group !== undefined && !view.groups.has(f.group))
      view.groups.set(f.group, groupFacts(sysfs, devRoot, f.group));
  }
  return view;
}
