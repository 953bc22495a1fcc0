import { describe, it, expect, afterAll } from 'vitest';
import { mkdtempSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fdsNamedInArgv } from '../../src/vmwrapper/fds.js';
import { parseCpuset, cpusetFile, applyCpuset } from '../../src/vmwrapper/cpuset.js';
import { errOf } from '../helpers/errors.js';

describe('fdsNamedInArgv', () => {
  it('finds fds in key=value and JSON arguments', () => {
    const argv = [
      '-chardev',
      'socket,id=charmonitor,fd=28,server=on,wait=off',
      '-add-fd',
      'set=0,fd=30,opaque=serial0-log',
      '-netdev',
      '{"type":"tap","fd":"31","id":"hostnet0"}',
      '-blockdev',
      '{"driver":"file","filename":"/x,fd=99"}',
      '-name',
      'guest=fd=7',
    ];
    // "/x,fd=99" is inside a filename but still looks like an option: harmless to keep open, so it is listed
    expect(fdsNamedInArgv(argv)).toEqual([28, 30, 31, 99]);
  });
});

describe('cpuset', () => {
  const dir = mkdtempSync(join(tmpdir(), 'vmpod-cg-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('validates CPU lists and names the bad value', () => {
    expect(parseCpuset('0-3,8')).toBe('0-3,8');
    expect(() => parseCpuset('0-3;8')).toThrow(/VIRTLET_CPUSETS "0-3;8"/);
    expect(() => parseCpuset('4-2')).toThrow(/backwards/);
  });

  it('finds the cpuset file for cgroup v1 and v2', () => {
    expect(cpusetFile('12:cpuset:/machine/qemu-1\n0::/x\n', '/sys/fs/cgroup')).toBe(
      '/sys/fs/cgroup/cpuset/machine/qemu-1/cpuset.cpus',
    );
    expect(cpusetFile('0::/machine.slice/qemu-2.scope\n', '/sys/fs/cgroup')).toBe(
      '/sys/fs/cgroup/machine.slice/qemu-2.scope/cpuset.cpus',
    );
    expect(() => cpusetFile('', '/sys/fs/cgroup')).toThrow(/no cpuset cgroup/);
  });

  it('writes the list into the cgroup the process runs in', () => {
    mkdirSync(join(dir, 'cpuset/machine/vm1'), { recursive: true });
    writeFileSync(join(dir, 'cpuset/machine/vm1/cpuset.cpus'), '0-7');
    const file = applyCpuset('2-3', { cgroupRoot: dir, procCgroup: '5:cpuset:/machine/vm1\n' });
    expect(readFileSync(file, 'utf8')).toBe('2-3');
    expect(() => applyCpuset('1', { cgroupRoot: dir, procCgroup: '5:cpuset:/missing\n' })).toThrow(
      /write 1 to .*missing/,
    );
  });
});

describe('planExec: the whole plan first, then the host', () => {
  it('planning writes nothing; applyPlan writes the cpuset', async () => {
    const { planExec, applyPlan } = await import('../../src/vmwrapper/run.js');
    const { cpusetFile: fileFor } = await import('../../src/vmwrapper/cpuset.js');
    const root = mkdtempSync(join(tmpdir(), 'vmpod-plan-'));
    try {
      const file = fileFor(readFileSync('/proc/self/cgroup', 'utf8'), root);
      mkdirSync(join(file, '..'), { recursive: true });
      writeFileSync(file, '0-7');
      const plan = await planExec(['-name', 'vm'], {
        VIRTLET_EMULATOR: '/bin/true',
        VIRTLET_CPUSETS: '1',
        VMPOD_CGROUP_ROOT: root,
        VMPOD_SYSFS_ROOT: root,
      });
      expect(readFileSync(file, 'utf8')).toBe('0-7');
      applyPlan(plan);
      expect(readFileSync(file, 'utf8')).toBe('1');
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});

describe('logLine: vmwrapper one hand-written JSON line', () => {
  it('is one JSON line with the daemon log shape, the fields and the message', async () => {
    const { logLine } = await import('../../src/vmwrapper/logline.js');
    const line = logLine(
      { emulator: '/usr/bin/qemu-system-x86_64', argv: ['qemu', '-name', 'a"b\nc'] },
      'exec emulator',
      42,
      new Date(0),
    );
    expect(line.endsWith('\n')).toBe(true);
    expect(line.slice(0, -1)).not.toContain('\n');
    expect(JSON.parse(line)).toEqual({
      level: 30,
      time: '1970-01-01T00:00:00.000Z',
      pid: 42,
      name: 'vmwrapper',
      emulator: '/usr/bin/qemu-system-x86_64',
      argv: ['qemu', '-name', 'a"b\nc'],
      msg: 'exec emulator',
    });
  });
});

describe('queues and vhost (VMPOD_NET_QUEUES, -smp, /dev/vhost-net)', async () => {
  const { netQueues, smpCpus, vhostUsable } = await import('../../src/vmwrapper/queues.js');

  it('reads the vCPUs from the last -smp in every form libvirt and people write', () => {
    expect(smpCpus(['-m', '256'])).toBe(1);
    expect(smpCpus(['-smp', '4'])).toBe(4);
    expect(smpCpus(['-smp', '4,sockets=4,dies=1,cores=1,threads=1'])).toBe(4);
    expect(smpCpus(['-smp', 'cpus=6,maxcpus=12'])).toBe(6);
    expect(smpCpus(['-smp', '2,maxcpus=16'])).toBe(2);
    expect(smpCpus(['-smp', 'sockets=2,cores=3,threads=2'])).toBe(12);
    expect(smpCpus(['-smp', 'maxcpus=5'])).toBe(5);
    expect(smpCpus(['-smp', '2', '-smp', '3'])).toBe(3);
  });

  it('auto: the vCPUs, at most 8; a number: exactly that; a bad value is named', () => {
    expect(netQueues(['-smp', '4'], {})).toBe(4);
    expect(netQueues(['-smp', '4'], { VMPOD_NET_QUEUES: 'auto' })).toBe(4);
    expect(netQueues(['-smp', '32'], {})).toBe(8);
    expect(netQueues([], {})).toBe(1);
    expect(netQueues(['-smp', '32'], { VMPOD_NET_QUEUES: '1' })).toBe(1);
    expect(netQueues(['-smp', '2'], { VMPOD_NET_QUEUES: '16' })).toBe(16);
    for (const v of ['0', '257', 'four', '-1', '2.5', ' 4']) {
      const e = errOf(() => netQueues([], { VMPOD_NET_QUEUES: v }));
      expect(e.message).toBe(
        `VMPOD_NET_QUEUES=${JSON.stringify(v)}: expected "auto" or a number of queues from 1 to 256`,
      );
    }
  });

  it('vhost is on when <dev root>/dev/vhost-net opens read-write, off with the errno otherwise', () => {
    const root = mkdtempSync(join(tmpdir(), 'vmpod-vhost-'));
    try {
      expect(vhostUsable(root)).toEqual({ on: false, why: `${root}/dev/vhost-net: ENOENT` });
      mkdirSync(join(root, 'dev'));
      writeFileSync(join(root, 'dev/vhost-net'), '');
      expect(vhostUsable(root)).toEqual({ on: true });
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});
