// VMPOD_VM_CGROUP: vmwrapper leaves the cgroups libvirt (and so the libvirt container) put it in before the exec,
// so that restarting the libvirt container does not kill the VMs (Virtlet's vmwrapper does the same). Each VM gets
// its own leaf, <VMPOD_VM_CGROUP>/<domain>, in every hierarchy it is in (cgroup v1 controllers, v1 named ones such
// as name=systemd, and the v2 unified one: hybrid hosts have all three), so VIRTLET_CPUSETS pins that VM alone.
//
// planCgroupMove is pure: from /proc/self/cgroup and /proc/self/mountinfo it builds every step and validates it
// (a mount per hierarchy, seen from its root) before applyCgroupMove changes anything on the host.
//
// Under a cgroup namespace (cgroup v2 nodes give each container its own): the container sees its own cgroup as "/",
// and the host's /sys/fs/cgroup mounted into it shows the host's hierarchy with a root of "/.." (one "/.." per level
// above the namespace's root). The VM's leaf is then made in that mount, outside the container's cgroup. Hosts that
// mount cgroup2 with nsdelegate (systemd does) refuse a move out of the namespace from inside it (ENOENT): that one
// write is then made from the host's cgroup namespace (nsenter into /proc/1/ns/cgroup: the node's init, hostPID).
import { existsSync, mkdirSync, readFileSync, readdirSync, rmdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { VmpodError, ErrorCode } from '../errors.js';

export interface CgroupHierarchy {
  /** "cpu", "cpuset", "name=systemd", "" for the v2 unified hierarchy */
  controllers: string;
  /** where it is mounted */
  mount: string;
  version: 1 | 2;
}

export interface CgroupStep {
  hierarchy: CgroupHierarchy;
  /** dirs to create from the top down when missing (VMPOD_VM_CGROUP's own levels, then the VM's leaf) */
  create: string[];
  /** a new v1 cpuset cgroup has empty cpus and mems and refuses tasks: copy them from its parent */
  inheritCpuset: boolean;
  /** v2 with VIRTLET_CPUSETS: "+cpuset" into these cgroup.subtree_control files (root down to the leaf's parent) */
  enableCpuset: string[];
  /** the leaf's cgroup.procs, where the PID is written */
  procs: string;
}

export interface CgroupPlan {
  /** the cgroup path joined in every hierarchy */
  path: string;
  steps: CgroupStep[];
  /** with VIRTLET_CPUSETS: the leaf's cpuset.cpus (v1 cpuset hierarchy, or v2 unified) */
  cpusetFile?: string;
  /** vmwrapper runs in a cgroup namespace (a hierarchy is mounted from above its root, "/.."): see the top */
  inCgroupNamespace: boolean;
}

/** The node's cgroup namespace, where a move refused inside ours is made (the libvirt container has hostPID). */
export const HOST_CGROUP_NS = '/proc/1/ns/cgroup';

/** A mount root of "/..", "/../..": the hierarchy seen from inside a cgroup namespace, from above its root. */
const ABOVE_NAMESPACE = /^(\/\.\.)+$/;

const SAFE = /^[A-Za-z0-9_.@:+-]+$/;

/** Pure: VMPOD_VM_CGROUP checked: absolute, plain components (no ".", "..", empty). */
export function parseCgroupPath(s: string): string[] {
  if (!s.startsWith('/'))
    throw new VmpodError(
      ErrorCode.Config,
      `VMPOD_VM_CGROUP ${JSON.stringify(s)} must be an absolute cgroup path such as /vmpod-vms`,
    );
  const parts = s.split('/').filter((p) => p !== '');
  for (const p of parts) {
    if (p === '.' || p === '..' || !SAFE.test(p) || p.length > 200) {
      throw new VmpodError(
        ErrorCode.Config,
        `VMPOD_VM_CGROUP ${JSON.stringify(s)}: component ${JSON.stringify(p)} is not a plain name ([A-Za-z0-9_.@:+-])`,
      );
    }
  }
  return parts;
}

/** Pure: the VM's leaf name, from libvirt's "-name guest=NAME,..." (or "-name NAME"); "vm-<pid>" without one. */
export function leafName(args: string[], pid: number): string {
  const i = args.indexOf('-name');
  const v = i >= 0 ? args[i + 1] : undefined;
  let name: string | undefined;
  if (v !== undefined) {
    // qemu's option syntax: ",," is a literal comma; the first unescaped comma ends the value
    const first = v
      .replace(/,,/g, '\u0000')
      .split(',')[0]!
      .replace(/\u0000/g, ',');
    name = first.startsWith('guest=') ? first.slice('guest='.length) : first;
  }
  const clean = (name ?? '').replace(/[^A-Za-z0-9_.@:+-]/g, '_').slice(0, 200);
  return clean === '' || clean === '.' || clean === '..' ? `vm-${pid}` : `vm-${clean}`;
}

interface Mount {
  root: string;
  mountPoint: string;
  fstype: string;
  superOpts: string[];
}

/** Pure: the cgroup mounts of a /proc/self/mountinfo text. */
export function cgroupMounts(mountinfo: string): Mount[] {
  const out: Mount[] = [];
  for (const line of mountinfo.split('\n')) {
    const sep = line.indexOf(' - ');
    if (sep < 0) continue;
    const left = line.slice(0, sep).split(' ');
    const right = line.slice(sep + 3).split(' ');
    const fstype = right[0];
    if (fstype !== 'cgroup' && fstype !== 'cgroup2') continue;
    const unoctal = (s: string) => s.replace(/\\(\d{3})/g, (_, o: string) => String.fromCharCode(parseInt(o, 8)));
    out.push({
      root: unoctal(left[3] ?? ''),
      mountPoint: unoctal(left[4] ?? ''),
      fstype,
      superOpts: (right[2] ?? '').split(','),
    });
  }
  return out;
}

/**
 * Pure: every step of moving `pid`'s future exec into <target>/<leaf>, validated. `procCgroup` is
 * /proc/self/cgroup's text; `cpuset` is whether VIRTLET_CPUSETS will be applied there.
 */
export function planCgroupMove(opts: {
  target: string;
  leaf: string;
  procCgroup: string;
  mountinfo: string;
  cpuset: boolean;
}): CgroupPlan {
  const parts = [...parseCgroupPath(opts.target), opts.leaf];
  if (!SAFE.test(opts.leaf))
    throw new VmpodError(ErrorCode.Config, `cgroup leaf ${JSON.stringify(opts.leaf)} is not a plain name`);
  const path = `/${parts.join('/')}`;
  const mounts = cgroupMounts(opts.mountinfo);
  const steps: CgroupStep[] = [];
  const lines = opts.procCgroup.split('\n').filter(Boolean);
  if (lines.length === 0) throw new VmpodError(ErrorCode.Config, '/proc/self/cgroup is empty: no cgroups to leave');
  let cpusetFile: string | undefined;
  let inCgroupNamespace = false;
  for (const line of lines) {
    const m = /^(\d+):([^:]*):(.*)$/.exec(line);
    if (!m)
      throw new VmpodError(
        ErrorCode.Config,
        `/proc/self/cgroup line ${JSON.stringify(line)} is not "ID:CONTROLLERS:PATH"`,
      );
    const controllers = m[2]!;
    const version: 1 | 2 = m[1] === '0' && controllers === '' ? 2 : 1;
    const wanted = controllers.split(',');
    const mount = mounts.find((mt) =>
      version === 2 ? mt.fstype === 'cgroup2' : mt.fstype === 'cgroup' && wanted.every((c) => mt.superOpts.includes(c)),
    );
    const what = version === 2 ? 'the cgroup v2 (unified) hierarchy' : `the cgroup v1 hierarchy ${controllers}`;
    if (!mount) {
      throw new VmpodError(
        ErrorCode.Config,
        `${what} is not mounted here: vmwrapper cannot leave it; mount the host's /sys/fs/cgroup into the libvirt ` +
          `container`,
      );
    }
    if (ABOVE_NAMESPACE.test(mount.root)) inCgroupNamespace = true;
    else if (mount.root !== '/') {
      throw new VmpodError(
        ErrorCode.Config,
        `${what} is mounted at ${mount.mountPoint} from ${mount.root}, not from its root: VMPOD_VM_CGROUP needs the ` +
          `host's whole hierarchy; mount the host's /sys/fs/cgroup into the libvirt container`,
      );
    }
    const dirs = parts.map((_, i) => join(mount.mountPoint, ...parts.slice(0, i + 1)));
    const isCpuset = version === 1 && wanted.includes('cpuset');
    const v2Cpuset = version === 2 && opts.cpuset && !lines.some((l) => /^\d+:[^:]*\bcpuset\b[^:]*:/.test(l));
    if (opts.cpuset && (isCpuset || v2Cpuset)) cpusetFile = join(dirs[dirs.length - 1]!, 'cpuset.cpus');
    steps.push({
      hierarchy: { controllers, mount: mount.mountPoint, version },
      create: dirs,
      inheritCpuset: isCpuset,
      enableCpuset: v2Cpuset
        ? [mount.mountPoint, ...dirs.slice(0, -1)].map((d) => join(d, 'cgroup.subtree_control'))
        : [],
      procs: join(dirs[dirs.length - 1]!, 'cgroup.procs'),
    });
  }
  if (opts.cpuset && !cpusetFile)
    throw new VmpodError(
      ErrorCode.Config,
      'VIRTLET_CPUSETS is set but no cpuset cgroup (v1) or unified hierarchy (v2) is mounted',
    );
  return { path, steps, ...(cpusetFile ? { cpusetFile } : {}), inCgroupNamespace };
}

function sys(what: string, e: unknown): VmpodError {
  return new VmpodError(ErrorCode.Syscall, what, { cause: e });
}

/**
 * Applies a plan for `pid` (normally process.pid). Existing dirs are kept as they are (an operator may have set
 * limits).
 */
export function applyCgroupMove(plan: CgroupPlan, pid: number): void {
  for (const step of plan.steps) {
    for (const file of step.enableCpuset) {
      try {
        writeFileSync(file, '+cpuset');
      } catch (e) {
        throw sys(`enable the cpuset controller: write +cpuset to ${file}`, e);
      }
    }
    for (const dir of step.create) {
      let created = false;
      try {
        mkdirSync(dir);
        created = true;
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== 'EEXIST') throw sys(`create cgroup ${dir}`, e);
      }
      if (created && step.inheritCpuset) {
        for (const f of ['cpuset.cpus', 'cpuset.mems']) {
          try {
            writeFileSync(join(dir, f), readFileSync(join(dir, '..', f), 'utf8').trim());
          } catch (e) {
            throw sys(`copy ${f} from the parent of ${dir}`, e);
          }
        }
      }
    }
    try {
      writeProcs(step.procs, pid, plan.inCgroupNamespace);
    } catch (e) {
      // a stale-leaf sweep of another vmwrapper may have removed our (empty, old) leaf between mkdir and here
      if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw sys(`move PID ${pid} into ${step.procs}`, e);
      try {
        mkdirSync(join(step.procs, '..'));
        if (step.inheritCpuset) {
          const dir = join(step.procs, '..');
          for (const f of ['cpuset.cpus', 'cpuset.mems'])
            writeFileSync(join(dir, f), readFileSync(join(dir, '..', f), 'utf8').trim());
        }
        writeProcs(step.procs, pid, plan.inCgroupNamespace);
      } catch (e2) {
        throw sys(`move PID ${pid} into ${step.procs}`, e2);
      }
    }
  }
}

/**
 * The PID into a cgroup.procs. In a cgroup namespace on a host whose cgroup2 has nsdelegate, the kernel answers a
 * move out of the namespace with ENOENT although the file is there: the write is made from the host's namespace.
 */
function writeProcs(procs: string, pid: number, inCgroupNamespace: boolean): void {
  try {
    writeFileSync(procs, String(pid));
  } catch (e) {
    if (!inCgroupNamespace || (e as NodeJS.ErrnoException).code !== 'ENOENT' || !existsSync(procs)) throw e;
    // loaded here, on this rare path: node:child_process at the top would cost every VM start its load
    const { spawnSync } = process.getBuiltinModule('node:child_process');
    const r = spawnSync('nsenter', [`--cgroup=${HOST_CGROUP_NS}`, '--', 'tee', procs], {
      input: String(pid),
      stdio: ['pipe', 'ignore', 'pipe'],
      encoding: 'utf8',
    });
    if (r.status !== 0) {
      throw new VmpodError(
        ErrorCode.Syscall,
        `the move out of this cgroup namespace was refused (nsdelegate), and nsenter --cgroup=${HOST_CGROUP_NS} tee ` +
          `${procs} failed: ${r.error?.message ?? r.stderr.trim()}`,
        { cause: e },
      );
    }
  }
}

/**
 * Best effort, after the move: removes the empty leaves of VMs that stopped (older than `minAgeMs`, so a vmwrapper
 * between its mkdir and its move is never raced; the kernel refuses to remove a cgroup that has processes).
 */
export function removeStaleLeaves(plan: CgroupPlan, minAgeMs = 60_000, now = Date.now()): number {
  let removed = 0;
  const own = plan.path.split('/').pop()!;
  for (const step of plan.steps) {
    const parent = join(step.procs, '..', '..');
    let names: string[];
    try {
      names = readdirSync(parent);
    } catch {
      continue;
    }
    for (const name of names) {
      if (name === own || !name.startsWith('vm-')) continue;
      const dir = join(parent, name);
      try {
        const st = statSync(dir);
        if (!st.isDirectory() || now - st.mtimeMs < minAgeMs) continue;
        if (readFileSync(join(dir, 'cgroup.procs'), 'utf8').trim() !== '') continue;
        rmdirSync(dir);
        removed++;
      } catch {
        /* busy, gone, or not a cgroup: leave it */
      }
    }
  }
  return removed;
}
