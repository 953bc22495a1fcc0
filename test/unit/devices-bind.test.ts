import { afterEach, describe, expect, it } from 'vitest';
import { ErrorCode } from '../../src/errors.js';
import { bindToVfio, restoreDriver, Sysfs } from '../../src/devices/index.js';
import { FakeSysfs, makeFakeSysfs, removeFakeSysfs, simulateProbe, type FakeSysfsTree } from '../helpers/fakesysfs.js';

let tree: FakeSysfsTree | undefined;
afterEach(() => {
  tree = removeFakeSysfs(tree);
});

function qatTree(driver?: string): FakeSysfsTree {
  tree = makeFakeSysfs();
  tree.addPci({
    address: '0000:3d:02.2',
    class: 0x0b4000,
    vendor: '0x8086',
    device: '0x4941',
    driver,
    iommuGroup: '67',
  });
  tree.ensureDriver('vfio-pci');
  return tree;
}

describe('bindToVfio', () => {
  it('unbinds, sets driver_override, probes, and checks the result', () => {
    const s = new FakeSysfs(qatTree('qat_4xxx'));
    expect(bindToVfio(s, '3d:02.2')).toEqual({ previousDriver: 'qat_4xxx' });
    expect(s.writes).toEqual([
      { path: 'bus/pci/devices/0000:3d:02.2/driver/unbind', data: '0000:3d:02.2' },
      { path: 'bus/pci/devices/0000:3d:02.2/driver_override', data: 'vfio-pci' },
      { path: 'bus/pci/drivers_probe', data: '0000:3d:02.2' },
    ]);
    expect(tree!.read('bus/pci/drivers/qat_4xxx/unbind')).toBe('0000:3d:02.2');
    expect(tree!.driverOf('0000:3d:02.2')).toBe('vfio-pci');
  });

  it('a device with no driver is not unbound', () => {
    const s = new FakeSysfs(qatTree(undefined));
    expect(bindToVfio(s, '0000:3d:02.2')).toEqual({});
    expect(s.writes.map((w) => w.path)).toEqual([
      'bus/pci/devices/0000:3d:02.2/driver_override',
      'bus/pci/drivers_probe',
    ]);
  });

  it('is a no-op when already on vfio-pci', () => {
    const s = new FakeSysfs(qatTree('vfio-pci'));
    expect(bindToVfio(s, '0000:3d:02.2')).toEqual({ previousDriver: 'vfio-pci' });
    expect(s.writes).toEqual([]);
  });

  it('fails when nothing binds after the probe (vfio-pci not loaded)', () => {
    const s = new FakeSysfs(qatTree('qat_4xxx'));
    s.probe = 'nothing';
    expect(() => bindToVfio(s, '0000:3d:02.2')).toThrow(
      expect.objectContaining({
        code: ErrorCode.Device,
        message:
          'bind 0000:3d:02.2 to vfio-pci: after the probe it is bound to no driver (is the vfio-pci module loaded?)',
      }),
    );
  });

  it('names the device and its driver when a write fails', () => {
    const s = new FakeSysfs(qatTree('qat_4xxx'));
    s.failing.add('bus/pci/devices/0000:3d:02.2/driver_override');
    expect(() => bindToVfio(s, '0000:3d:02.2')).toThrow(
      expect.objectContaining({ code: ErrorCode.Device, message: 'bind 0000:3d:02.2 to vfio-pci (was qat_4xxx)' }),
    );
  });

  it('missing device', () => {
    const s = new FakeSysfs(qatTree());
    expect(() => bindToVfio(s, '0000:3d:02.3')).toThrow(expect.objectContaining({ code: ErrorCode.Device }));
  });

  it('plain Sysfs writes the files; simulateProbe does the kernel part by hand', () => {
    const t = qatTree(undefined);
    const s = new Sysfs(t.root);
    // no probe simulation inside the call: the check after the probe fails, the writes are there
    expect(() => bindToVfio(s, '0000:3d:02.2')).toThrow(/after the probe it is bound to no driver/);
    expect(t.read('bus/pci/devices/0000:3d:02.2/driver_override')).toBe('vfio-pci');
    expect(t.read('bus/pci/drivers_probe')).toBe('0000:3d:02.2');
    simulateProbe(t, '0000:3d:02.2');
    expect(t.driverOf('0000:3d:02.2')).toBe('vfio-pci');
  });
});

describe('restoreDriver', () => {
  it('unbinds from vfio-pci, clears the override, probes', () => {
    const s = new FakeSysfs(qatTree('qat_4xxx'));
    const { previousDriver } = bindToVfio(s, '0000:3d:02.2');
    s.writes.length = 0;
    restoreDriver(s, '0000:3d:02.2', previousDriver);
    expect(s.writes).toEqual([
      { path: 'bus/pci/devices/0000:3d:02.2/driver/unbind', data: '0000:3d:02.2' },
      { path: 'bus/pci/devices/0000:3d:02.2/driver_override', data: '\n' },
      { path: 'bus/pci/drivers_probe', data: '0000:3d:02.2' },
    ]);
    expect(tree!.read('bus/pci/drivers/vfio-pci/unbind')).toBe('0000:3d:02.2');
  });

  it('does nothing when the device was on vfio-pci before', () => {
    const s = new FakeSysfs(qatTree('vfio-pci'));
    restoreDriver(s, '0000:3d:02.2', 'vfio-pci');
    expect(s.writes).toEqual([]);
  });

  it('keeps going past a failing step and reports it', () => {
    const s = new FakeSysfs(qatTree('vfio-pci'));
    s.failing.add('bus/pci/devices/0000:3d:02.2/driver/unbind');
    expect(() => restoreDriver(s, '0000:3d:02.2', 'qat_4xxx')).toThrow(
      expect.objectContaining({ code: ErrorCode.Device, message: 'restore driver qat_4xxx of 0000:3d:02.2' }),
    );
    expect(s.writes.map((w) => w.path)).toEqual([
      'bus/pci/devices/0000:3d:02.2/driver/unbind',
      'bus/pci/devices/0000:3d:02.2/driver_override',
      'bus/pci/drivers_probe',
    ]);
  });
});
