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
import type {
  DeviceReport,
  DeviceRequest,
  FunctionFacts,
  GroupFacts,
  Holder,
  HostFacts,
  ResolvedDevice,
} from './records.js';

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

/** What the merge builds up: the functions passed, the problems found, the request that brought each group in. */
interface Merge {
  facts: HostFacts;
  problems: string[];
  devices: ResolvedDevice[];
  seen: Set<string>;
  /** the request that brought each group in, for the messages */
  groupUsers: Map<string, string>;
  /** a path under the sysfs root, for the messages */
  sys: (rel: string) => string;
}

export function mergeDevices(requests: readonly DeviceRequest[], facts: HostFacts): DeviceReport {
  const m: Merge = {
    facts,
    problems: [],
    devices: [],
    seen: new Set(),
    groupUsers: new Map(),
    sys: (rel) => `${facts.sysfsRoot.replace(/\/$/, '')}/${rel}`,
  };
  // 1. named functions and mediated devices, in input order (the first source that names one is its source)
  for (const r of requests) {
    if (r.kind === 'pci') namedFunction(m, r);
    else if (r.kind === 'mdev') namedMdev(m, r);
  }
  // 2. groups named by their node
  for (const r of requests) if (r.kind === 'group') namedGroup(m, r);
  // 3. checks: each passed function, then each group as a whole
  checkDrivers(m);
  checkGroups(m);
  return { devices: m.devices, problems: m.problems, skipped: [] };
}

function add(m: Merge, d: ResolvedDevice, why: string): void {
  const key = d.sysfsdev ?? d.address;
  if (m.seen.has(key)) return;
  m.seen.add(key);
  m.devices.push(d);
  if (d.group !== undefined && !m.groupUsers.has(d.group)) m.groupUsers.set(d.group, why);
}

function noiommuText(group: string, node: string, why: string): string {
  return (
    `IOMMU group ${group} (${why}) is a vfio no-IOMMU group (${node}): a VM cannot use it (no DMA isolation; ` +
    `qemu opens only /dev/vfio/<N>); boot the host with its IOMMU on (intel_iommu=on or amd_iommu=on) and without ` +
    `vfio.enable_unsafe_noiommu_mode`
  );
}

function namedFunction(m: Merge, r: Extract<DeviceRequest, { kind: 'pci' }>): void {
  const what = `${r.address} (${from(r)})`;
  const f = m.facts.functions.get(r.address);
  const problem = (text: string): void => void m.problems.push(text);
  if (f === undefined || !f.exists) return problem(`${what} does not exist under ${m.sys('bus/pci/devices')}`);
  if (isBridgeClass(f.class))
    return problem(`${what} is a PCI bridge (class ${hex(f.class)}) and cannot be passed through`);
  if (r.noiommu)
    return problem(noiommuText(r.group ?? f.group ?? '?', `/dev/vfio/noiommu-${r.group ?? f.group ?? '?'}`, what));
  if (r.group !== undefined && f.group !== undefined && r.group !== f.group)
    return problem(`${what}: ${r.source} says IOMMU group ${r.group}, sysfs says ${f.group}`);
  if (f.group === undefined) {
    return problem(
      `${what} has no IOMMU group (no ${m.sys(`bus/pci/devices/${r.address}/iommu_group`)}): boot the host with its ` +
        `IOMMU on (intel_iommu=on or amd_iommu=on)`,
    );
  }
  const d: ResolvedDevice = { address: f.address, group: f.group, source: r.source };
  if (f.driver !== undefined) d.driver = f.driver;
  add(m, d, what);
}

function namedMdev(m: Merge, r: Extract<DeviceRequest, { kind: 'mdev' }>): void {
  const md = m.facts.mdevs.get(r.uuid);
  const what = `mediated device ${r.uuid} (${from(r)})`;
  if (md === undefined || md === null) m.problems.push(`${what} does not exist under ${m.sys('bus/mdev/devices')}`);
  else if (md.parent === undefined) m.problems.push(`${what} has no PCI parent`);
  else add(m, { address: md.parent, sysfsdev: md.sysfsdev, source: r.source }, what);
}

function namedGroup(m: Merge, r: Extract<DeviceRequest, { kind: 'group' }>): void {
  const named = `${r.path} from ${r.source}${r.origin !== undefined ? ` in ${r.origin}` : ''}`;
  const what = `IOMMU group ${r.group} (${named})`;
  if (r.noiommu) {
    m.problems.push(noiommuText(r.group, r.path, named));
    return;
  }
  const g = m.facts.groups.get(r.group);
  const endpoints = (g?.members ?? []).filter((f) => f.exists && !isBridge(f));
  if (g === undefined || (endpoints.length === 0 && g.mdevs.length === 0)) {
    m.problems.push(`${what} has no devices under ${m.sys(`kernel/iommu_groups/${r.group}/devices`)}`);
    return;
  }
  const fnOf = (f: FunctionFacts): ResolvedDevice => ({
    address: f.address,
    group: r.group,
    source: r.source,
    ...(f.driver !== undefined ? { driver: f.driver } : {}),
  });
  if (r.only !== undefined) {
    // the source names functions (a CDI spec's env or annotations): those of this group, and only those
    const picked = endpoints.filter((f) => r.only!.includes(f.address));
    if (picked.length === 0)
      m.problems.push(
        `${what} names ${r.only.join(', ')}, none of which is in that group (members: ` +
          `${endpoints.map((f) => f.address).join(', ')})`,
      );
    for (const f of picked) add(m, fnOf(f), what);
    return;
  }
  if (m.devices.some((d) => d.group === r.group)) return; // the node of a function named elsewhere
  for (const f of endpoints) add(m, fnOf(f), what);
  for (const md of g.mdevs)
    add(m, { address: md.parent, sysfsdev: md.sysfsdev, group: r.group, source: r.source }, what);
}

/** Every passed function on a vfio driver (a mediated device stays on its parent's vendor driver). */
function checkDrivers(m: Merge): void {
  for (const d of m.devices) {
    if (d.sysfsdev !== undefined) continue;
    const f =
      m.facts.groups.get(d.group!)?.members.find((x) => x.address === d.address) ?? m.facts.functions.get(d.address);
    if (f !== undefined && !isVfioBound(f))
      m.problems.push(
        `${d.address} (from ${d.source}) is bound to ${f.driver ?? 'no driver'}, not to a vfio driver: bind it to ` +
          `vfio-pci (echo vfio-pci > ${m.sys(`bus/pci/devices/${d.address}/driver_override`)}; echo ${d.address} > ` +
          `${m.sys(`bus/pci/devices/${d.address}/driver/unbind`)}; echo ${d.address} > ` +
          `${m.sys('bus/pci/drivers_probe')})`,
      );
  }
}

/** Each group passed: not no-IOMMU, viable (its other members on a vfio driver, pci-stub or none), not held open. */
function checkGroups(m: Merge): void {
  const passed = new Set(m.devices.map((d) => d.address));
  for (const [group, why] of m.groupUsers) {
    const g: GroupFacts | undefined = m.facts.groups.get(group);
    if (g === undefined) continue;
    if (g.noiommu !== undefined) {
      m.problems.push(noiommuText(group, `/dev/vfio/noiommu-${group}`, `${why}; ${g.noiommu}`));
      continue;
    }
    for (const f of g.members) {
      if (passed.has(f.address) || leavesGroupViable(f)) continue;
      m.problems.push(
        `IOMMU group ${group} of ${why} is not viable: its other member ${f.address} (not allocated to this pod) is ` +
          `bound to ${f.driver}; the kernel gives a group to a VM only when every member is on a vfio driver, ` +
          `pci-stub or no driver: unbind it (echo ${f.address} > ` +
          `${m.sys(`bus/pci/devices/${f.address}/driver/unbind`)}) or bind it to vfio-pci, or allocate a ` +
          `function from another group`,
      );
    }
    if (g.holders.length > 0)
      m.problems.push(
        `/dev/vfio/${group} (IOMMU group ${group} of ${why}) is held open by ` +
          `${g.holders.map(holderText).join(', ')}: a group is opened by one process at a time, so its other ` +
          `functions are in use by that process; stop it, or allocate a function from another group`,
      );
  }
}
