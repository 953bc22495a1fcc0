import { describe, expect, it } from 'vitest';
import {
  escapeQemuValue,
  IdAllocator,
  isQ35,
  parseQemuOptValue,
  splitQemuOpts,
  usedIds,
  usedPcieNumbers,
} from '../../src/qemu/index.js';

describe('escapeQemuValue / splitQemuOpts', () => {
  it('doubles commas and splits on single ones', () => {
    expect(escapeQemuValue('a,b,,c')).toBe('a,,b,,,,c');
    expect(splitQemuOpts('file=/x,,y,id=d0')).toEqual(['file=/x,y', 'id=d0']);
    expect(splitQemuOpts(`path=${escapeQemuValue('/a,b')},id=z`)).toEqual(['path=/a,b', 'id=z']);
  });
  it('reads the implied first key', () => {
    expect(parseQemuOptValue('tap,id=n0,fd=3')).toEqual({ '': 'tap', id: 'n0', fd: '3' });
  });
});

describe('usedIds', () => {
  it('finds ids in key=value form, including ,, escaping', () => {
    const argv = [
      '-name',
      'guest=vm,,1,debug-threads=on',
      '-chardev',
      'socket,id=charmonitor,fd=22,server=on,wait=off',
      '-drive',
      'file=/var/lib/a,,b.qcow2,format=qcow2,if=none,id=drive-virtio-disk0',
      '-device',
      'virtio-blk-pci,bus=pci.0,addr=0x4,drive=drive-virtio-disk0,id=virtio-disk0,bootindex=1',
      '-device',
      'vfio-pci,host=0000:3d:02.2,id=hostdev0,bus=pci.0,addr=0x5',
      '-nodefaults',
      '-no-user-config',
    ];
    expect([...usedIds(argv)].sort()).toEqual(['charmonitor', 'drive-virtio-disk0', 'hostdev0', 'virtio-disk0']);
  });
  it('does not take an id= inside an escaped value', () => {
    expect([...usedIds(['-drive', 'file=/x,,id=fake,id=real'])]).toEqual(['real']);
  });
  it('finds ids in libvirt 9 JSON form', () => {
    const argv = [
      '-blockdev',
      '{"driver":"file","filename":"/a.qcow2","node-name":"libvirt-1-storage"}',
      '-device',
      '{"driver":"vfio-pci","host":"0000:3d:02.2","id":"hostdev0","bus":"pci.0","addr":"0x5"}',
      '-object',
      '{"qom-type":"memory-backend-ram","id":"pc.ram","size":1073741824}',
      '-netdev',
      '{"type":"tap","fd":"24","id":"hostnet0"}',
    ];
    expect([...usedIds(argv)].sort()).toEqual(['hostdev0', 'hostnet0', 'pc.ram']);
  });
  it('ignores malformed JSON and options without values', () => {
    expect(usedIds(['-device', '{"driver":', '-S', '-no-shutdown']).size).toBe(0);
  });
});

describe('IdAllocator', () => {
  it('prefers the given number, else the smallest free one common to all prefixes', () => {
    const ids = new IdAllocator(['vmpodnet0', 'vmpodnic1']);
    expect(ids.allocate(['vmpodnet', 'vmpodnic'], 0)).toBe(2);
    expect(ids.allocate(['vmpodnet', 'vmpodnic'], 5)).toBe(5);
    expect(ids.next('vmpodhostdev')).toBe('vmpodhostdev0');
    expect(ids.next('vmpodhostdev')).toBe('vmpodhostdev1');
    expect(ids.has('vmpodnic5')).toBe(true);
  });
});

describe('isQ35', () => {
  it.each([
    [['-machine', 'pc-q35-7.2,usb=off,dump-guest-core=off'], true],
    [['-machine', 'q35'], true],
    [['-M', 'q35,accel=kvm'], true],
    [['-machine', 'type=pc-q35-8.0,accel=kvm'], true],
    [['-machine', '{"type":"pc-q35-7.2","usb":false}'], true],
    [['-machine', 'pc-i440fx-7.2,usb=off'], false],
    [['-machine', '{"type":"pc-i440fx-7.2"}'], false],
    [['-machine', 'accel=kvm'], false],
    [[], false],
  ])('%j -> %s', (argv, want) => {
    expect(isQ35(argv)).toBe(want);
  });
});

describe('usedPcieNumbers', () => {
  it('reads chassis and ports of libvirt root ports in both forms', () => {
    const u = usedPcieNumbers([
      '-device',
      'pcie-root-port,port=0x10,chassis=1,id=pci.1,bus=pcie.0,multifunction=on,addr=0x2',
      '-device',
      '{"driver":"pcie-root-port","port":17,"chassis":2,"id":"pci.2","bus":"pcie.0","addr":"0x2.0x1"}',
      '-device',
      'pci-bridge,chassis_nr=3,id=pci.3,bus=pci.2',
    ]);
    expect([...u.chassis].sort()).toEqual([1, 2, 3]);
    expect([...u.ports].sort()).toEqual([16, 17]);
  });
});
