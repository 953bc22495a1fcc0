// VMPOD_VM_CGROUP with the real cgroup hierarchies of this host (hybrid: v1 controllers, name=systemd, unified v2):
// the stub emulator vmwrapper execs ends up in <VMPOD_VM_CGROUP>/vm-<domain> in every hierarchy, pinned by
// VIRTLET_CPUSETS. Every cgroup is uniquely named and removed afterwards.
import { describe, it, expect } from 'vitest';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, posix } from 'node:path';
import { randomBytes } from 'node:crypto';
import { runVmwrapper, STUB_EMULATOR } from '../helpers/vmwrapper.js';
import { cgroupMounts } from '../../src/vmwrapper/cgroup.js';

const mounts = () => cgroupMounts(readFileSync('/proc/self/mountinfo', 'utf8')).filter((m) => m.root === '/');

/** rmdir (deepest first) in every hierarchy, what exists of the given cgroup paths. */
function removeCgroups(paths: string[]): void {
  for (const m of mounts())
    for (const p of paths) if (existsSync(join(m.mountPoint, p))) rmdirSync(join(m.mountPoint, p));
}

describe('vmwrapper VMPOD_VM_CGROUP', () => {
  it('moves itself (and so the emulator, same PID) into the VM cgroup of every hierarchy; VIRTLET_CPUSETS applies there', async () => {
    const top = `vmpod-test-${randomBytes(3).toString('hex')}`;
    const domain = `virtlet-${randomBytes(2).toString('hex')}-vm`;
    const leaf = `vm-${domain}`;
    try {
      const r = await runVmwrapper({
        args: ['-name', `guest=${domain},debug-threads=on`, '-S', '-no-user-config'],
        env: { VIRTLET_EMULATOR: STUB_EMULATOR, VMPOD_VM_CGROUP: `/${top}/vms`, VIRTLET_CPUSETS: '0' },
      });
      expect(r.code, r.stderr).toBe(0);
      const stub = r.stub!;
      expect(stub.pid).toBe(r.pid);
      const lines = stub.cgroup.trim().split('\n');
      expect(lines.length).toBeGreaterThan(1); // hybrid here: v1 hierarchies and the unified one
      for (const l of lines) expect(l).toMatch(new RegExp(`^\\d+:[^:]*:/${top}/vms/${leaf}$`));
      expect(stub.cpusAllowed).toBe('0');
      expect(readFileSync(`/sys/fs/cgroup/cpuset/${top}/vms/${leaf}/cpuset.cpus`, 'utf8').trim()).toBe('0');
      // the parent keeps what it inherited: the cpuset narrows only the VM's own leaf
      expect(readFileSync(`/sys/fs/cgroup/cpuset/${top}/vms/cpuset.cpus`, 'utf8').trim()).toBe(
        readFileSync('/sys/fs/cgroup/cpuset/cpuset.cpus', 'utf8').trim(),
      );
      // the emulator has exited: its leaf is empty
      expect(readFileSync(`/sys/fs/cgroup/unified/${top}/vms/${leaf}/cgroup.procs`, 'utf8')).toBe('');
    } finally {
      removeCgroups([`${top}/vms/${leaf}`, `${top}/vms`, top]);
    }
    for (const m of mounts()) expect(existsSync(join(m.mountPoint, top))).toBe(false);
  });

  it("in a cgroup namespace (as cgroup v2 nodes give containers): the VM leaves the container's cgroup for VMPOD_VM_CGROUP", async () => {
    const top = `vmpod-test-${randomBytes(3).toString('hex')}`;
    const domain = `virtlet-${randomBytes(2).toString('hex')}-vm`;
    const leaf = `vm-${domain}`;
    // the "container": a cgroup of its own in every hierarchy, entered before unshare makes it the namespace's root
    const container = `${top}/container`;
    const procsFiles = mounts().map((m) => join(m.mountPoint, container, 'cgroup.procs'));
    try {
      for (const m of mounts()) {
        mkdirSync(join(m.mountPoint, container), { recursive: true });
        if (m.superOpts.includes('cpuset')) {
          for (const d of [top, container])
            for (const f of ['cpuset.cpus', 'cpuset.mems'])
              writeFileSync(join(m.mountPoint, d, f), readFileSync(join(m.mountPoint, f), 'utf8').trim());
        }
      }
      const enter = `for f in ${procsFiles.join(' ')}; do echo $$ > "$f"; done; exec unshare --cgroup "$@"`;
      const r = await runVmwrapper({
        args: ['-name', `guest=${domain},debug-threads=on`, '-S'],
        env: { VIRTLET_EMULATOR: STUB_EMULATOR, VMPOD_VM_CGROUP: `/${top}/vms` },
        wrap: ['sh', '-c', enter, 'sh'],
      });
      expect(r.code, r.stderr).toBe(0);
      // inside the namespace the emulator sees its cgroup relative to the namespace's root (/<top>/container)
      const lines = r.stub!.cgroup.trim().split('\n');
      expect(lines.length).toBe(mounts().length);
      for (const l of lines) {
        const rel = l.split(':').slice(2).join(':');
        expect(posix.resolve(`/${container}`, `.${rel}`), l).toBe(`/${top}/vms/${leaf}`);
      }
      expect(readFileSync(`/sys/fs/cgroup/unified/${top}/vms/${leaf}/cgroup.procs`, 'utf8')).toBe('');
    } finally {
      removeCgroups([`${top}/vms/${leaf}`, `${top}/vms`, container, top]);
    }
    for (const m of mounts()) expect(existsSync(join(m.mountPoint, top))).toBe(false);
  });

  it("takes VMPOD_VM_CGROUP from the node's settings file when the domain's environment has none (libvirt clears the rest)", async () => {
    const top = `vmpod-test-${randomBytes(3).toString('hex')}`;
    const dir = mkdtempSync(join(tmpdir(), 'vmpod-vmwenv-'));
    const file = join(dir, 'vmwrapper.env');
    writeFileSync(file, `# the libvirt container's settings\nVMPOD_VM_CGROUP=/${top}/vms\n`);
    try {
      const r = await runVmwrapper({
        args: ['-name', 'guest=envfile', '-S'],
        env: { VIRTLET_EMULATOR: STUB_EMULATOR, VMPOD_VMWRAPPER_ENV_FILE: file },
      });
      expect(r.code, r.stderr).toBe(0);
      for (const l of r.stub!.cgroup.trim().split('\n'))
        expect(l).toMatch(new RegExp(`^\\d+:[^:]*:/${top}/vms/vm-envfile$`));
      // the domain's own setting wins over the file's
      const own = await runVmwrapper({
        args: ['-name', 'guest=envfile', '-S'],
        env: { VIRTLET_EMULATOR: STUB_EMULATOR, VMPOD_VMWRAPPER_ENV_FILE: file, VMPOD_VM_CGROUP: `/${top}/own` },
      });
      expect(own.code, own.stderr).toBe(0);
      for (const l of own.stub!.cgroup.trim().split('\n')) expect(l).toMatch(new RegExp(`:/${top}/own/vm-envfile$`));
    } finally {
      removeCgroups([`${top}/vms/vm-envfile`, `${top}/vms`, `${top}/own/vm-envfile`, `${top}/own`, top]);
      rmSync(dir, { recursive: true, force: true });
    }
    for (const m of mounts()) expect(existsSync(join(m.mountPoint, top))).toBe(false);
  });

  it('a bad VMPOD_VM_CGROUP: one line, exit 1, and no cgroup created', async () => {
    const top = `vmpod-test-${randomBytes(3).toString('hex')}`;
    const r = await runVmwrapper({
      args: ['-S'],
      env: { VIRTLET_EMULATOR: STUB_EMULATOR, VMPOD_VM_CGROUP: `/${top}/../x` },
    });
    expect(r.code).toBe(1);
    expect(r.stub).toBeUndefined();
    expect(
      r.stderr
        .trim()
        .split('\n')
        .filter((l) => !l.startsWith('{')),
    ).toEqual([`vmwrapper: VMPOD_VM_CGROUP "/${top}/../x": component ".." is not a plain name ([A-Za-z0-9_.@:+-])`]);
    for (const m of mounts()) expect(existsSync(join(m.mountPoint, top))).toBe(false);
  });
});
