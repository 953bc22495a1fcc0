// The one step that turns every input's DeviceRequests into the functions a VM gets, with the checks. Pure: a
// function of the requests and the HostFacts read before it.
//
// Only what was allocated is passed (KubeVirt's rule): a named function is passed alone, never its whole IOMMU
// group. A group named only by its /dev/vfio/<N> node (CRI devices, a CDI spec that names no function) is passed
// whole, unless another input names functions in it (then the node is just the allocated function's group).
// Checks (devices.md): every passed function on a vfio driver; every other member of its group on a vfio driver,
// pci-stub or no driver (bridges aside), as the kernel's viability rule has it; no no-IOMMU group; no group held
// open by another process.
import { isBridgeClass, isVfioDriverName, PCI_STUB_DRIVER, PCIEPORT_DRIVER } from './pci.js';
import type { DeviceReport, DeviceRequest, FunctionFacts, GroupFacts, Holder, HostFacts, ResolvedDevice } from './records.js';

function from(r: DeviceRequest): string {
  return r.origin !== undefined ? `from ${r.source}=${JSON.stringify(r.origin)}` : `from ${r.source}`;
}

function hex(cls: number): string {
  return `0x${cls.toString(16).padStart(6, '0')}`;
}

/** Bridges (host bridge, PCI-to-PCI bridge, anything on pcieport) stay with the host and do not affect viability. */
export function isBridge(f: FunctionFacts): boolean {
  return isBridgeClass(f.class) || f.driver === PCIEPORT_DRIVER;
}

/** The kernel's viability rule for one group member: absent, a bridge, unbound, on pci-stub or on a vfio driver. */
export function leavesGroupViable(m: FunctionFacts): boolean {
  return !m.exists || isBridge(m) || m.driver === undefined || m.driver === PCI_STUB_DRIVER || isVfioBound(m);
}

export function isVfioBound(f: FunctionFacts): boolean {
  return f.vfioDev !== undefined || isVfioDriverName(f.driver);
}

function holderText(h: Holder): string {
  return `pid ${h.pid} (${h.comm}${h.guest !== undefined ? `, VM ${JSON.stringify(h.guest)}` : ''})`;
}

export function mergeDevices(requests: readonly DeviceRequest[], facts: HostFacts): DeviceReport {
  const problems: string[] = [];
  const devices: ResolvedDevice[] = [];
  const seen = new Set<string>();
  const sys = (rel: string) => `${facts.sysfsRoot.replace(/\/$/, '')}/${rel}`;
  /** the request that brought each group in, for the messages */
  const groupUsers = new Map<string, string>();
  const add = (d: ResolvedDevice, why: string) => {
    const key = d.sysfsdev ?? d.address;
    if (seen.has(key)) return;
    seen.add(key);
    devices.push(d);
    if (d.group !== undefined && !groupUsers.has(d.group)) groupUsers.set(d.group, why);
  };
  const noiommuText = (group: string, node: string, why: string) =>
    `IOMMU group ${group} (${why}) is a vfio no-IOMMU group (${node}): a VM cannot use it (no DMA isolation; qemu opens only /dev/vfio/<N>); boot the host with its IOMMU on (intel_iommu=on or amd_iommu=on) and without vfio.enable_unsafe_noiommu_mode`;

  // 1. named functions and mediated devices, in input order (the first source that names one is its source)
  for (const r of requests) {
    if (r.kind === 'pci') {
      const what = `${r.address} (${from(r)})`;
      const f = facts.functions.get(r.address);
      if (f === undefined || !f.exists) {
        problems.push(`${what} does not exist under ${sys('bus/pci/devices')}`);
        continue;
      }
      if (isBridgeClass(f.class)) {
        problems.push(`${what} is a PCI bridge (class ${hex(f.class)}) and cannot be passed through`);
        continue;
      }
      if (r.noiommu) {
        problems.push(noiommuText(r.group ?? f.group ?? '?', `/dev/vfio/noiommu-${r.group ?? f.group ?? '?'}`, what));
        continue;
      }
      if (r.group !== undefined && f.group !== undefined && r.group !== f.group) {
        problems.push(`${what}: ${r.source} says IOMMU group ${r.group}, sysfs says ${f.group}`);
        continue;
      }
      if (f.group === undefined) {
        problems.push(`${what} has no IOMMU group (no ${sys(`bus/pci/devices/${r.address}/iommu_group`)}): boot the host with its IOMMU on (intel_iommu=on or amd_iommu=on)`);
        continue;
      }
      const d: ResolvedDevice = { address: f.address, group: f.group, source: r.source };
      if (f.driver !== undefined) d.driver = f.driver;
      add(d, what);
    } else if (r.kind === 'mdev') {
      const m = facts.mdevs.get(r.uuid);
      const what = `mediated device ${r.uuid} (${from(r)})`;
      if (m === undefined || m === null) problems.push(`${what} does not exist under ${sys('bus/mdev/devices')}`);
      else if (m.parent === undefined) problems.push(`${what} has no PCI parent`);
      else add({ address: m.parent, sysfsdev: m.sysfsdev, source: r.source }, what);
    }
  }

  // 2. groups named by their node
  for (const r of requests) {
    if (r.kind !== 'group') continue;
    const named = `${r.path} from ${r.source}${r.origin !== undefined ? ` in ${r.origin}` : ''}`;
    const what = `IOMMU group ${r.group} (${named})`;
    if (r.noiommu) {
      problems.push(noiommuText(r.group, r.path, named));
      continue;
    }
    const g = facts.groups.get(r.group);
    const endpoints = (g?.members ?? []).filter((m) => m.exists && !isBridge(m));
    if (g === undefined || (endpoints.length === 0 && g.mdevs.length === 0)) {
      problems.push(`${what} has no devices under ${sys(`kernel/iommu_groups/${r.group}/devices`)}`);
      continue;
    }
    const fnOf = (m: FunctionFacts): ResolvedDevice => ({ address: m.address, group: r.group, source: r.source, ...(m.driver !== undefined ? { driver: m.driver } : {}) });
    if (r.only !== undefined) {
      // the source names functions (a CDI spec's env or annotations): those of this group, and only those
      const picked = endpoints.filter((m) => r.only!.includes(m.address));
      if (picked.length === 0) problems.push(`${what} names ${r.only.join(', ')}, none of which is in that group (members: ${endpoints.map((m) => m.address).join(', ')})`);
      for (const m of picked) add(fnOf(m), what);
      continue;
    }
    if (devices.some((d) => d.group === r.group)) continue; // the node of a function named elsewhere
    for (const m of endpoints) add(fnOf(m), what);
    for (const m of g.mdevs) add({ address: m.parent, sysfsdev: m.sysfsdev, group: r.group, source: r.source }, what);
  }

  // 3. checks: each passed function, then each group as a whole
  for (const d of devices) {
    if (d.sysfsdev !== undefined) continue; // a mediated device stays on its parent's vendor driver
    const f = facts.groups.get(d.group!)?.members.find((m) => m.address === d.address) ?? facts.functions.get(d.address);
    if (f !== undefined && !isVfioBound(f))
      problems.push(
        `${d.address} (from ${d.source}) is bound to ${f.driver ?? 'no driver'}, not to a vfio driver: bind it to vfio-pci (echo vfio-pci > ${sys(`bus/pci/devices/${d.address}/driver_override`)}; echo ${d.address} > ${sys(`bus/pci/devices/${d.address}/driver/unbind`)}; echo ${d.address} > ${sys('bus/pci/drivers_probe')})`,
      );
  }
  const passed = new Set(devices.map((d) => d.address));
  for (const [group, why] of groupUsers) {
    const g: GroupFacts | undefined = facts.groups.get(group);
    if (g === undefined) continue;
    if (g.noiommu !== undefined) {
      problems.push(noiommuText(group, `/dev/vfio/noiommu-${group}`, `${why}; ${g.noiommu}`));
      continue;
    }
    for (const m of g.members) {
      if (passed.has(m.address) || leavesGroupViable(m)) continue;
      problems.push(
        `IOMMU group ${group} of ${why} is not viable: its other member ${m.address} (not allocated to this pod) is bound to ${m.driver}; the kernel gives a group to a VM only when every member is on a vfio driver, pci-stub or no driver: unbind it (echo ${m.address} > ${sys(`bus/pci/devices/${m.address}/driver/unbind`)}) or bind it to vfio-pci, or allocate a function from another group`,
      );
    }
    if (g.holders.length > 0)
      problems.push(
        `/dev/vfio/${group} (IOMMU group ${group} of ${why}) is held open by ${g.holders.map(holderText).join(', ')}: a group is opened by one process at a time, so its other functions are in use by that process; stop it, or allocate a function from another group`,
      );
  }
  return { devices, problems, skipped: [] };
}
