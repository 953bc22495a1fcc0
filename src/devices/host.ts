// Reads the HostFacts the merge step needs: PCI functions, their IOMMU groups, no-IOMMU marks, and which process
// holds a group open. sysfs under the sysfs root; /dev and /proc under the host root (VMPOD_DEV_ROOT, default "/"),
// so tests fake all three.
import { existsSync, readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { join } from 'node:path';
import { isPciAddress, MDEV_UUID_RE } from './pci.js';
import type { Sysfs } from './sysfs.js';
import type { DeviceRequest, FunctionFacts, GroupFacts, Holder, HostFacts } from './records.js';

/** "/", unless VMPOD_DEV_ROOT says otherwise: /dev and /proc are read under it. */
export function hostRoot(env: Record<string, string | undefined> = process.env): string {
  return env['VMPOD_DEV_ROOT'] || '/';
}

/** The sysfs name of a vfio no-IOMMU group (drivers/vfio/group.c). */
const NOIOMMU_GROUP_NAME = 'vfio-noiommu';

export function functionFacts(sysfs: Sysfs, address: string): FunctionFacts {
  const d = sysfs.pciDevice(address);
  if (d === undefined) return { address, exists: false, class: 0 };
  const f: FunctionFacts = { address: d.address, exists: true, class: d.class };
  if (d.driver !== undefined) f.driver = d.driver;
  if (d.iommuGroup !== undefined) f.group = d.iommuGroup;
  const vfioDev = sysfs.list(`bus/pci/devices/${d.address}/vfio-dev`).find((e) => /^vfio\d+$/.test(e));
  if (vfioDev !== undefined) f.vfioDev = vfioDev;
  return f;
}

/** argv of a process from /proc/<pid>/cmdline; qemu's "-name guest=<n>,..." or "-name <n>". */
function guestName(cmdline: string): string | undefined {
  const argv = cmdline.split('\0');
  const i = argv.indexOf('-name');
  if (i < 0 || argv[i + 1] === undefined) return undefined;
  const v = argv[i + 1]!;
  const m = /(?:^|,)guest=((?:[^,]|,,)*)/.exec(v);
  return (m ? m[1]! : v.split(',')[0]!).replace(/,,/g, ',');
}

/**
 * Processes holding any of `nodes` open, as fuser finds them: every /proc/<pid>/fd/<n> link whose target is the
 * node. Processes we may not look into are skipped (a non-root caller sees its own only). Our own pid is left out.
 */
export function findHolders(root: string, nodes: Map<string, string>): Map<string, Holder[]> {
  const out = new Map<string, Holder[]>();
  if (nodes.size === 0) return out;
  const proc = join(root, 'proc');
  let pids: string[];
  try {
    pids = readdirSync(proc).filter((e) => /^\d+$/.test(e));
  } catch {
    return out;
  }
  for (const pid of pids) {
    if (Number(pid) === process.pid) continue;
    let fds: string[];
    try {
      fds = readdirSync(join(proc, pid, 'fd'));
    } catch {
      continue; // gone, or not ours to see
    }
    const groups = new Set<string>();
    for (const fd of fds) {
      let target: string;
      try {
        target = readlinkSync(join(proc, pid, 'fd', fd));
      } catch {
        continue;
      }
      const g = nodes.get(target);
      if (g !== undefined) groups.add(g);
    }
    if (groups.size === 0) continue;
    const read = (f: string) => {
      try {
        return readFileSync(join(proc, pid, f), 'utf8');
      } catch {
        return '';
      }
    };
    const h: Holder = { pid: Number(pid), comm: read('comm').trim() || '?' };
    const guest = guestName(read('cmdline'));
    if (guest !== undefined) h.guest = guest;
    for (const g of groups) out.set(g, [...(out.get(g) ?? []), h]);
  }
  return out;
}

/** A group's members (bridges included), mediated devices and no-IOMMU mark; holders are left empty (findHolders). */
export function groupFacts(sysfs: Sysfs, root: string, group: string): GroupFacts {
  const members: FunctionFacts[] = [];
  const mdevs: GroupFacts['mdevs'] = [];
  for (const e of sysfs.list(`kernel/iommu_groups/${group}/devices`)) {
    if (isPciAddress(e)) members.push(functionFacts(sysfs, e.toLowerCase()));
    else if (MDEV_UUID_RE.test(e)) {
      const m = sysfs.mdevDevice(e);
      if (m?.parent !== undefined)
        mdevs.push({ uuid: e, parent: m.parent, sysfsdev: sysfs.path(`bus/mdev/devices/${e}`) });
    }
  }
  const g: GroupFacts = { group, members, mdevs, holders: [] };
  const name = sysfs.readText(`kernel/iommu_groups/${group}/name`);
  const node = join(root, `dev/vfio/noiommu-${group}`);
  if (name === NOIOMMU_GROUP_NAME)
    g.noiommu = `${sysfs.path(`kernel/iommu_groups/${group}/name`)} is "${NOIOMMU_GROUP_NAME}"`;
  else if (existsSync(node)) g.noiommu = `${node} exists`;
  return g;
}

/** Everything mergeDevices needs to decide about `requests`, read once. */
export function readHostFacts(requests: readonly DeviceRequest[], sysfs: Sysfs, root: string): HostFacts {
  const facts: HostFacts = { sysfsRoot: sysfs.root, functions: new Map(), groups: new Map(), mdevs: new Map() };
  const groups = new Set<string>();
  for (const r of requests) {
    if (r.kind === 'pci') {
      if (!facts.functions.has(r.address)) facts.functions.set(r.address, functionFacts(sysfs, r.address));
      const g = facts.functions.get(r.address)!.group;
      if (g !== undefined) groups.add(g);
    } else if (r.kind === 'group') {
      groups.add(r.group);
    } else if (!facts.mdevs.has(r.uuid)) {
      const m = sysfs.mdevDevice(r.uuid);
      facts.mdevs.set(
        r.uuid,
        m === undefined
          ? null
          : {
              ...(m.parent !== undefined ? { parent: m.parent } : {}),
              sysfsdev: sysfs.path(`bus/mdev/devices/${r.uuid}`),
            },
      );
    }
  }
  const nodes = new Map<string, string>();
  for (const g of groups) {
    facts.groups.set(g, groupFacts(sysfs, root, g));
    nodes.set(`/dev/vfio/${g}`, g);
    nodes.set(join(root, `dev/vfio/${g}`), g);
  }
  for (const [g, holders] of findHolders(root, nodes)) facts.groups.get(g)!.holders = holders;
  return facts;
}
