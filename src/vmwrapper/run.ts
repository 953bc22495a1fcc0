// vmwrapper: what libvirt runs as the domain's <emulator>. Decides what to exec; the bin file only execs it.
// Kept free of execa and pino (it runs on every VM start: node-runtime-facts.md, start-up cost).
import { FdClient } from '../client/fdclient.js';
import { base64ToMac } from '../protocol/mac.js';
import { InterfaceType } from '../protocol/payloads.js';
import { buildQemuArgv, type TapNet, type VfioDev } from '../qemu/index.js';
import { Sysfs, sysfsRoot, collectPluginDevices } from '../devices/index.js';
import { inheritableFds, fdsNamedInArgv, isOpenFd } from './fds.js';
import { readFileSync } from 'node:fs';
import { applyCpuset, parseCpuset } from './cpuset.js';
import { planCgroupMove, applyCgroupMove, removeStaleLeaves, leafName } from './cgroup.js';

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

  // leave libvirt's cgroups first (planned and validated before anything changes), so the cpuset below is the VM's own
  let cgroup: string | undefined;
  if (env.VMPOD_VM_CGROUP) {
    if (env.VIRTLET_CPUSETS) parseCpuset(env.VIRTLET_CPUSETS);
    const plan = planCgroupMove({
      target: env.VMPOD_VM_CGROUP,
      leaf: leafName(args, process.pid),
      procCgroup: readFileSync('/proc/self/cgroup', 'utf8'),
      mountinfo: readFileSync('/proc/self/mountinfo', 'utf8'),
      cpuset: Boolean(env.VIRTLET_CPUSETS),
    });
    applyCgroupMove(plan, process.pid);
    removeStaleLeaves(plan);
    cgroup = plan.path;
  }
  let cpuset: string | undefined;
  if (env.VIRTLET_CPUSETS) cpuset = applyCpuset(env.VIRTLET_CPUSETS, { cgroupRoot: env.VMPOD_CGROUP_ROOT || DEFAULTS.cgroupRoot });

  const argv = [emulator, ...buildQemuArgv(args, taps, vfio)];
  return {
    path: emulator,
    argv,
    env: envArray(env),
    keepFds: [...keep].sort((a, b) => a - b),
    summary: {
      mode: 'start',
      emulator,
      key,
      taps: taps.map((t) => ({ fd: t.fds[0], mac: t.mac })),
      vfio: vfio.map((d) => `${d.address} (${d.source})`),
      ...(cgroup ? { cgroup } : {}),
      ...(cpuset ? { cpusetFile: cpuset } : {}),
    },
  };
}
