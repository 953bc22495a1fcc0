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
import { parseEnvFile } from '../devices/report.js';
import { planCgroupMove, applyCgroupMove, removeStaleLeaves, leafName } from './cgroup.js';
import { netQueues, vhostUsable, type Vhost } from './queues.js';

export { DEFAULTS, isProbe, probePlan, type Env, type ExecPlan };
export { logLine } from './logline.js';

/**
 * Builds the exec plan. `args` are libvirt's arguments (argv without node and script). Probe (VIRTLET_EMULATOR empty):
 * probePlan (the bin file takes that path without loading this module). Start: the fds of VIRTLET_NET_KEY from
 * tapmanager, the VFIO devices of every device input (src/devices/collect.ts), VMPOD_VM_CGROUP's move planned,
 * VIRTLET_CPUSETS applied. Async only because kubelet's PodResources API is asked over gRPC where configured.
 */
export async function planExec(args: string[], domainEnv: Env): Promise<ExecPlan> {
  if (isProbe(domainEnv)) return probePlan(args, domainEnv);
  const env = withNodeSettings(domainEnv);
  const inherited = inheritedFds(args);
  const emulator = env.VIRTLET_EMULATOR ?? '';

  const key = env.VIRTLET_NET_KEY ?? '';
  const { taps, vfs, vhost } = key === '' ? { taps: [], vfs: [], vhost: undefined } : fetchNet(key, args, env);
  const keep = new Set([...inherited, ...taps.flatMap((t) => t.fds)]);
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
      taps: taps.map((t) => ({ fd: t.fds[0], mac: t.mac, ...(t.fds.length > 1 ? { queueFds: t.fds } : {}) })),
      // said once, for every tap: qemu runs virtio-net without the kernel's vhost-net (slower, as Kata and KubeVirt
      // warn)
      ...(vhost && !vhost.on ? { vhost: `off: cannot open ${vhost.why}; virtio-net runs in qemu` } : {}),
      vfio: vfio.map((d) => `${d.address} (${d.source})`),
      ...(cgroup ? { cgroup: cgroup.path } : {}),
      ...(cpuset ? { cpusetFile: cpuset.file } : {}),
    },
  };
}

/**
 * The pod's taps and VFs from tapmanager (get), with as many queues on each tap as VMPOD_NET_QUEUES and -smp say
 * (tapmanager may give fewer: a tap made single-queue before multiqueue taps existed), and vhost where it can be used.
 */
function fetchNet(key: string, args: string[], env: Env): { taps: TapNet[]; vfs: { address: string }[]; vhost: Vhost } {
  const client = new FdClient(env.VIRTLET_FD_SERVER_SOCKET_PATH || DEFAULTS.socket);
  const { infos, fds } = client.get(key, { queues: netQueues(args, env) });
  const taps: TapNet[] = [];
  const vfs: { address: string }[] = [];
  const vhost = vhostUsable(hostRoot(env));
  for (const info of infos) {
    // the client checked every index against the fds received
    if (info.type === InterfaceType.VF) vfs.push({ address: info.pciAddress });
    else {
      const queueFds = (info.queueFdIndices ?? [info.fdIndex]).map((i) => fds[i]!);
      taps.push({
        fds: queueFds,
        vhost: vhost.on,
        mac: base64ToMac(info.mac),
        index: info.fdIndex,
        ...(info.mtu !== undefined ? { mtu: info.mtu } : {}),
      });
    }
  }
  return { taps, vfs, vhost };
}

/**
 * The domain's environment over the node's settings file (VMPOD_VMWRAPPER_ENV_FILE, default /etc/vmpod-node/
 * vmwrapper.env; K=V lines): libvirt starts the emulator with a cleared environment plus the domain's <qemu:env>, so
 * a setting of the libvirt container (VMPOD_VM_CGROUP, say) reaches vmwrapper only through a file. A missing file is
 * no settings; an unreadable one is an error.
 */
export function withNodeSettings(env: Env): Env {
  const file = env.VMPOD_VMWRAPPER_ENV_FILE || DEFAULTS.envFile;
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return env;
    throw new Error(
      `cannot read the node's vmwrapper settings ${file}: ${(e as NodeJS.ErrnoException).code ?? (e as Error).message}`,
      { cause: e },
    );
  }
  const out: Env = { ...parseEnvFile(text) };
  for (const [k, v] of Object.entries(env)) if (v !== undefined) out[k] = v;
  return out;
}

/** Applies a valid plan's host changes (the VM cgroup move, then the cpuset), right before the exec. */
export function applyPlan(plan: ExecPlan): void {
  if (plan.cgroup) {
    applyCgroupMove(plan.cgroup, process.pid);
    removeStaleLeaves(plan.cgroup);
  }
  if (plan.cpuset) writeCpuset(plan.cpuset);
}
