// The whole qemu argv: libvirt's arguments unchanged, then our NICs, then our passed-through devices.
// Pure: a function of its inputs (style: Kata LaunchQemu only concatenates what each device renders).
import { ErrorCode, VmpodError } from '../errors.js';
import { IdAllocator, usedIds } from './ids.js';
import { isQ35, usedPcieNumbers } from './machine.js';
import { QemuNetdev } from './netdev.js';
import type { TapNet, VfioDev } from './types.js';
import { QemuPcieRootPort, QemuVfioDevice } from './vfio.js';

/** libvirt numbers its own root ports' chassis from 1 and their ports from 0x10; we take the next free ones. */
const FIRST_CHASSIS = 1;
const FIRST_PORT = 0x10;

function firstFree(used: Set<number>, from: number): number {
  let n = from;
  while (used.has(n)) n++;
  used.add(n);
  return n;
}

function duplicates<T>(xs: T[]): T[] {
  return [...new Set(xs.filter((x, i) => xs.indexOf(x) !== i))];
}

/**
 * Validates everything first and throws one VmpodError(BadRequest) listing every problem; renders nothing
 * when anything is wrong.
 */
export function buildQemuArgv(
  libvirtArgs: readonly string[],
  nets: readonly TapNet[],
  vfio: readonly VfioDev[],
): string[] {
  const netdevs = nets.map((n) => new QemuNetdev(n));
  const hostdevs = vfio.map((d) => new QemuVfioDevice(d));
  const q35 = isQ35(libvirtArgs);

  const problems: string[] = [];
  netdevs.forEach((nd, i) => {
    for (const p of nd.validate()) problems.push(`net ${i} (index ${String(nd.net.index)}): ${p}`);
  });
  hostdevs.forEach((hd, i) => {
    for (const p of hd.validate())
      problems.push(`vfio ${i} (${String(hd.dev.address)} from ${String(hd.dev.source)}): ${p}`);
  });
  for (const x of duplicates(nets.map((n) => n.index))) problems.push(`net index ${x} given twice`);
  for (const x of duplicates(nets.flatMap((n) => n.fds ?? [])))
    problems.push(`fd ${x} given to more than one interface or queue`);
  for (const x of duplicates(nets.map((n) => String(n.mac).toLowerCase()))) problems.push(`MAC ${x} given twice`);
  // a mediated device is named by its sysfs path; several can share one parent address
  for (const x of duplicates(vfio.map((d) => d.sysfsdev ?? d.address))) problems.push(`vfio device ${x} given twice`);

  const ports: QemuPcieRootPort[] = [];
  if (q35) {
    const used = usedPcieNumbers(libvirtArgs);
    for (let i = 0; i < hostdevs.length; i++) {
      const rp = new QemuPcieRootPort(firstFree(used.chassis, FIRST_CHASSIS), firstFree(used.ports, FIRST_PORT));
      for (const p of rp.validate()) problems.push(`pcie-root-port for vfio ${i}: ${p}`);
      ports.push(rp);
    }
  }
  if (problems.length > 0)
    throw new VmpodError(ErrorCode.BadRequest, `build qemu argv: ${problems.join('; ')}`, { op: 'qemu-argv' });

  const ids = new IdAllocator(usedIds(libvirtArgs));
  const out = [...libvirtArgs];
  for (const nd of netdevs) out.push(...nd.toArgs(ids));
  hostdevs.forEach((hd, i) => {
    if (q35) {
      // one root port per device, directly before it
      const rp = ports[i].toArgs(ids);
      out.push(...rp.args, ...hd.toArgs(ids, { bus: rp.id }));
    } else {
      // i440fx: qemu places the device on pci.0 itself
      out.push(...hd.toArgs(ids));
    }
  });
  return out;
}
