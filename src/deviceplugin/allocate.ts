// Allocate's answer for one container, and the CDI spec of a resource: the same device nodes and env. Pure.
//
// Device nodes: /dev/vfio/vfio and /dev/vfio/<N> of each group touched (rw), and with iommufd (/dev/iommu) that node
// and each function's /dev/vfio/devices/vfioN. Env: the SR-IOV device plugin's PCIDEVICE_<RESOURCE> with the
// allocated addresses (vmwrapper reads it), so a VM pod gets exactly the allocated functions, never their siblings.
import type { Holder } from '../devices/index.js';
import type { PluginDevice, ResourceInventory } from './inventory.js';

/** PCIDEVICE_<RESOURCE>: upper case, every character but A-Z and 0-9 turned into "_". */
export function envName(resourceName: string): string {
  return `PCIDEVICE_${resourceName.toUpperCase().replace(/[^A-Z0-9]/g, '_')}`;
}

export interface DeviceSpecMsg {
  container_path: string;
  host_path: string;
  permissions: string;
}

export interface ContainerAllocation {
  envs: Record<string, string>;
  devices: DeviceSpecMsg[];
  cdi_devices: { name: string }[];
}

const VFIO_CONTAINER = '/dev/vfio/vfio';
const IOMMUFD = '/dev/iommu';

/** The nodes the devices need, in a stable order: the container node, groups, then iommufd's. */
export function deviceNodes(devices: readonly PluginDevice[], iommufd: boolean, withContainer = true): string[] {
  const groups = [...new Set(devices.flatMap((d) => d.groups))].sort((a, b) => Number(a) - Number(b));
  const nodes = [...(withContainer ? [VFIO_CONTAINER] : []), ...groups.map((g) => `/dev/vfio/${g}`)];
  const cdevs = devices.flatMap((d) => d.cdevs);
  if (iommufd && cdevs.length > 0)
    nodes.push(...(withContainer ? [IOMMUFD] : []), ...cdevs.map((c) => `/dev/vfio/devices/${c}`));
  return nodes;
}

export type AllocateOutcome =
  | { ok: true; response: ContainerAllocation }
  | { ok: false; code: 'unknown' | 'refused'; problems: string[] };

function holderText(h: Holder): string {
  return `pid ${h.pid} (${h.comm}${h.guest !== undefined ? `, VM ${JSON.stringify(h.guest)}` : ''})`;
}

/**
 * One container's request, against a fresh inventory and the holders of the groups it touches. Refused when a
 * device is unknown or unhealthy, or its group is held open by another process (a VM of a deleted pod, say).
 */
export function allocateContainer(
  inv: ResourceInventory,
  ids: readonly string[],
  ctx: { iommufd: boolean; cdi: boolean; holders: Map<string, Holder[]> },
): AllocateOutcome {
  const name = inv.resource.resourceName;
  const byId = new Map(inv.devices.map((d) => [d.id, d]));
  const unknown = ids.filter((id) => !byId.has(id));
  if (unknown.length > 0)
    return {
      ok: false,
      code: 'unknown',
      problems: unknown.map((id) => `device ${id} of ${name} is unknown: this node does not offer it (any more)`),
    };
  const picked = [...new Set(ids)].map((id) => byId.get(id)!);
  const problems: string[] = [];
  for (const d of picked) {
    if (d.problem !== undefined) problems.push(`device ${d.id} of ${name} is unhealthy: ${d.problem.text}`);
    for (const g of d.groups) {
      const held = ctx.holders.get(g) ?? [];
      if (held.length > 0)
        problems.push(
          `device ${d.id} of ${name}: its IOMMU group ${g} (/dev/vfio/${g}) is held open by ` +
            `${held.map(holderText).join(', ')}: a group is opened by one process at a time; stop that process (a ` +
            `VM of a deleted pod?) or allocate another device`,
        );
    }
  }
  if (problems.length > 0) return { ok: false, code: 'refused', problems };
  const addresses = [...new Set(picked.flatMap((d) => d.functions))].sort();
  return {
    ok: true,
    response: {
      envs: { [envName(name)]: addresses.join(',') },
      devices: deviceNodes(picked, ctx.iommufd).map((p) => ({ container_path: p, host_path: p, permissions: 'rw' })),
      cdi_devices: ctx.cdi ? picked.map((d) => ({ name: `${name}=${d.id}` })) : [],
    },
  };
}

/** The CDI spec version written: 0.5.0 for device names that start with a digit, 0.6.0 for a "." in the class. */
export const CDI_VERSION = '0.6.0';

export interface CdiSpecOut {
  cdiVersion: string;
  kind: string;
  containerEdits: { deviceNodes: { path: string; permissions: string }[] };
  devices: { name: string; containerEdits: { env: string[]; deviceNodes: { path: string; permissions: string }[] } }[];
}

/**
 * The resource's CDI spec: kind = the resource name, one device per kubelet device, each with its group nodes,
 * iommufd nodes and PCIDEVICE_<RESOURCE> naming its functions (a group node alone does not say which functions were
 * allocated); /dev/vfio/vfio (and /dev/iommu) for any of them. undefined when there is no device (a spec needs one).
 */
export function cdiSpec(inv: ResourceInventory, iommufd: boolean): CdiSpecOut | undefined {
  if (inv.devices.length === 0) return undefined;
  const rw = (path: string) => ({ path, permissions: 'rw' });
  const common = [VFIO_CONTAINER, ...(iommufd && inv.devices.some((d) => d.cdevs.length > 0) ? [IOMMUFD] : [])];
  return {
    cdiVersion: CDI_VERSION,
    kind: inv.resource.resourceName,
    containerEdits: { deviceNodes: common.map(rw) },
    devices: inv.devices.map((d) => ({
      name: d.id,
      containerEdits: {
        env: [`${envName(inv.resource.resourceName)}=${d.functions.join(',')}`],
        deviceNodes: deviceNodes([d], iommufd, false).map(rw),
      },
    })),
  };
}
