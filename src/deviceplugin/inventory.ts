// The devices each resource advertises, and their health, from one scan of the node. Pure.
//
// A function belongs to the first resource whose selectors all match it (each selector list: any of its values).
// A kubelet device is one function (unit "function", ID = its PCI address) or one IOMMU group (unit "group", ID
// "iommu-group-<N>", the resource's functions in it). Healthy: every function of the device is on a vfio driver, and
// every other member of its group leaves the group viable (vfio driver, pci-stub, no driver; bridges exempt: the
// kernel's rule). Functions without an IOMMU group, in a no-IOMMU group, or that are bridges are never offered.
import { isBridge, isVfioBound, leavesGroupViable, type FunctionFacts, type GroupFacts } from '../devices/index.js';
import { Unit, type ResourceConfig } from './config.js';
import type { NodeFunction, NodeView, PciIds } from './scan.js';

export const Health = { Healthy: 'Healthy', Unhealthy: 'Unhealthy' } as const;
export type Health = (typeof Health)[keyof typeof Health];

/** Why a device is unhealthy: short codes for the metric's label, the sentence for the log and Allocate's refusal. */
export const ProblemCode = { NotVfio: 'not-vfio', GroupNotViable: 'group-not-viable' } as const;
export type ProblemCode = (typeof ProblemCode)[keyof typeof ProblemCode];

export interface DeviceProblem {
  code: ProblemCode;
  /** the function at fault and its driver ("none" when unbound) */
  member: string;
  driver: string;
  text: string;
}

export interface PluginDevice {
  id: string;
  health: Health;
  /** NUMA nodes of its functions, sorted; [] when sysfs says none (-1) */
  numa: number[];
  /** PCI addresses, sorted */
  functions: string[];
  groups: string[];
  /** iommufd per-device nodes (vfioN of /dev/vfio/devices) of its functions */
  cdevs: string[];
  problem?: DeviceProblem;
}

export interface ResourceInventory {
  resource: ResourceConfig;
  devices: PluginDevice[];
}

export interface NotOffered {
  resource: string;
  address: string;
  why: string;
}

export interface Inventory {
  resources: ResourceInventory[];
  notOffered: NotOffered[];
  /** /dev/iommu exists */
  iommufd: boolean;
}

export function selects(r: ResourceConfig, f: PciIds): boolean {
  return (
    (r.vendors.length === 0 || r.vendors.includes(f.vendor)) &&
    (r.devices.length === 0 || r.devices.includes(f.device)) &&
    (r.drivers.length === 0 || (f.driver !== undefined && r.drivers.includes(f.driver))) &&
    (r.pciAddresses.length === 0 || r.pciAddresses.includes(f.address))
  );
}

/** The first resource that selects `f` (one function, one resource). */
export function ownerOf(resources: readonly ResourceConfig[], f: PciIds): ResourceConfig | undefined {
  return resources.find((r) => selects(r, f));
}

const sysPath = (root: string, rel: string) => `${root.replace(/\/$/, '')}/${rel}`;

/**
 * The first problem of a device made of `fns` in group `g`: a function off vfio, then a member that breaks the group.
 */
export function deviceProblem(
  fns: readonly FunctionFacts[],
  g: GroupFacts,
  sysfsRoot: string,
): DeviceProblem | undefined {
  for (const f of fns) {
    if (isVfioBound(f)) continue;
    const dev = sysPath(sysfsRoot, `bus/pci/devices/${f.address}`);
    return {
      code: ProblemCode.NotVfio,
      member: f.address,
      driver: f.driver ?? 'none',
      text:
        `${f.address} is bound to ${f.driver ?? 'no driver'}, not to a vfio driver: bind it to vfio-pci (echo ` +
        `vfio-pci > ${dev}/driver_override; echo ${f.address} > ${dev}/driver/unbind; echo ${f.address} > ` +
        `${sysPath(sysfsRoot, 'bus/pci/drivers_probe')})`,
    };
  }
  const passed = new Set(fns.map((f) => f.address));
  for (const m of g.members) {
    if (passed.has(m.address) || leavesGroupViable(m)) continue;
    return {
      code: ProblemCode.GroupNotViable,
      member: m.address,
      driver: m.driver ?? 'none',
      text:
        `IOMMU group ${g.group} is not viable: its member ${m.address} is bound to ${m.driver}; the kernel ` +
        `gives a group to a VM only when every member is on a vfio driver, pci-stub or no driver: unbind it (echo ` +
        `${m.address} > ${sysPath(sysfsRoot, `bus/pci/devices/${m.address}/driver/unbind`)}) or bind it to vfio-pci`,
    };
  }
  return undefined;
}

function makeDevice(id: string, fns: NodeFunction[], g: GroupFacts, sysfsRoot: string): PluginDevice {
  const problem = deviceProblem(fns, g, sysfsRoot);
  return {
    id,
    health: problem === undefined ? Health.Healthy : Health.Unhealthy,
    numa: [...new Set(fns.map((f) => f.numa).filter((n) => n >= 0))].sort((a, b) => a - b),
    functions: fns.map((f) => f.address).sort(),
    groups: [g.group],
    cdevs: fns.flatMap((f) => (f.cdev !== undefined ? [f.cdev] : [])),
    ...(problem !== undefined ? { problem } : {}),
  };
}

/** Why a selected function is never offered, or undefined when it may be. */
function notOfferedWhy(f: NodeFunction, g: GroupFacts | undefined): string | undefined {
  if (isBridge(f))
    return (
      `${f.address} is a PCI bridge (class ` +
      `0x${f.class.toString(16).padStart(6, '0')}${f.driver !== undefined ? `, driver ${f.driver}` : ''}): bridges ` +
      `stay with the host`
    );
  if (f.group === undefined || g === undefined)
    return `${f.address} has no IOMMU group: boot the host with its IOMMU on (intel_iommu=on or amd_iommu=on)`;
  if (g.noiommu !== undefined)
    return (
      `${f.address} is in the vfio no-IOMMU group ${g.group} (${g.noiommu}): it gives a VM no DMA isolation ` +
      `and is never offered; boot the host with its IOMMU on and without vfio.enable_unsafe_noiommu_mode`
    );
  return undefined;
}

export function buildInventory(resources: readonly ResourceConfig[], view: NodeView): Inventory {
  const inv: Inventory = { resources: [], notOffered: [], iommufd: view.iommufd };
  const byResource = new Map<string, NodeFunction[]>(resources.map((r) => [r.resourceName, []]));
  for (const f of [...view.functions.values()].sort((a, b) => (a.address < b.address ? -1 : 1))) {
    const r = ownerOf(resources, f);
    if (r === undefined) continue;
    const why = notOfferedWhy(f, f.group !== undefined ? view.groups.get(f.group) : undefined);
    if (why !== undefined) inv.notOffered.push({ resource: r.resourceName, address: f.address, why });
    else byResource.get(r.resourceName)!.push(f);
  }
  for (const r of resources) {
    const fns = byResource.get(r.resourceName)!;
    const devices: PluginDevice[] = [];
    if (r.unit === Unit.Function) {
      for (const f of fns) devices.push(makeDevice(f.address, [f], view.groups.get(f.group!)!, view.sysfsRoot));
    } else {
      const groups = [...new Set(fns.map((f) => f.group!))].sort((a, b) => Number(a) - Number(b));
      for (const g of groups)
        devices.push(
          makeDevice(
            `iommu-group-${g}`,
            fns.filter((f) => f.group === g),
            view.groups.get(g)!,
            view.sysfsRoot,
          ),
        );
    }
    inv.resources.push({ resource: r, devices });
  }
  return inv;
}
