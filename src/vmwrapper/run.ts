// vmwrapper: what libvirt runs as the domain's <emulator>. Decides what to exec; the bin file only execs it.
// Kept free of execa and pino (it runs on every VM start: node-runtime-facts.md, start-up cost).
import { FdClient } from '../client/fdclient.js';
import { base64ToMac } from '../protocol/mac.js';
import { InterfaceType } from '../protocol/payloads.js';
import { buildQemuArgv, type TapNet, type VfioDev } from '../qemu/index.js';
import { Sysfs, sysfsRoot, collectPluginDevices } from '../devices/index.js';
import { inheritableFds, fdsNamedInArgv, isOpenFd } from './fds.js';
import { readFileSync } from 'node:fs';
import { parseCpuset, planCpuset, writeCpuset } from './cpuset.js';
import { planCgroupMove, applyCgroupMove, removeStaleLeaves, leafName, type CgroupPlan } from './cgroup.js';

export const DEFAULTS = {
  emulator: '/usr/bin/qemu-system-x86_64',
  socket: '/var/lib/virtlet/tapfdserver.sock',
  cgroupRoot: '/sys/fs/cgroup',
} as const;

export interface ExecPlan {
  path: string;
  argv: string[];
  env: string[];
  keepFds: number[];
  /** written by applyPlan, only once the whole plan is built and valid */
  cpuset?: { file: string; list: string };
  /** VMPOD_VM_CGROUP: the move applyPlan makes, before the cpuset */
  cgroup?: CgroupPlan;
  /** for the log line */
  summary: Record<string, unknown>;
}

export type Env = Record<string, string | undefined>;

function envArray(env: Env): string[] {
  return Object.entries(env)
    .filter((e): e is [string, string] => e[1] !== undefined)
    .map(([k, v]) => `${k}=${v}`);
}

/**
 * Builds the exec plan. `args` are libvirt's arguments (argv without node and script).
 * Probe (VIRTLET_EMULATOR empty): the default emulator with args untouched and what libvirt gave us.
 * Start: the fds of VIRTLET_NET_KEY from tapmanager, device-plugin VFIO devices, VIRTLET_CPUSETS applied.
 */
export function planExec(args: string[], env: Env): ExecPlan {
  const inherited = new Set(inheritableFds());
  for (const fd of fdsNamedInArgv(args)) if (isOpenFd(fd)) inherited.add(fd);
  const emulator = env.VIRTLET_EMULATOR ?? '';
  if (emulator === '') {
    const path = env.VMWRAPPER_DEFAULT_EMULATOR || DEFAULTS.emulator;
    return { path, argv: [path, ...args], env: envArray(env), keepFds: [...inherited], summary: { mode: 'probe', emulator: path } };
  }

  const taps: TapNet[] = [];
  const vfio: VfioDev[] = [];
  const keep = new Set(inherited);
  const key = env.VIRTLET_NET_KEY ?? '';
  if (key !== '') {
    const client = new FdClient(env.VIRTLET_FD_SERVER_SOCKET_PATH || DEFAULTS.socket);
    const { infos, fds } = client.get(key);
    for (const info of infos) {
      const fd = fds[info.fdIndex];
      if (fd === undefined) throw new Error(`tapmanager sent ${fds.length} fds but interface ${info.fdIndex} needs fd index ${info.fdIndex}`);
      if (info.type === InterfaceType.VF) {
        vfio.push({ address: info.pciAddress, source: 'tapmanager' });
      } else {
        taps.push({ fds: [fd], mac: base64ToMac(info.mac), index: info.fdIndex, ...(info.mtu !== undefined ? { mtu: info.mtu } : {}) });
        keep.add(fd);
      }
    }
  }
  const sysfs = new Sysfs(sysfsRoot(env));
  const fromPlugins = collectPluginDevices(env, sysfs);
  const seen = new Set(vfio.map((d) => d.address));
  for (const d of fromPlugins) if (!seen.has(d.address)) vfio.push(d);

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
