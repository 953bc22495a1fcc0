// vmwrapper: what libvirt runs as the domain's <emulator>. Decides what to exec; the bin file only execs it.
// Kept free of execa and pino (it runs on every VM start: docs/performance.md, vmwrapper-start). The probe path
// (probe.ts) does not load this module at all.
import { FdClient } from '../client/fdclient.js';
import { base64ToMac } from '../protocol/mac.js';
import { InterfaceType } from '../protocol/payloads.js';
import { buildQemuArgv, type TapNet, type VfioDev } from '../qemu/index.js';
import { collectDevices, devicesOrThrow, hostRoot, Sysfs, sysfsRoot } from '../devices/index.js';
import { DEFAULTS, envArray, inheritedFds, isProbe, probePlan, type Env, type ExecPlan } from './probe.js';
import { readFileSync } from 'node:fs';
import { parseCpuset, planCpuset, writeCpuset } from './cpuset.js';
import { planCgroupMove, applyCgroupMove, removeStaleLeaves, leafName } from './cgroup.js';

export { DEFAULTS, isProbe, probePlan, type Env, type ExecPlan };
export { logLine } from './logline.js';

/**
 * Builds the exec plan. `args` are libvirt's arguments (argv without node and script).
 * Probe (VIRTLET_EMULATOR empty): probePlan (the bin file takes that path without loading this module).
 * Start: the fds of VIRTLET_NET_KEY from tapmanager, the VFIO devices of every device input (src/devices/collect.ts),
 * VMPOD_VM_CGROUP's move planned, VIRTLET_CPUSETS applied. Async only because kubelet's PodResources API is asked over gRPC where configured.
 */
export async function planExec(args: string[], env: Env): Promise<ExecPlan> {
  if (isProbe(env)) return probePlan(args, env);
  const inherited = inheritedFds(args);
  const emulator = env.VIRTLET_EMULATOR ?? '';

  const taps: TapNet[] = [];
  const vfs: { address: string }[] = [];
  const keep = new Set(inherited);
  const key = env.VIRTLET_NET_KEY ?? '';
  if (key !== '') {
    const client = new FdClient(env.VIRTLET_FD_SERVER_SOCKET_PATH || DEFAULTS.socket);
    const { infos, fds } = client.get(key);
    for (const info of infos) {
      const fd = fds[info.fdIndex];
      if (fd === undefined) throw new Error(`tapmanager sent ${fds.length} fds but interface ${info.fdIndex} needs fd index ${info.fdIndex}`);
      if (info.type === InterfaceType.VF) {
        vfs.push({ address: info.pciAddress });
      } else {
        taps.push({ fds: [fd], mac: base64ToMac(info.mac), index: info.fdIndex, ...(info.mtu !== undefined ? { mtu: info.mtu } : {}) });
        keep.add(fd);
      }
    }
  }
  const report = await collectDevices(env, { sysfs: new Sysfs(sysfsRoot(env)), hostRoot: hostRoot(env), vfs });
  const vfio: VfioDev[] = devicesOrThrow(report);

  // VMPOD_VM_CGROUP: leave libvirt's cgroups (planned and validated here, applied by applyPlan); the cpuset then
  // goes to the VM's own leaf
  const cgroup = env.VMPOD_VM_CGROUP
    ? planCgroupMove({
        target: env.VMPOD_VM_CGROUP,
        leaf: leafName(args, process.pid),
        procCgroup: readFileSync('/proc/self/cgroup', 'utf8'),
        mountinfo: readFileSync('/proc/self/mountinfo', 'utf8'),
        cpuset: Boolean(env.VIRTLET_CPUSETS),
      })
    : undefined;
  const cpuset = env.VIRTLET_CPUSETS
    ? cgroup?.cpusetFile
      ? { file: cgroup.cpusetFile, list: parseCpuset(env.VIRTLET_CPUSETS) }
      : planCpuset(env.VIRTLET_CPUSETS, { cgroupRoot: env.VMPOD_CGROUP_ROOT || DEFAULTS.cgroupRoot })
    : undefined;

  // the argv is built (and validated) before anything on the host changes: a failing plan changes nothing
  const argv = [emulator, ...buildQemuArgv(args, taps, vfio)];
  return {
    path: emulator,
    ...(cpuset ? { cpuset } : {}),
    ...(cgroup ? { cgroup } : {}),
    argv,
    env: envArray(env),
    keepFds: [...keep].sort((a, b) => a - b),
    summary: {
      mode: 'start',
      emulator,
      key,
      taps: taps.map((t) => ({ fd: t.fds[0], mac: t.mac })),
      vfio: vfio.map((d) => `${d.address} (${d.source})`),
      ...(cgroup ? { cgroup: cgroup.path } : {}),
      ...(cpuset ? { cpusetFile: cpuset.file } : {}),
    },
  };
}

/** Applies a valid plan's host changes (the VM cgroup move, then the cpuset), right before the exec. */
export function applyPlan(plan: ExecPlan): void {
  if (plan.cgroup) {
    applyCgroupMove(plan.cgroup, process.pid);
    removeStaleLeaves(plan.cgroup);
  }
  if (plan.cpuset) writeCpuset(plan.cpuset);
}
