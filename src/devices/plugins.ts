// Input: the VFIO devices device plugins assigned to the pod, from the environment kubelet gave the container
// (devices.md "What a device plugin hands the pod"), as DeviceRequests. Parsing only: no sysfs.
import { isObj } from '../guards.js';
import { MDEV_UUID_RE, parsePciAddress } from './pci.js';
import type { DeviceRequest } from './records.js';

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
} as const;

/** What a _INFO twin says about one address. */
interface TwinEntry {
  group?: string;
  noiommu?: boolean;
  /** the vdpa provider's mount (/dev/vhost-vdpa-<n>): a vDPA device, not VFIO */
  vdpa?: string;
}

const QAT_RE = /^QAT(\d+)$/;
const GROUP_NODE_RE = /^\/dev\/vfio\/(noiommu-)?(\d+)$/;

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

/**
 * address -> what the twin says: {"<addr>":{"vfio":{"dev-mount":"/dev/vfio/145"}}} gives the group;
 * {"<addr>":{"vdpa":{"mount":"/dev/vhost-vdpa-0"}}} marks a vDPA device. ("vhost" is /dev/vhost-net for any device.)
 */
function parseInfoTwin(name: string, value: string, problems: string[]): Map<string, TwinEntry> {
  const out = new Map<string, TwinEntry>();
  let o: unknown;
  try {
    o = JSON.parse(value);
  } catch {
    problems.push(`${show(name, value)} is not JSON`);
    return out;
  }
  if (!isObj(o)) {
    problems.push(`${show(name, value)} is not a JSON object keyed by PCI address`);
    return out;
  }
  for (const [addr, entry] of Object.entries(o)) {
    let address: string;
    try {
      address = parsePciAddress(addr);
    } catch {
      problems.push(`${name}: key ${JSON.stringify(addr)} is not a PCI address`);
      continue;
    }
    const e = (entry ?? {}) as { vfio?: { 'dev-mount'?: unknown }; vdpa?: { mount?: unknown } };
    const t: TwinEntry = {};
    if (e.vdpa !== undefined) t.vdpa = typeof e.vdpa?.mount === 'string' ? e.vdpa.mount : JSON.stringify(e.vdpa);
    const mount = e.vfio?.['dev-mount'];
    if (mount !== undefined) {
      const m = typeof mount === 'string' ? GROUP_NODE_RE.exec(mount) : null;
      if (!m) {
        problems.push(`${name}: dev-mount ${JSON.stringify(mount)} of ${addr} is not /dev/vfio/<group>`);
        continue;
      }
      t.group = m[2];
      if (m[1] !== undefined) t.noiommu = true;
    }
    out.set(address, t);
  }
  return out;
}

function pciList(name: string, value: string, problems: string[], twin?: Map<string, TwinEntry>): DeviceRequest[] {
  const out: DeviceRequest[] = [];
  for (const item of splitList(value)) {
    try {
      const address = parsePciAddress(item);
      const t = twin?.get(address);
      if (t?.vdpa !== undefined) {
        problems.push(
          `${address} (from ${show(name, value)}) is a vDPA device (${name}_INFO gives it the vhost-vdpa node ` +
            `${t.vdpa}): vmwrapper passes VFIO devices only, and vDPA is not supported by this binding; allocate it ` +
            `from a vfio-pci resource pool`,
        );
        continue;
      }
      out.push({
        kind: 'pci',
        source: name,
        origin: value,
        address,
        ...(t?.group !== undefined ? { group: t.group } : {}),
        ...(t?.noiommu ? { noiommu: true } : {}),
      });
    } catch {
      problems.push(`${show(name, value)}: ${JSON.stringify(item)} is not a PCI address`);
    }
  }
  return out;
}

/**
 * Every variable of every convention, in convention order, each convention's variables sorted by name.
 * Malformed values (and vDPA devices) go to `problems`, each naming the variable and its value.
 */
export function pluginEnvRequests(env: Record<string, string | undefined>, problems: string[]): DeviceRequest[] {
  const vars = Object.entries(env).filter((e): e is [string, string] => typeof e[1] === 'string');
  const named = (prefix: string) =>
    vars
      .filter(([k]) => k.startsWith(prefix) && k.length > prefix.length)
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const reqs: DeviceRequest[] = [];

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
      if (MDEV_UUID_RE.test(uuid)) reqs.push({ kind: 'mdev', source: name, origin: value, uuid });
      else problems.push(`${show(name, value)}: ${JSON.stringify(item)} is not a mediated device uuid`);
    }
  }
  // QAT0, QAT1, ... numbered per container in no particular order: read them by number
  const qat = vars
    .filter(([k]) => QAT_RE.test(k))
    .sort(([a], [b]) => Number(QAT_RE.exec(a)![1]) - Number(QAT_RE.exec(b)![1]));
  for (const [name, value] of qat) {
    const items = splitList(value);
    if (items.length !== 1) problems.push(`${show(name, value)} is not one PCI address`);
    else reqs.push(...pciList(name, value, problems));
  }
  return reqs;
}
