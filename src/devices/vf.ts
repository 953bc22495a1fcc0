// SR-IOV VFs for tapmanager: what binding a VF to vfio-pci needs, as a record (plan), then apply and undo.
// devices.md: a VF is detected by /sys/class/net/<if>/device/physfn; its MAC and VLAN are set on the PF
// ("ip link set <pf> vf <n> mac .. vlan .."), which the PF driver enforces whatever driver the VF is on.
import { ErrorCode, VmpodError } from '../errors.js';
import { bindToVfio, restoreDriver } from './bind.js';
import { parsePciAddress } from './pci.js';
import type { Sysfs } from './sysfs.js';

export interface VfDescription {
  ifname: string;
  address: string;
  pfAddress: string;
  pfIfname: string;
  vfIndex: number;
  /** the VF's driver before we touch it (iavf, mlx5_core, ...) */
  driver?: string;
  /** the VF netdev's current MAC (class/net/<if>/address) */
  mac?: string;
}

/** The VF's state as the PF reports it (ip link show <pf>: "vf <n> link/ether <mac> ... vlan <v>"). */
export interface VfLinkState {
  mac: string;
  vlan: number;
}

export interface VfSetupRecord {
  kind: 'vmpodVfSetupV1';
  ifname: string;
  pfIfname: string;
  vfIndex: number;
  address: string;
  originalDriver?: string;
  originalMac: string;
  originalVlan: number;
  /** what the guest gets: the pod's MAC and the CNI-assigned VLAN (0 = none) */
  mac: string;
  vlan: number;
}

/** Runs one program with an argument array (node:child_process in the daemon, a recorder in tests). */
export type RunArgv = (argv: string[]) => Promise<void>;

const MAC_RE = /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/;

/**
 * describeVf for a netdev known by the PCI address of its device, e.g. from `ip -d -j link` in another netns
 * (parentbus "pci", parentdev): /sys/class/net shows only the netns that mounted /sys, but bus/pci does not
 * depend on the netns. The PF's netdev is read from bus/pci/devices/<pf>/net (the PF stays in the host).
 * `mac` is the netdev's MAC as the caller saw it.
 */
export function describeVfAt(sysfs: Sysfs, ifname: string, address: string, mac?: string): VfDescription {
  const addr = parsePciAddress(address);
  const dev = sysfs.pciDevice(addr);
  if (dev === undefined)
    throw new VmpodError(
      ErrorCode.Device,
      `VF ${ifname}: no PCI device ${addr} under ${sysfs.path('bus/pci/devices')}`,
    );
  if (dev.physfn === undefined)
    throw new VmpodError(
      ErrorCode.Device,
      `${ifname} (${addr}) is not an SR-IOV VF (no ${sysfs.path(`bus/pci/devices/${addr}/physfn`)})`,
    );
  if (dev.virtfnIndex === undefined)
    throw new VmpodError(ErrorCode.Device, `${ifname} (${addr}): no virtfn link of PF ${dev.physfn} points to it`);
  const pfIfname = sysfs.pciNetInterfaces(dev.physfn)[0];
  if (pfIfname === undefined)
    throw new VmpodError(
      ErrorCode.Device,
      `VF ${ifname} (${addr}): its PF ${dev.physfn} has no network interface to set the VF's MAC and VLAN on`,
    );
  const d: VfDescription = { ifname, address: addr, pfAddress: dev.physfn, pfIfname, vfIndex: dev.virtfnIndex };
  if (dev.driver !== undefined) d.driver = dev.driver;
  if (mac !== undefined) d.mac = mac.toLowerCase();
  return d;
}

export function describeVf(sysfs: Sysfs, ifname: string): VfDescription {
  const vf = sysfs.vfInfo(ifname);
  if (vf.pfIfname === undefined)
    throw new VmpodError(
      ErrorCode.Device,
      `VF ${ifname} (${vf.address}): its PF ${vf.pfAddress} has no network interface to set the VF's MAC and VLAN on`,
    );
  const d: VfDescription = {
    ifname,
    address: vf.address,
    pfAddress: vf.pfAddress,
    pfIfname: vf.pfIfname,
    vfIndex: vf.vfIndex,
  };
  const driver = sysfs.pciDevice(vf.address)?.driver;
  if (driver !== undefined) d.driver = driver;
  const mac = sysfs.readText(`class/net/${ifname}/address`);
  if (mac !== undefined) d.mac = mac.toLowerCase();
  return d;
}

/**
 * The VF's MAC and VLAN from `ip -j link show dev <pf>` output. iproute2 prints "vlan_list":[{"vlan":..}] when
 * the kernel sends IFLA_VF_VLAN_LIST, else a plain "vlan" (omitted when 0).
 */
export function parseVfState(ipJson: string, vfIndex: number): VfLinkState {
  let links: unknown;
  try {
    links = JSON.parse(ipJson);
  } catch (e) {
    throw new VmpodError(ErrorCode.Device, `parse ip -j link output for VF ${vfIndex}`, { cause: e });
  }
  const list = Array.isArray(links) ? (links[0] as { vfinfo_list?: unknown } | undefined)?.vfinfo_list : undefined;
  const vf = Array.isArray(list) ? (list as Record<string, unknown>[]).find((v) => v['vf'] === vfIndex) : undefined;
  if (vf === undefined || typeof vf['address'] !== 'string')
    throw new VmpodError(ErrorCode.Device, `ip -j link output has no vfinfo for VF ${vfIndex}`);
  const vl = vf['vlan_list'];
  const first = Array.isArray(vl) ? (vl[0] as { vlan?: unknown } | undefined)?.vlan : vf['vlan'];
  return { mac: vf['address'].toLowerCase(), vlan: typeof first === 'number' ? first : 0 };
}

/** The record, written before anything is applied, so that undo knows what to restore. Pure. */
export function planVfSetup(
  desc: VfDescription,
  original: VfLinkState,
  want: { mac: string; vlan?: number },
): VfSetupRecord {
  const mac = want.mac.toLowerCase();
  const vlan = want.vlan ?? 0;
  const problems: string[] = [];
  if (!MAC_RE.test(mac)) problems.push(`MAC ${JSON.stringify(want.mac)} is not colon-hex of 6 bytes`);
  // 802.1Q VLAN ids 1..4094 (0 = untagged; 4095 reserved)
  if (!(Number.isInteger(vlan) && vlan >= 0 && vlan <= 4094))
    problems.push(`VLAN ${JSON.stringify(want.vlan)} is outside 0..4094`);
  if (problems.length > 0)
    throw new VmpodError(ErrorCode.BadRequest, `plan VF ${desc.ifname} setup: ${problems.join('; ')}`);
  const rec: VfSetupRecord = {
    kind: 'vmpodVfSetupV1',
    ifname: desc.ifname,
    pfIfname: desc.pfIfname,
    vfIndex: desc.vfIndex,
    address: desc.address,
    originalMac: original.mac.toLowerCase(),
    originalVlan: original.vlan,
    mac,
    vlan,
  };
  if (desc.driver !== undefined) rec.originalDriver = desc.driver;
  return rec;
}

export function vfLinkArgv(pfIfname: string, vfIndex: number, mac: string, vlan: number): string[] {
  return ['ip', 'link', 'set', pfIfname, 'vf', String(vfIndex), 'mac', mac, 'vlan', String(vlan)];
}

/** Set the VF's MAC and VLAN on the PF, then hand the VF to vfio-pci. */
export async function applyVfSetup(sysfs: Sysfs, rec: VfSetupRecord, run: RunArgv): Promise<void> {
  try {
    await run(vfLinkArgv(rec.pfIfname, rec.vfIndex, rec.mac, rec.vlan));
  } catch (e) {
    throw new VmpodError(
      ErrorCode.Device,
      `set MAC ${rec.mac} VLAN ${rec.vlan} on VF ${rec.vfIndex} of ${rec.pfIfname}`,
      { cause: e },
    );
  }
  bindToVfio(sysfs, rec.address);
}

/** Give the VF back to its driver, restore its MAC and VLAN. Keeps going past a failing step; reports all. */
export async function undoVfSetup(sysfs: Sysfs, rec: VfSetupRecord, run: RunArgv): Promise<void> {
  const errors: unknown[] = [];
  try {
    restoreDriver(sysfs, rec.address, rec.originalDriver);
  } catch (e) {
    errors.push(e);
  }
  try {
    await run(vfLinkArgv(rec.pfIfname, rec.vfIndex, rec.originalMac, rec.originalVlan));
  } catch (e) {
    errors.push(
      new VmpodError(
        ErrorCode.Device,
        `restore MAC ${rec.originalMac} VLAN ${rec.originalVlan} on VF ${rec.vfIndex} of ${rec.pfIfname}`,
        { cause: e },
      ),
    );
  }
  if (errors.length > 0)
    throw new VmpodError(ErrorCode.Device, `undo VF setup of ${rec.ifname} (${rec.address})`, {
      cause: errors.length === 1 ? errors[0] : new AggregateError(errors, `${errors.length} steps failed`),
    });
}
