import * as fs from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { ErrorCode } from '../../src/errors.js';
import { parsePciAddress, Sysfs, sysfsRoot } from '../../src/devices/index.js';
import { makeFakeSysfs, removeFakeSysfs, type FakeSysfsTree } from '../helpers/fakesysfs.js';

let tree: FakeSysfsTree | undefined;
afterEach(() => {
  tree = removeFakeSysfs(tree);
});

describe('parsePciAddress', () => {
  it.each([
    ['0000:3d:02.2', '0000:3d:02.2'],
    ['0000:3D:02.2', '0000:3d:02.2'],
    ['3d:02.2', '0000:3d:02.2'],
    [' 0001:8a:1f.7\n', '0001:8a:1f.7'],
  ])('%j -> %s', (s, want) => expect(parsePciAddress(s)).toBe(want));

  it.each(['', '3d:02', '0000:3d:20.0', '0000:3d:02.8', '00000:3d:02.2', 'x0:3d:02.2', '0000-3d-02.2', '/dev/vfio/67'])(
    'rejects %j quoting it',
    (s) => {
      expect(() => parsePciAddress(s)).toThrow(
        expect.objectContaining({ code: ErrorCode.BadRequest, message: expect.stringContaining(JSON.stringify(s)) }),
      );
    },
  );
});

describe('sysfsRoot', () => {
  it('flag, then VMPOD_SYSFS_ROOT, then /sys', () => {
    expect(sysfsRoot({ VMPOD_SYSFS_ROOT: '/env' }, '/flag')).toBe('/flag');
    expect(sysfsRoot({ VMPOD_SYSFS_ROOT: '/env' })).toBe('/env');
    expect(sysfsRoot({})).toBe('/sys');
  });
});

describe('Sysfs on a fake tree', () => {
  function sriovTree(): FakeSysfsTree {
    tree = makeFakeSysfs();
    tree.addPci({ address: '0000:8a:00.0', driver: 'ice', iommuGroup: '40', net: [{ ifname: 'ens1f0' }] });
    tree.addPci({
      address: '0000:8a:01.0',
      driver: 'iavf',
      iommuGroup: '145',
      physfn: '0000:8a:00.0',
      vfIndex: 0,
      net: [{ ifname: 'ens1f0v0' }],
    });
    tree.addPci({
      address: '0000:8a:01.1',
      driver: 'iavf',
      iommuGroup: '146',
      physfn: '0000:8a:00.0',
      vfIndex: 1,
      net: [{ ifname: 'ens1f0v1', mac: '5a:00:00:00:00:01' }],
    });
    tree.addVirtualNet('veth0');
    return tree;
  }

  it('pciDevice reads class, ids, driver, group and the VF links', () => {
    const s = new Sysfs(sriovTree().root);
    expect(s.pciDevice('8a:01.1')).toEqual({
      address: '0000:8a:01.1',
      class: 0x020000,
      vendor: '0x8086',
      device: '0x1889',
      driver: 'iavf',
      iommuGroup: '146',
      physfn: '0000:8a:00.0',
      virtfnIndex: 1,
    });
    expect(s.pciDevice('0000:8a:00.0')).toEqual({
      address: '0000:8a:00.0',
      class: 0x020000,
      vendor: '0x8086',
      device: '0x1889',
      driver: 'ice',
      iommuGroup: '40',
    });
    expect(s.pciDevice('0000:99:00.0')).toBeUndefined();
  });

  it("the fake tree's links resolve like the kernel's", () => {
    const t = sriovTree();
    expect(fs.existsSync(t.p('bus/pci/devices/0000:8a:01.1/driver/unbind'))).toBe(true);
    expect(fs.existsSync(t.p('bus/pci/devices/0000:8a:01.1/iommu_group/devices/0000:8a:01.1/class'))).toBe(true);
    expect(fs.existsSync(t.p('class/net/ens1f0v1/device/physfn/virtfn1/class'))).toBe(true);
  });

  it('iommuGroupDevices lists a group, [] for a missing one, rejects a non-number', () => {
    const s = new Sysfs(sriovTree().root);
    expect(s.iommuGroupDevices('145')).toEqual(['0000:8a:01.0']);
    expect(s.iommuGroupDevices('9999')).toEqual([]);
    expect(() => s.iommuGroupDevices('../..')).toThrow(expect.objectContaining({ code: ErrorCode.BadRequest }));
  });

  it('netDevicePci, isVf, vfInfo', () => {
    const s = new Sysfs(sriovTree().root);
    expect(s.netDevicePci('ens1f0v1')).toBe('0000:8a:01.1');
    expect(s.netDevicePci('veth0')).toBeUndefined();
    expect(s.netDevicePci('nosuch')).toBeUndefined();
    expect(s.isVf('ens1f0v1')).toBe(true);
    expect(s.isVf('ens1f0')).toBe(false);
    expect(s.isVf('veth0')).toBe(false);
    expect(s.vfInfo('ens1f0v1')).toEqual({
      address: '0000:8a:01.1',
      pfAddress: '0000:8a:00.0',
      pfIfname: 'ens1f0',
      vfIndex: 1,
    });
    expect(() => s.vfInfo('ens1f0')).toThrow(
      expect.objectContaining({
        code: ErrorCode.Device,
        message: expect.stringContaining('ens1f0 is not an SR-IOV VF'),
      }),
    );
    expect(() => s.isVf('../../etc')).toThrow(expect.objectContaining({ code: ErrorCode.BadRequest }));
  });

  it('mdevDevice resolves the parent and group', () => {
    tree = makeFakeSysfs();
    tree.addPci({ address: '0000:00:02.0', class: 0x030000, driver: 'i915', iommuGroup: '1' });
    tree.addMdev('4b20d080-1b54-4048-85b3-a6a62d165c01', '0000:00:02.0', '20');
    const s = new Sysfs(tree.root);
    expect(s.mdevDevice('4b20d080-1b54-4048-85b3-a6a62d165c01')).toEqual({
      uuid: '4b20d080-1b54-4048-85b3-a6a62d165c01',
      parent: '0000:00:02.0',
      iommuGroup: '20',
    });
    expect(s.mdevDevice('00000000-0000-0000-0000-000000000000')).toBeUndefined();
  });
});
