// vmwrapper as libvirt runs it to probe the emulator: argv untouched, same PID, libvirt's fds inherited.
import { describe, it, expect, afterAll } from 'vitest';
import { openSync, closeSync, mkdtempSync, writeFileSync, rmSync, fstatSync, statSync, readFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runVmwrapper, STUB_EMULATOR, ambientFds } from '../helpers/vmwrapper.js';
import { BIN } from '../helpers/daemon.js';

const dir = mkdtempSync(join(tmpdir(), 'vmpod-probe-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

// exactly libvirt's probe (docs/decisions.md)
const probeArgs = [
  '-S',
  '-no-user-config',
  '-nodefaults',
  '-nographic',
  '-machine',
  'none,accel=kvm:tcg',
  '-qmp',
  'unix:/var/lib/libvirt/qemu/qmp-x/qmp.monitor,server=on,wait=off',
  '-pidfile',
  '/var/lib/libvirt/qemu/qmp-x/qmp.pid',
  '-daemonize',
];

describe('vmwrapper probe pass-through', () => {
  it('is a program of its own, as libvirt runs it: mode 755, its shebang the node that built it (no env hop)', () => {
    const [first] = readFileSync(BIN.vmwrapper, 'utf8').split('\n', 1);
    expect(first).toBe(`#!${process.execPath}`);
    expect(statSync(BIN.vmwrapper).mode & 0o777).toBe(0o755);
    const r = spawnSync(BIN.vmwrapper, ['-version'], {
      env: { VMWRAPPER_DEFAULT_EMULATOR: '/bin/echo', VMPOD_LOG_LEVEL: 'silent' },
      encoding: 'utf8',
    });
    expect([r.status, r.stdout]).toEqual([0, '-version\n']);
  });

  it('execs the default emulator with argv untouched, in the same process', async () => {
    const r = await runVmwrapper({
      args: probeArgs,
      env: { VMWRAPPER_DEFAULT_EMULATOR: STUB_EMULATOR, VMPOD_LOG_LEVEL: 'silent' },
    });
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(r.stub!.argv).toEqual([STUB_EMULATOR, ...probeArgs]);
    expect(r.stub!.pid).toBe(r.pid);
    // stdio reaches the emulator; SIGPIPE/SIGXFSZ back to default, nothing blocked
    expect(Object.keys(r.stub!.fds)).toEqual(expect.arrayContaining(['0', '1', '2']));
    expect(BigInt(`0x${r.stub!.sigIgn}`)).toBe(0n);
    expect(BigInt(`0x${r.stub!.sigBlk}`)).toBe(0n);
  });

  it('an empty VIRTLET_EMULATOR is a probe too, and the emulator exit code comes back', async () => {
    const r = await runVmwrapper({
      args: ['-version'],
      env: {
        VIRTLET_EMULATOR: '',
        VMWRAPPER_DEFAULT_EMULATOR: STUB_EMULATOR,
        STUB_EMULATOR_EXIT: '3',
        VMPOD_LOG_LEVEL: 'silent',
      },
    });
    expect(r.code).toBe(3);
    expect(r.stub!.argv).toEqual([STUB_EMULATOR, '-version']);
  });

  it('keeps the fds libvirt passed (low ones named in argv, high ones inheritable) and nothing else', async () => {
    const a = join(dir, 'monitor');
    const b = join(dir, 'fdset');
    writeFileSync(a, 'a');
    writeFileSync(b, 'b');
    const fa = openSync(a, 'r');
    const fb = openSync(b, 'r');
    try {
      const args = [
        '-chardev',
        'socket,id=charmonitor,fd=5,server=on,wait=off',
        '-add-fd',
        'set=0,fd=28,opaque=serial0-log',
      ];
      const r = await runVmwrapper({
        args,
        env: { VMWRAPPER_DEFAULT_EMULATOR: STUB_EMULATOR, VMPOD_LOG_LEVEL: 'silent' },
        passFds: { 5: fa, 28: fb },
      });
      expect(r.code).toBe(0);
      const fds = r.stub!.fds;
      expect(fds['5']?.target).toBe(a);
      expect(fds['28']?.target).toBe(b);
      // nothing of node's (eventpoll, eventfd, pipes) leaks into the emulator
      const expected = ['0', '1', '2', '5', '28', ...ambientFds()];
      expect(Object.entries(fds).filter(([n]) => !expected.includes(n))).toEqual([]);
      expect(statSync(a).ino).toBe(fstatSync(fa).ino);
    } finally {
      closeSync(fa);
      closeSync(fb);
    }
  });

  it('fails with one clear line when the emulator cannot be executed', async () => {
    const r = await runVmwrapper({
      args: ['-S'],
      env: { VMWRAPPER_DEFAULT_EMULATOR: join(dir, 'missing-qemu'), VMPOD_LOG_LEVEL: 'silent' },
    });
    expect(r.code).toBe(1);
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(/^vmwrapper: .*missing-qemu.*ENOENT/);
  });
});
