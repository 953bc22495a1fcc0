// VFIO devices that device plugins assigned to the pod, from the environment kubelet gave the container
// (devices.md "What a device plugin hands the pod"). Parse everything first (BadRequest, nothing touched),
// then resolve against sysfs (Device), then report every problem at once.
import { ErrorCode, VmpodError } from '../errors.js';
import type { VfioDev } from '../qemu/types.js';
import { classifyCriDevices, parseCriDevices } from './cri.js';
import { isBridgeClass, isPciAddress, MDEV_UUID_RE, parsePciAddress, VFIO_PCI_DRIVER } from './pci.js';
import type { Sysfs } from './sysfs.js';

/** Environment conventions (a closed vocabulary: the order is the order sources are read, first wins). */
export const EnvConvention = {
  /** SR-IOV network device plugin: PCIDEVICE_<RESOURCE>=addr,addr + PCIDEVICE_<RESOURCE>_INFO (JSON) twin */
  SriovDp: 'PCIDEVICE_',
  /** KubeVirt / NVIDIA GPU plugin: PCI_RESOURCE_<RESOURCE>=addr,addr[,] */
  PciResource: 'PCI_RESOURCE_',
  /** KubeVirt mediated devices: MDEV_PCI_RESOURCE_<RESOURCE>=uuid,uuid */
  MdevResource: 'MDEV_PCI_RESOURCE_',
  /** Intel QAT plugin in vfio-pci mode: QAT<n>=addr, one per device */
  Qat: 'QAT',
  /** Virtlet's CRI device list (JSON array), /dev/vfio/<N> nodes among them */
  VirtletDevices: 'VIRTLET_DEVICES',
} as const;

type Request =
  | { kind: 'pci'; source: string; value: string; address: string; twinGroup?: string }
  | { kind: 'group'; source: string; value: string; group: string }
  | { kind: 'mdev'; source: string; value: string; uuid: string };

const QAT_RE = /^QAT(\d+)$/;
const GROUP_NODE_RE = /^\/dev\/vfio\/(?:noiommu-)?(\d+)$/;

function show(name: string, value: string): string {
  return `${name}=${JSON.stringify(value)}`;
}

/** "a, b," -> ["a","b"]: a trailing comma occurs in PCI_RESOURCE_* (devices.md). */
function splitList(v: string): string[] {
  return v
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s !== '');
}

/** A variable ending in _INFO whose value is a JSON object is the SR-IOV plugin's twin, not a resource. */
function isInfoTwin(name: string, value: string): boolean {
  return name.endsWith('_INFO') && value.trimStart().startsWith('{');
}

/** address -> IOMMU group, from the twin's {"<addr>":{"vfio":{"dev-mount":"/dev/vfio/145"}}}. */
function parseInfoTwin(name: string, value: string, problems: string[]): Map<string, string> {
  const groups = new Map<string, string>();
  let o: unknown;
  try {
    o = JSON.parse(value);
  } catch {
    problems.push(`${show(name, value)} is not JSON`);
    return groups;
  }
  if (typeof o !== 'object' || o === null || Array.isArray(o)) {
    problems.push(`${show(name, value)} is not a JSON object keyed by PCI address`);
    return groups;
  }
  for (const [addr, entry] of Object.entries(o as Record<string, unknown>)) {
    const mount = (entry as { vfio?: { 'dev-mount'?: unknown } } | null)?.vfio?.['dev-mount'];
    if (mount === undefined) continue; // a netdevice-mode entry: no VFIO group to take
    const m = typeof mount === 'string' ? GROUP_NODE_RE.exec(mount) : null;
    if (!m) {
      problems.push(`${name}: dev-mount ${JSON.stringify(mount)} of ${addr} is not /dev/vfio/<group>`);
      continue;
    }
    try {
      groups.set(parsePciAddress(addr), m[1]);
    } catch {
      problems.push(`${name}: key ${JSON.stringify(addr)} is not a PCI address`);
    }
  }
  return groups;
}

function pciList(name: string, value: string, problems: string[], twin?: Map<string, string>): Request[] {
  const out: Request[] = [];
  for (const item of splitList(value)) {
    try {
      const address = parsePciAddress(item);
      const twinGroup = twin?.get(address);
      out.push(twinGroup === undefined ? { kind: 'pci', source: name, value, address } : { kind: 'pci', source: name, value, address, twinGroup });
    } catch {
      problems.push(`${show(name, value)}: ${JSON.stringify(item)} is not a PCI address`);
    }
  }
  return out;
}

/** Every variable of every convention, in convention order, each convention's variables sorted by name. */
function parseEnv(env: Record<string, string | undefined>, problems: string[]): Request[] {
  const vars = Object.entries(env).filter((e): e is [string, string] => typeof e[1] === 'string');
  const named = (prefix: string) => vars.filter(([k]) => k.startsWith(prefix) && k.length > prefix.length).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const reqs: Request[] = [];

  for (const [name, value] of named(EnvConvention.SriovDp)) {
    if (isInfoTwin(name, value)) continue;
    const twinName = `${name}_INFO`;
    const twinValue = env[twinName];
    const twin = twinValue !== undefined ? parseInfoTwin(twinName, twinValue, problems) : undefined;
    reqs.push(...pciList(name, value, problems, twin));
  }
  for (const [name, value] of named(EnvConvention.PciResource)) reqs.push(...pciList(name, value, problems));
  for (const [name, value] of named(EnvConvention.MdevResource)) {
    for (const item of splitList(value)) {
      const uuid = item.toLowerCase();
      if (MDEV_UUID_RE.test(uuid)) reqs.push({ kind: 'mdev', source: name, value, uuid });
      else problems.push(`${show(name, value)}: ${JSON.stringify(item)} is not a mediated device uuid`);
    }
  }
  // QAT0, QAT1, ... numbered per container in no particular order: read them by number
  const qat = vars.filter(([k]) => QAT_RE.test(k)).sort(([a], [b]) => Number(QAT_RE.exec(a)![1]) - Number(QAT_RE.exec(b)![1]));
  for (const [name, value] of qat) {
    const items = splitList(value);
    if (items.length !== 1) problems.push(`${show(name, value)} is not one PCI address`);
    else reqs.push(...pciList(name, value, problems));
  }
  const vd = env[EnvConvention.VirtletDevices];
  if (vd !== undefined && vd.trim() !== '') {
    try {
      // /dev/vfio/vfio adds nothing; block and other nodes are not ours to handle here
      for (const g of classifyCriDevices(parseCriDevices(vd, EnvConvention.VirtletDevices)).vfioGroups)
        reqs.push({ kind: 'group', source: EnvConvention.VirtletDevices, value: g.hostPath, group: g.group });
    } catch (e) {
      problems.push(e instanceof Error ? e.message : String(e));
    }
  }
  return reqs;
}

/** Endpoints of an IOMMU group: PCI functions that are not bridges, and mediated devices. */
function groupMembers(sysfs: Sysfs, group: string, source: string): { pci: string[]; mdev: VfioDev[] } {
  const pci: string[] = [];
  const mdev: VfioDev[] = [];
  for (const e of sysfs.list(`kernel/iommu_groups/${group}/devices`)) {
    if (isPciAddress(e)) {
      const d = sysfs.pciDevice(e);
      if (d === undefined || !isBridgeClass(d.class)) pci.push(e.toLowerCase());
    } else if (MDEV_UUID_RE.test(e)) {
      const m = sysfs.mdevDevice(e);
      if (m?.parent !== undefined) mdev.push({ address: m.parent, sysfsdev: sysfs.path(`bus/mdev/devices/${e}`), source });
    }
  }
  return { pci, mdev };
}

/**
 * Every VFIO device the environment names, expanded to all endpoints of its IOMMU group (assignment granularity
 * is the group; bridges stay with the host), deduplicated (first source wins), each checked to be on vfio-pci.
 * Mediated devices are named by sysfsdev (rooted at the sysfs root) and keep their parent's driver.
 */
export function collectPluginDevices(env: Record<string, string | undefined>, sysfs: Sysfs): VfioDev[] {
  const bad: string[] = [];
  const reqs = parseEnv(env, bad);
  if (bad.length > 0) throw new VmpodError(ErrorCode.BadRequest, `collect plugin devices: ${bad.join('; ')}`, { op: 'collect-devices' });

  const problems: string[] = [];
  const out: VfioDev[] = [];
  const seen = new Set<string>();
  const add = (d: VfioDev) => {
    const key = d.sysfsdev ?? d.address;
    if (seen.has(key)) return;
    seen.add(key);
    out.push(d);
  };

  for (const r of reqs) {
    switch (r.kind) {
      case 'pci': {
        const from = `${r.address} (from ${show(r.source, r.value)})`;
        const dev = sysfs.pciDevice(r.address);
        if (dev === undefined) {
          problems.push(`${from} does not exist under ${sysfs.path('bus/pci/devices')}`);
          break;
        }
        if (isBridgeClass(dev.class)) {
          problems.push(`${from} is a PCI bridge (class 0x${dev.class.toString(16).padStart(6, '0')}) and cannot be passed through`);
          break;
        }
        if (r.twinGroup !== undefined && dev.iommuGroup !== undefined && r.twinGroup !== dev.iommuGroup) {
          problems.push(`${from}: ${r.source}_INFO says IOMMU group ${r.twinGroup}, sysfs says ${dev.iommuGroup}`);
          break;
        }
        const group = r.twinGroup ?? dev.iommuGroup;
        if (group === undefined) {
          problems.push(`${from} has no IOMMU group (no ${sysfs.path(`bus/pci/devices/${r.address}/iommu_group`)}; is the IOMMU or vfio no-IOMMU mode enabled?)`);
          break;
        }
        add({ address: r.address, source: r.source });
        const m = groupMembers(sysfs, group, r.source);
        for (const a of m.pci) add({ address: a, source: r.source });
        for (const d of m.mdev) add(d);
        break;
      }
      case 'group': {
        const m = groupMembers(sysfs, r.group, r.source);
        if (m.pci.length === 0 && m.mdev.length === 0) {
          problems.push(`IOMMU group ${r.group} (from ${r.source} ${r.value}) has no devices under ${sysfs.path(`kernel/iommu_groups/${r.group}/devices`)}`);
          break;
        }
        for (const a of m.pci) add({ address: a, source: r.source });
        for (const d of m.mdev) add(d);
        break;
      }
      case 'mdev': {
        const m = sysfs.mdevDevice(r.uuid);
        if (m === undefined) {
          problems.push(`mediated device ${r.uuid} (from ${show(r.source, r.value)}) does not exist under ${sysfs.path('bus/mdev/devices')}`);
          break;
        }
        if (m.parent === undefined) {
          problems.push(`mediated device ${r.uuid} (from ${show(r.source, r.value)}) has no PCI parent`);
          break;
        }
        add({ address: m.parent, sysfsdev: sysfs.path(`bus/mdev/devices/${r.uuid}`), source: r.source });
        break;
      }
      default: {
        const never: never = r;
        throw new VmpodError(ErrorCode.Internal, `unknown request ${JSON.stringify(never)}`);
      }
    }
  }

  // qemu's vfio-pci opens /dev/vfio/<group>: every endpoint of the group must be on vfio-pci, or the open fails
  for (const d of out) {
    if (d.sysfsdev !== undefined) continue;
    const driver = sysfs.pciDevice(d.address)?.driver;
    if (driver !== VFIO_PCI_DRIVER) problems.push(`${d.address} is bound to ${driver ?? 'no driver'}, not vfio-pci`);
  }
  if (problems.length > 0) throw new VmpodError(ErrorCode.Device, `collect plugin devices: ${problems.join('; ')}`, { op: 'collect-devices' });
  return out;
}
