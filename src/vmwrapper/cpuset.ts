// VIRTLET_CPUSETS: pin the VM to CPUs by writing cpuset.cpus of the cgroup vmwrapper already runs in
// (libvirt put it there), before the exec so qemu starts pinned. cgroup v1 (a "cpuset" line in /proc/self/cgroup)
// and v2 (the "0::" line) are both handled.
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { VmpodError, ErrorCode } from '../errors.js';

/** Pure: validate a cpuset list such as "0-3,8,10-11". */
export function parseCpuset(s: string): string {
  const v = s.trim();
  if (!/^\d+(-\d+)?(,\d+(-\d+)?)*$/.test(v)) {
    throw new VmpodError(ErrorCode.BadRequest, `VIRTLET_CPUSETS ${JSON.stringify(s)} is not a CPU list like "0-3,8"`);
  }
  for (const part of v.split(',')) {
    const [a, b] = part.split('-').map(Number);
    if (b !== undefined && b < a!)
      throw new VmpodError(ErrorCode.BadRequest, `VIRTLET_CPUSETS ${JSON.stringify(s)}: range ${part} is backwards`);
  }
  return v;
}

/** Pure: the cpuset.cpus file for the cgroup described by /proc/self/cgroup's text. */
export function cpusetFile(procCgroup: string, cgroupRoot: string): string {
  const lines = procCgroup.split('\n').filter(Boolean);
  for (const line of lines) {
    const [, controllers, path] = line.split(/:(.*?):/);
    if (controllers?.split(',').includes('cpuset')) return join(cgroupRoot, 'cpuset', path ?? '/', 'cpuset.cpus');
  }
  const v2 = lines.find((l) => l.startsWith('0::'));
  if (v2) return join(cgroupRoot, v2.slice(3), 'cpuset.cpus');
  throw new VmpodError(ErrorCode.Config, 'no cpuset cgroup (v1) or unified cgroup (v2) in /proc/self/cgroup');
}

/** What applyCpuset will write where, validated, writing nothing (part of the exec plan). */
export function planCpuset(
  cpus: string,
  opts: { cgroupRoot: string; procCgroup?: string },
): { file: string; list: string } {
  const list = parseCpuset(cpus);
  const file = cpusetFile(opts.procCgroup ?? readFileSync('/proc/self/cgroup', 'utf8'), opts.cgroupRoot);
  return { file, list };
}

/** Writes a planned cpuset (the one side effect of a VM start before the exec). */
export function writeCpuset({ file, list }: { file: string; list: string }): string {
  try {
    writeFileSync(file, list);
  } catch (e) {
    throw new VmpodError(ErrorCode.Syscall, `write ${list} to ${file}`, { cause: e });
  }
  return file;
}

export function applyCpuset(cpus: string, opts: { cgroupRoot: string; procCgroup?: string }): string {
  return writeCpuset(planCpuset(cpus, opts));
}
