// How many queues vmwrapper asks tapmanager for on each tap, and whether qemu gets vhost=on (docs/networking.md,
// "Queues and offloads"). As KubeVirt (networkInterfaceMultiqueue) and Kata do: one queue pair per vCPU of -smp,
// vhost where /dev/vhost-net opens.
import { closeSync, openSync } from 'node:fs';
import { join } from 'node:path';
import { ErrorCode, VmpodError } from '../errors.js';
import { optionPairs, parseQemuOptValue } from '../qemu/ids.js';
import { MAX_QUEUES } from '../qemu/types.js';
import type { Env } from './probe.js';

/** VMPOD_NET_QUEUES=auto takes the vCPUs, at most this many (past it a queue pair per vCPU stops paying off). */
export const AUTO_MAX_QUEUES = 8;

/** -smp's topology keys: when cpus= is left out, qemu takes their product (maxcpus= first, when given). */
const TOPOLOGY = ['sockets', 'dies', 'clusters', 'cores', 'threads'] as const;

function count(v: unknown): number | undefined {
  return typeof v === 'string' && /^\d+$/.test(v) && Number(v) > 0 ? Number(v) : undefined;
}

/**
 * Pure: the vCPUs qemu boots with, from the last -smp (`-smp 4`, `-smp cpus=4,...`, `-smp sockets=2,cores=2`); 1
 * without one.
 */
export function smpCpus(args: readonly string[]): number {
  let cpus = 1;
  for (const [opt, val] of optionPairs(args)) {
    if (opt !== '-smp') continue;
    const rec = parseQemuOptValue(val) ?? {};
    const topology = TOPOLOGY.map((k) => count(rec[k]));
    cpus =
      count(rec['cpus']) ??
      count(rec['']) ??
      count(rec['maxcpus']) ??
      (topology.some((n) => n !== undefined) ? topology.reduce<number>((a, n) => a * (n ?? 1), 1) : 1);
  }
  return cpus;
}

/**
 * Pure: the queues each tap gets. VMPOD_NET_QUEUES: `auto` (or unset): the vCPUs, at most AUTO_MAX_QUEUES;
 * a number 1..MAX_QUEUES: exactly that many. Anything else is an error that names the value.
 */
export function netQueues(args: readonly string[], env: Env): number {
  const v = env.VMPOD_NET_QUEUES ?? '';
  if (v === '' || v === 'auto') return Math.min(smpCpus(args), AUTO_MAX_QUEUES);
  const n = /^\d+$/.test(v) ? Number(v) : NaN;
  if (!(n >= 1 && n <= MAX_QUEUES)) {
    throw new VmpodError(
      ErrorCode.Config,
      `VMPOD_NET_QUEUES=${JSON.stringify(v)}: expected "auto" or a number of queues from 1 to ${MAX_QUEUES}`,
    );
  }
  return n;
}

/** Whether vhost is on, and when not, why (the errno of opening /dev/vhost-net). */
export type Vhost = { on: true } | { on: false; why: string };

/**
 * Whether qemu can use vhost-net: /dev/vhost-net (under VMPOD_DEV_ROOT) opens read-write for this process, which
 * becomes qemu with the same credentials, cgroups and mounts. qemu opens its own vhost fds; this one is closed.
 */
export function vhostUsable(devRoot: string): Vhost {
  const path = join(devRoot, 'dev/vhost-net');
  try {
    closeSync(openSync(path, 'r+'));
    return { on: true };
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code ?? 'error';
    return { on: false, why: `${path}: ${code}` };
  }
}
