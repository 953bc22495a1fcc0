// Input: the CRI devices of a VM pod (kubelet's DeviceSpecs in the sandbox's container config), which the VM
// runtime forwards to vmwrapper as VMPOD_CRI_DEVICES (a JSON list of CRI Devices, set with libvirt's <qemu:env>).
// devices.md: Virtlet turned every one of them into a disk, so /dev/vfio/vfio became -drive and qemu failed with
// "Could not refresh total sector count: Illegal seek". A VFIO node is PCI passthrough, never a disk.
import { statSync } from 'node:fs';
import { ErrorCode, VmpodError } from '../errors.js';
import type { DeviceRequest } from './records.js';

/** The variable the VM runtime sets (libvirt <qemu:env name="VMPOD_CRI_DEVICES" value="[...]"/>). */
export const CRI_DEVICES_ENV = 'VMPOD_CRI_DEVICES';

export interface CriDevice {
  containerPath: string;
  hostPath: string;
  permissions: string;
}

export interface CriDeviceClasses {
  /** /dev/vfio/<N> and /dev/vfio/noiommu-<N>: an IOMMU group to pass through */
  vfioGroups: { group: string; noiommu: boolean; hostPath: string }[];
  /** /dev/vfio/vfio: the VFIO container node, needed by qemu, adds no device */
  vfioContainer: CriDevice[];
  /** block devices: disks */
  block: CriDevice[];
  other: CriDevice[];
}

// The vfio group node is named by the group number; vfio's no-IOMMU mode (CONFIG_VFIO_NOIOMMU) prefixes "noiommu-".
const GROUP_NODE_RE = /^\/dev\/vfio\/(noiommu-)?(\d+)$/;
const CONTAINER_NODE = '/dev/vfio/vfio';

function str(o: Record<string, unknown>, camel: string, snake: string): string | undefined {
  const v = o[camel] ?? o[snake];
  return typeof v === 'string' ? v : undefined;
}

/**
 * A JSON array of CRI devices, in the CRI's camelCase (containerPath, hostPath, permissions) or the protobuf's
 * snake_case (container_path, host_path). `what` names the source in errors (e.g. "VMPOD_CRI_DEVICES").
 */
export function parseCriDevices(json: string, what: string): CriDevice[] {
  let v: unknown;
  try {
    v = JSON.parse(json);
  } catch (e) {
    throw new VmpodError(ErrorCode.BadRequest, `${what}=${JSON.stringify(json)} is not JSON`, { cause: e });
  }
  if (v === null) return [];
  if (!Array.isArray(v))
    throw new VmpodError(ErrorCode.BadRequest, `${what}=${JSON.stringify(json)} is not a JSON array`);
  const problems: string[] = [];
  const out: CriDevice[] = [];
  v.forEach((d: unknown, i) => {
    if (typeof d !== 'object' || d === null) {
      problems.push(`element ${i} ${JSON.stringify(d)} is not an object`);
      return;
    }
    const o = d as Record<string, unknown>;
    const hostPath = str(o, 'hostPath', 'host_path');
    const containerPath = str(o, 'containerPath', 'container_path') ?? hostPath;
    if (hostPath === undefined || hostPath === '' || !hostPath.startsWith('/')) {
      problems.push(`element ${i} ${JSON.stringify(d)} has no absolute hostPath`);
      return;
    }
    out.push({
      containerPath: containerPath ?? hostPath,
      hostPath,
      permissions: str(o, 'permissions', 'permissions') ?? 'rwm',
    });
  });
  if (problems.length > 0)
    throw new VmpodError(ErrorCode.BadRequest, `${what}=${JSON.stringify(json)}: ${problems.join('; ')}`);
  return out;
}

function isBlockDevice(p: string): boolean {
  try {
    return statSync(p).isBlockDevice();
  } catch {
    return false; // missing or unreadable: not something we can attach as a disk
  }
}

/** Sorts a VM pod's CRI devices. VFIO nodes are recognised by path (host or container side) before any stat. */
export function classifyCriDevices(devices: readonly CriDevice[]): CriDeviceClasses {
  const out: CriDeviceClasses = { vfioGroups: [], vfioContainer: [], block: [], other: [] };
  const seenGroups = new Set<string>();
  for (const d of devices) {
    const paths = [d.hostPath, d.containerPath];
    const m = paths.map((p) => GROUP_NODE_RE.exec(p)).find((x) => x !== null);
    if (m) {
      const group = m[2];
      if (!seenGroups.has(group)) {
        seenGroups.add(group);
        out.vfioGroups.push({ group, noiommu: m[1] !== undefined, hostPath: d.hostPath });
      }
    } else if (paths.includes(CONTAINER_NODE)) {
      out.vfioContainer.push(d);
    } else if (paths.some((p) => p.startsWith('/dev/vfio/'))) {
      out.other.push(d); // e.g. the iommufd cdev /dev/vfio/devices/vfioN: not a disk either
    } else if (isBlockDevice(d.hostPath)) {
      out.block.push(d);
    } else {
      out.other.push(d);
    }
  }
  return out;
}

/**
 * VMPOD_CRI_DEVICES as DeviceRequests: one per /dev/vfio/<N> (or noiommu-<N>) node. /dev/vfio/vfio adds nothing;
 * block and other nodes are not VFIO. A malformed value goes to `problems`.
 */
export function criRequests(env: Record<string, string | undefined>, problems: string[]): DeviceRequest[] {
  // the name Virtlet never had: say what it is called now rather than silently ignore it
  if (env['VIRTLET_DEVICES'] !== undefined && env[CRI_DEVICES_ENV] === undefined)
    problems.push(
      `VIRTLET_DEVICES is set: the variable is now called ${CRI_DEVICES_ENV} (same JSON list of CRI Devices)`,
    );
  const v = env[CRI_DEVICES_ENV];
  if (v === undefined || v.trim() === '') return [];
  try {
    return classifyCriDevices(parseCriDevices(v, CRI_DEVICES_ENV)).vfioGroups.map((g) => ({
      kind: 'group' as const,
      group: g.group,
      source: CRI_DEVICES_ENV,
      path: g.hostPath,
      noiommu: g.noiommu,
    }));
  } catch (e) {
    problems.push(e instanceof Error ? e.message : String(e));
    return [];
  }
}
