// The VM cgroup move, planned from /proc/self/cgroup and /proc/self/mountinfo texts (pure): hybrid, pure v2, v1,
// and the inputs that must be refused before anything changes.
import { describe, expect, it } from 'vitest';
import { cgroupMounts, leafName, parseCgroupPath, planCgroupMove } from '../../src/vmwrapper/cgroup.js';

const HYBRID_CGROUP = [
  '9:name=systemd:/machine/qemu-1',
  '4:memory:/machine/qemu-1',
  '3:cpuset:/machine/qemu-1',
  '1:cpu,cpuacct:/machine/qemu-1',
  '0::/machine/qemu-1',
  '',
].join('\n');
const HYBRID_MOUNTS = [
  '25 1 0:22 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755',
  '26 25 0:23 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw',
  '27 25 0:24 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd',
  '28 25 0:25 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory',
  '29 25 0:26 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset',
  '30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct',
  '31 1 8:1 / /var/lib/x\\040y rw - ext4 /dev/vda rw',
].join('\n');

describe('VM cgroup plan', () => {
  it('hybrid: one leaf per hierarchy under VMPOD_VM_CGROUP, the v1 cpuset inherits its parent', () => {
    const plan = planCgroupMove({
      target: '/vmpod/vms',
      leaf: 'vm-dom1',
      procCgroup: HYBRID_CGROUP,
      mountinfo: HYBRID_MOUNTS,
      cpuset: true,
    });
    expect(plan.path).toBe('/vmpod/vms/vm-dom1');
    expect(plan.cpusetFile).toBe('/sys/fs/cgroup/cpuset/vmpod/vms/vm-dom1/cpuset.cpus');
    expect(plan.steps.map((s) => s.procs)).toEqual([
      '/sys/fs/cgroup/systemd/vmpod/vms/vm-dom1/cgroup.procs',
      '/sys/fs/cgroup/memory/vmpod/vms/vm-dom1/cgroup.procs',
      '/sys/fs/cgroup/cpuset/vmpod/vms/vm-dom1/cgroup.procs',
      '/sys/fs/cgroup/cpu,cpuacct/vmpod/vms/vm-dom1/cgroup.procs',
      '/sys/fs/cgroup/unified/vmpod/vms/vm-dom1/cgroup.procs',
    ]);
    const cpuset = plan.steps[2]!;
    expect(cpuset.create).toEqual([
      '/sys/fs/cgroup/cpuset/vmpod',
      '/sys/fs/cgroup/cpuset/vmpod/vms',
      '/sys/fs/cgroup/cpuset/vmpod/vms/vm-dom1',
    ]);
    expect(cpuset.inheritCpuset).toBe(true);
    expect(plan.steps.filter((s) => s.inheritCpuset)).toHaveLength(1);
    // hybrid: cpuset is a v1 controller, nothing to enable in the unified hierarchy
    expect(plan.steps.flatMap((s) => s.enableCpuset)).toEqual([]);
  });

  it('pure v2 with VIRTLET_CPUSETS: +cpuset in every subtree_control from the root down to the leaf parent', () => {
    const plan = planCgroupMove({
      target: '/vms',
      leaf: 'vm-a',
      procCgroup: '0::/kubepods/pod1/libvirt\n',
      mountinfo: '30 1 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate',
      cpuset: true,
    });
    expect(plan.steps).toEqual([
      {
        hierarchy: { controllers: '', mount: '/sys/fs/cgroup', version: 2 },
        create: ['/sys/fs/cgroup/vms', '/sys/fs/cgroup/vms/vm-a'],
        inheritCpuset: false,
        enableCpuset: ['/sys/fs/cgroup/cgroup.subtree_control', '/sys/fs/cgroup/vms/cgroup.subtree_control'],
        procs: '/sys/fs/cgroup/vms/vm-a/cgroup.procs',
      },
    ]);
  });

  it('pure v2 in a cgroup namespace (the host hierarchy mounted from "/../.."): the leaf in that mount, outside the container', () => {
    const plan = planCgroupMove({
      target: '/vms',
      leaf: 'vm-a',
      // the container's own cgroup is its namespace's root
      procCgroup: '0::/\n',
      mountinfo: '30 1 0:27 /../../.. /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate',
      cpuset: false,
    });
    expect(plan.inCgroupNamespace).toBe(true);
    expect(plan.steps.map((s) => s.procs)).toEqual(['/sys/fs/cgroup/vms/vm-a/cgroup.procs']);
    expect(
      planCgroupMove({
        target: '/vms',
        leaf: 'vm-a',
        procCgroup: HYBRID_CGROUP,
        mountinfo: HYBRID_MOUNTS,
        cpuset: false,
      }).inCgroupNamespace,
    ).toBe(false);
  });

  it('refuses, before any change: a relative or unsafe path, an unmounted hierarchy, a namespaced mount, no cpuset', () => {
    const plan =
      (target: string, procCgroup = HYBRID_CGROUP, mountinfo = HYBRID_MOUNTS, cpuset = false) =>
      () =>
        planCgroupMove({ target, leaf: 'vm-a', procCgroup, mountinfo, cpuset });
    expect(plan('vms')).toThrow(/VMPOD_VM_CGROUP "vms" must be an absolute cgroup path/);
    expect(plan('/vms/../etc')).toThrow(/component "\.\." is not a plain name/);
    expect(plan('/vms/a b')).toThrow(/component "a b"/);
    expect(plan('/vms', `${HYBRID_CGROUP}11:pids:/x\n`)).toThrow(/cgroup v1 hierarchy pids is not mounted here/);
    expect(plan('/vms', '0::/\n', '30 1 0:27 /kubepods/pod1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw')).toThrow(
      /mounted at \/sys\/fs\/cgroup from \/kubepods\/pod1, not from its root.*mount the host's \/sys\/fs\/cgroup/,
    );
    // a sibling of the namespace's root ("/../x") is not the host's hierarchy either
    expect(plan('/vms', '0::/\n', '30 1 0:27 /../other /sys/fs/cgroup rw - cgroup2 cgroup2 rw')).toThrow(
      /from \/\.\.\/other, not from its root/,
    );
    expect(plan('/vms', '4:memory:/\n', HYBRID_MOUNTS, true)).toThrow(/VIRTLET_CPUSETS is set but no cpuset cgroup/);
    expect(parseCgroupPath('/')).toEqual([]);
  });

  it('reads cgroup mounts from mountinfo, unescaping paths', () => {
    expect(cgroupMounts(HYBRID_MOUNTS).map((m) => `${m.fstype} ${m.mountPoint} ${m.superOpts.at(-1)}`)).toEqual([
      'cgroup2 /sys/fs/cgroup/unified rw',
      'cgroup /sys/fs/cgroup/systemd name=systemd',
      'cgroup /sys/fs/cgroup/memory memory',
      'cgroup /sys/fs/cgroup/cpuset cpuset',
      'cgroup /sys/fs/cgroup/cpu,cpuacct cpuacct',
    ]);
  });

  it('names the leaf after the libvirt domain', () => {
    expect(leafName(['-name', 'guest=virtlet-1234-cirros,debug-threads=on', '-S'], 9)).toBe('vm-virtlet-1234-cirros');
    expect(leafName(['-name', 'plain'], 9)).toBe('vm-plain');
    expect(leafName(['-name', 'guest=a,,b/c,x=y'], 9)).toBe('vm-a_b_c');
    expect(leafName(['-S'], 9)).toBe('vm-9');
    expect(leafName(['-name', 'guest=..'], 9)).toBe('vm-9');
  });
});
