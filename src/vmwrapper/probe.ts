// vmwrapper's probe path: libvirt runs the <emulator> with VIRTLET_EMULATOR empty to ask qemu for its
// capabilities; the args go to the default emulator untouched, with the fds libvirt gave us. This module and fds.ts
// are all a probe loads (no client, no qemu argv builder, no logger): the start path is run.ts, loaded on demand.
import { inheritableFds, fdsNamedInArgv, isOpenFd } from './fds.js';
import type { CgroupPlan } from './cgroup.js';

export const DEFAULTS = {
  emulator: '/usr/bin/qemu-system-x86_64',
  socket: '/var/lib/virtlet/tapfdserver.sock',
  cgroupRoot: '/sys/fs/cgroup',
  /** the node's settings for every VM start (VMPOD_VMWRAPPER_ENV_FILE): run.ts, withNodeSettings */
  envFile: '/etc/vmpod-node/vmwrapper.env',
} as const;

export interface ExecPlan {
  path: string;
  argv: string[];
  env: string[];
  keepFds: number[];
  /** written by applyPlan (run.ts), only once the whole plan is built and valid */
  cpuset?: { file: string; list: string };
  /** VMPOD_VM_CGROUP: the move applyPlan (run.ts) makes, before the cpuset */
  cgroup?: CgroupPlan;
  /** for the log line */
  summary: Record<string, unknown>;
}

export type Env = Record<string, string | undefined>;

export function envArray(env: Env): string[] {
  return Object.entries(env)
    .filter((e): e is [string, string] => e[1] !== undefined)
    .map(([k, v]) => `${k}=${v}`);
}

/** the fds to pass on: every inheritable fd >= 3, and every fd named in libvirt's argv that is open */
export function inheritedFds(args: string[]): Set<number> {
  const inherited = new Set(inheritableFds());
  for (const fd of fdsNamedInArgv(args)) if (isOpenFd(fd)) inherited.add(fd);
  return inherited;
}

/** A libvirt probe: VIRTLET_EMULATOR unset or empty. */
export function isProbe(env: Env): boolean {
  return (env.VIRTLET_EMULATOR ?? '') === '';
}

/**
 * Probe: the default emulator (VMWRAPPER_DEFAULT_EMULATOR or qemu) with the args untouched and what libvirt gave us.
 */
export function probePlan(args: string[], env: Env): ExecPlan {
  const path = env.VMWRAPPER_DEFAULT_EMULATOR || DEFAULTS.emulator;
  return {
    path,
    argv: [path, ...args],
    env: envArray(env),
    keepFds: [...inheritedFds(args)],
    summary: { mode: 'probe', emulator: path },
  };
}
