// SR-IOV VFs of the pod network, host side (enableSriov): which CNI interfaces are VFs (findVfs), what each one's
// vf-setup step records (planVfs), and the undo of the vf-* ops (the driver back, the PF's MAC/VLAN back, the
// netdev back into the pod netns). The ops themselves are src/devices'; this file reads sysfs and asks the PF.
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';
import { performance } from 'node:perf_hooks';
import { ErrorCode, VmpodError } from '../errors.js';
import type { Logger } from '../log.js';
import type { NetworkConfigList } from '../cni/index.js';
import type { CniResult } from '../cni/types.js';
import type { Sysfs } from '../devices/sysfs.js';
import { restoreDriver } from '../devices/bind.js';
import { isPciAddress } from '../devices/pci.js';
import {
  describeVfAt,
  parseVfState,
  planVfSetup,
  vfLinkArgv,
  type VfLinkState,
  type VfSetupRecord,
} from '../devices/vf.js';
import type { PodRecord } from '../state/record.js';
import type { NetExec } from './exec.js';
import { vlanFromConf } from './plan.js';
import { hasSandbox } from './result.js';
import type { Observed } from './types.js';

/**
 * Runs an `ip` argv (argv[0] = "ip") in the host netns and resolves with its stdout, rejecting on failure
 * (PodNetworkOptions.vfLink).
 */
export type VfLink = (argv: string[]) => Promise<string>;

/** The default VfLink: NetExec's ip, and nothing but ip. */
export function ipVfLink(exec: NetExec): VfLink {
  return async (argv) => {
    if (argv[0] !== 'ip')
      throw new VmpodError(ErrorCode.Internal, `vfLink runs ip only, not ${JSON.stringify(argv[0])}`);
    return exec.ip(argv.slice(1));
  };
}

/**
 * SR-IOV detection: name -> PCI address of every CNI interface in the pod netns that is a VF. The address is
 * `ip -d`'s parentbus "pci" / parentdev (IFLA_PARENT_DEV_NAME, Linux 5.14+); a VF is a PCI function with a
 * `physfn` link (bus/pci does not depend on the netns). Fallback without a parent device: the sysfs root's
 * class/net/<if>/device, but only on a tree that is not the live /sys, whose class/net shows our netns, where a
 * link of the same name would be another device (fake trees in tests map a dummy netdev to a PCI device there).
 */
export function findVfs(sysfs: Sysfs, observed: Observed, result: CniResult): Map<string, string> {
  const vfs = new Map<string, string>();
  const liveSysfs = resolve(sysfs.root) === '/sys';
  for (const ci of result.interfaces) {
    if (!hasSandbox(ci)) continue;
    const link = observed.links.find((l) => l.name === ci.name);
    if (!link) continue;
    let addr: string | undefined;
    if (link.parentBus === 'pci' && link.parentDev !== undefined && isPciAddress(link.parentDev))
      addr = link.parentDev.toLowerCase();
    else if (link.parentBus === undefined && !liveSysfs) addr = sysfs.netDevicePci(link.name);
    if (addr !== undefined && sysfs.exists(`bus/pci/devices/${addr}/physfn`)) vfs.set(link.name, addr);
  }
  return vfs;
}

/**
 * The record of each VF (planVfSetup), read before anything is touched: PF and index (sysfs), driver, the
 * VM's MAC = the netdev's MAC, the VF's current MAC and VLAN as its PF reports them (`ip -d -j link show dev
 * <pf>`, vfinfo_list; when unreadable: the netdev's MAC and VLAN 0). VLAN wanted: sriov-cni's `vlan` in the
 * conflist, else the one the PF already has for the VF (a CNI plugin set it), else 0.
 */
export async function planVfs(
  sysfs: Sysfs,
  vfLink: VfLink,
  observed: Observed,
  vfs: Map<string, string>,
  list: NetworkConfigList | undefined,
  log: Logger,
  signal?: AbortSignal,
): Promise<Map<string, VfSetupRecord>> {
  const out = new Map<string, VfSetupRecord>();
  const confVlan = list ? vlanFromConf(list.plugins) : undefined;
  for (const [name, address] of vfs) {
    signal?.throwIfAborted();
    const link = observed.links.find((l) => l.name === name)!;
    const desc = describeVfAt(sysfs, name, address, link.mac);
    let current: VfLinkState | undefined;
    try {
      current = parseVfState(await vfLink(['ip', '-d', '-j', 'link', 'show', 'dev', desc.pfIfname]), desc.vfIndex);
    } catch (e) {
      log.warn(
        { err: e, pf: desc.pfIfname, vf: desc.vfIndex },
        "the PF does not report the VF's MAC and VLAN: taking the netdev's MAC and VLAN 0 as the ones to restore",
      );
    }
    const original = current ?? { mac: link.mac, vlan: 0 };
    out.set(name, planVfSetup(desc, original, { mac: link.mac, vlan: confVlan ?? current?.vlan ?? 0 }));
  }
  return out;
}

/** Undo of vf-bind: the VF's original driver back. */
export function restoreVfDriver(sysfs: Sysfs, op: { address: string; driver?: string }, log: Logger): void {
  // a VF that is gone (its PF's sriov_numvfs lowered, the PF removed) has nothing left to restore
  if (sysfs.pciDevice(op.address) === undefined) {
    log.warn({ address: op.address }, 'the VF is gone: no driver to restore');
    return;
  }
  restoreDriver(sysfs, op.address, op.driver);
}

/** Undo of vf-link: the MAC and VLAN the PF had for the VF before. */
export async function restoreVfLink(
  vfLink: VfLink,
  sysfs: Sysfs,
  op: { pf: string; vf: number; mac: string; vlan: number },
  log: Logger,
): Promise<void> {
  try {
    await vfLink(vfLinkArgv(op.pf, op.vf, op.mac, op.vlan));
  } catch (e) {
    // the PF is gone (no netdev of that name in the host netns), and its VFs with it
    if (!sysfs.exists(`class/net/${op.pf}`)) {
      log.warn({ err: e, pf: op.pf }, 'the PF is gone: no VF MAC/VLAN to restore');
      return;
    }
    throw new VmpodError(ErrorCode.Device, `restore MAC ${op.mac} VLAN ${op.vlan} on VF ${op.vf} of ${op.pf}`, {
      cause: e,
    });
  }
}

/**
 * Undo of a VF's bind: when its driver is back, the kernel creates a new netdev in the initial (host) netns
 * under a kernel name (bus/pci/devices/<addr>/net/<name>; some drivers, iavf, do it from a workqueue, so we
 * poll). It goes back into the pod netns under the CNI plugin's name, so that the plugin's DEL finds it.
 * Nothing to do when the netns is gone, or when the netdev never left (the bind was recorded, not applied).
 */
export async function returnVfNetdev(
  deps: { exec: NetExec; sysfs: Sysfs; vfLink: VfLink; vfNetdevTimeoutMs: number },
  rec: PodRecord,
  op: { address: string; name: string },
  log: Logger,
): Promise<void> {
  const { sysfs } = deps;
  if (!existsSync(rec.nsPath)) {
    log.warn({ address: op.address }, "the pod netns is gone: the VF's netdev stays in the host netns");
    return;
  }
  if (sysfs.pciDevice(op.address) === undefined) {
    log.warn({ address: op.address }, 'the VF is gone: no netdev to return');
    return;
  }
  const inPod = await deps.exec.ip(['-n', rec.key, '-d', '-j', 'link', 'show']);
  const links =
    inPod.trim() === '' ? [] : (JSON.parse(inPod) as { ifname?: string; parentbus?: string; parentdev?: string }[]);
  if (links.some((l) => l.parentbus === 'pci' && l.parentdev?.toLowerCase() === op.address)) return;
  const timeoutMs = deps.vfNetdevTimeoutMs;
  const deadline = performance.now() + timeoutMs;
  let names = sysfs.pciNetInterfaces(op.address);
  while (names.length === 0 && performance.now() < deadline) {
    await new Promise((r) => setTimeout(r, 50));
    names = sysfs.pciNetInterfaces(op.address);
  }
  const dev = names[0];
  if (dev === undefined) {
    throw new VmpodError(
      ErrorCode.Device,
      `VF ${op.address}: no netdev under ${sysfs.path(`bus/pci/devices/${op.address}/net`)} ${timeoutMs} ms after ` +
        `its driver was restored: cannot return it to the pod netns as ${op.name}`,
    );
  }
  // one RTM_NEWLINK: the kernel moves the link, then renames it in the target netns
  await deps.vfLink(['ip', 'link', 'set', 'dev', dev, 'netns', rec.key, 'name', op.name]);
}
