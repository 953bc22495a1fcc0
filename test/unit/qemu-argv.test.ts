import { describe, expect, it } from 'vitest';
import { ErrorCode } from '../../src/errors.js';
import { buildQemuArgv, IdAllocator, QemuNetdev, QemuVfioDevice } from '../../src/qemu/index.js';
import { thrownVmpodError as thrown } from '../helpers/errors.js';

const PC = ['-name', 'guest=vm', '-machine', 'pc-i440fx-7.2,usb=off', '-m', '1024'];
const Q35 = ['-name', 'guest=vm', '-machine', 'pc-q35-7.2,usb=off', '-m', '1024'];

describe('QemuNetdev (golden argv)', () => {
  it('single-queue tap', () => {
    expect(new QemuNetdev({ fds: [3], mac: '42:A4:A6:22:80:2E', index: 0 }).toArgs(new IdAllocator())).toEqual([
      '-netdev',
      'tap,id=vmpodnet0,fd=3',
      '-device',
      'virtio-net-pci,netdev=vmpodnet0,id=vmpodnic0,mac=42:a4:a6:22:80:2e',
    ]);
  });
  it('single queue with vhost', () => {
    expect(
      new QemuNetdev({ fds: [3], vhost: true, mac: '42:a4:a6:22:80:2e', index: 1 }).toArgs(new IdAllocator()),
    ).toEqual([
      '-netdev',
      'tap,id=vmpodnet1,fd=3,vhost=on',
      '-device',
      'virtio-net-pci,netdev=vmpodnet1,id=vmpodnic1,mac=42:a4:a6:22:80:2e',
    ]);
  });
  it('multiqueue with vhost and MTU: fds= in queue order, mq=on, vectors=2N+2', () => {
    const n = new QemuNetdev({ fds: [3, 4, 5, 6], vhost: true, mac: '42:a4:a6:22:80:2e', mtu: 1450, index: 0 });
    expect(n.validate()).toEqual([]);
    expect(n.toArgs(new IdAllocator())).toEqual([
      '-netdev',
      'tap,id=vmpodnet0,fds=3:4:5:6,vhost=on',
      '-device',
      'virtio-net-pci,netdev=vmpodnet0,id=vmpodnic0,mac=42:a4:a6:22:80:2e,host_mtu=1450,mq=on,vectors=10',
    ]);
  });
  it('multiqueue without vhost says vhost=off', () => {
    expect(
      new QemuNetdev({ fds: [3, 4], vhost: false, mac: '42:a4:a6:22:80:2e', index: 0 }).toArgs(new IdAllocator()),
    ).toEqual([
      '-netdev',
      'tap,id=vmpodnet0,fds=3:4,vhost=off',
      '-device',
      'virtio-net-pci,netdev=vmpodnet0,id=vmpodnic0,mac=42:a4:a6:22:80:2e,mq=on,vectors=6',
    ]);
  });
  it('eight queues', () => {
    const fds = [10, 11, 12, 13, 14, 15, 16, 17];
    expect(
      new QemuNetdev({ fds, vhost: false, mac: '42:a4:a6:22:80:2e', mtu: 1500, index: 2 }).toArgs(new IdAllocator()),
    ).toEqual([
      '-netdev',
      'tap,id=vmpodnet2,fds=10:11:12:13:14:15:16:17,vhost=off',
      '-device',
      'virtio-net-pci,netdev=vmpodnet2,id=vmpodnic2,mac=42:a4:a6:22:80:2e,host_mtu=1500,mq=on,vectors=18',
    ]);
  });
  it('validate reports every problem with its value', () => {
    const p = new QemuNetdev({ fds: [1, 5, 5], mac: '01:00:5e:00:00:01', mtu: 40, index: -1 }).validate();
    expect(p).toEqual([
      'index -1 is not a non-negative integer',
      'tap fd 1 is a stdio fd',
      'fd 5 used twice',
      'MAC 01:00:5e:00:00:01 is a multicast address',
      'MTU 40 is outside 68..65535',
    ]);
    expect(new QemuNetdev({ fds: [], mac: 'zz', index: 0 }).validate()).toEqual([
      'no tap fd',
      'MAC "zz" is not colon-hex of 6 bytes',
    ]);
    expect(
      new QemuNetdev({
        fds: Array.from({ length: 257 }, (_, i) => i + 3),
        mac: '02:00:00:00:00:01',
        index: 0,
      }).validate(),
    ).toEqual(['257 queues, at most 256']);
  });
});

describe('QemuVfioDevice (golden argv)', () => {
  it('host= with the full address, vmpodhostdev ids, bus when given', () => {
    const ids = new IdAllocator(['vmpodhostdev0']);
    expect(new QemuVfioDevice({ address: '0001:3d:02.2', source: 'QAT0' }).toArgs(ids)).toEqual([
      '-device',
      'vfio-pci,host=0001:3d:02.2,id=vmpodhostdev1',
    ]);
    expect(
      new QemuVfioDevice({ address: '0000:8a:04.0', source: 'tapmanager' }).toArgs(ids, { bus: 'vmpodrp0' }),
    ).toEqual(['-device', 'vfio-pci,host=0000:8a:04.0,id=vmpodhostdev2,bus=vmpodrp0']);
  });
  it('sysfsdev= for a mediated device, commas escaped', () => {
    const d = new QemuVfioDevice({
      address: '0000:00:02.0',
      sysfsdev: '/sys/bus/mdev/devices/4b20d080-1b54-4048-85b3-a6a62d165c01',
      source: 'MDEV_PCI_RESOURCE_X',
    });
    expect(d.validate()).toEqual([]);
    expect(d.toArgs(new IdAllocator())).toEqual([
      '-device',
      'vfio-pci,sysfsdev=/sys/bus/mdev/devices/4b20d080-1b54-4048-85b3-a6a62d165c01,id=vmpodhostdev0',
    ]);
    const odd = new QemuVfioDevice({
      address: '0000:00:02.0',
      sysfsdev: '/tmp/a,b/4b20d080-1b54-4048-85b3-a6a62d165c01',
      source: 's',
    });
    expect(odd.toArgs(new IdAllocator())[1]).toBe(
      'vfio-pci,sysfsdev=/tmp/a,,b/4b20d080-1b54-4048-85b3-a6a62d165c01,id=vmpodhostdev0',
    );
  });
  it('validate wants the full normalised address', () => {
    expect(new QemuVfioDevice({ address: '3d:02.2', source: '' }).validate()).toEqual([
      'PCI address "3d:02.2" is not a full lower-case dddd:bb:dd.f',
      'no source',
    ]);
    expect(new QemuVfioDevice({ address: '0000:3D:02.2', source: 'x' }).validate()).toHaveLength(1);
  });
});

describe('buildQemuArgv (golden argv)', () => {
  const net0 = { fds: [3], vhost: true, mac: '42:a4:a6:22:80:2e', mtu: 1500, index: 0 };
  const qat = { address: '0000:3d:02.2', source: 'QAT0' };
  const vf = { address: '0001:8a:04.0', source: 'tapmanager' };

  it('pc machine: libvirt args unchanged, then nets, then vfio on pci.0', () => {
    const lib = [
      ...PC,
      '-device',
      '{"driver":"vfio-pci","host":"0000:3e:00.0","id":"hostdev0","bus":"pci.0","addr":"0x5"}',
    ];
    const copy = [...lib];
    expect(buildQemuArgv(lib, [net0], [qat, vf])).toEqual([
      ...copy,
      '-netdev',
      'tap,id=vmpodnet0,fd=3,vhost=on',
      '-device',
      'virtio-net-pci,netdev=vmpodnet0,id=vmpodnic0,mac=42:a4:a6:22:80:2e,host_mtu=1500',
      '-device',
      'vfio-pci,host=0000:3d:02.2,id=vmpodhostdev0',
      '-device',
      'vfio-pci,host=0001:8a:04.0,id=vmpodhostdev1',
    ]);
    expect(lib).toEqual(copy);
  });

  it('q35: one root port per vfio device, with free chassis/port numbers, and bus= on the device', () => {
    const lib = [
      ...Q35,
      '-device',
      'pcie-root-port,port=0x10,chassis=1,id=pci.1,bus=pcie.0,multifunction=on,addr=0x2',
      '-device',
      '{"driver":"pcie-root-port","port":17,"chassis":2,"id":"pci.2","bus":"pcie.0","addr":"0x2.0x1"}',
    ];
    expect(buildQemuArgv(lib, [], [qat, vf])).toEqual([
      ...lib,
      '-device',
      'pcie-root-port,id=vmpodrp0,bus=pcie.0,chassis=3,port=0x12',
      '-device',
      'vfio-pci,host=0000:3d:02.2,id=vmpodhostdev0,bus=vmpodrp0',
      '-device',
      'pcie-root-port,id=vmpodrp1,bus=pcie.0,chassis=4,port=0x13',
      '-device',
      'vfio-pci,host=0001:8a:04.0,id=vmpodhostdev1,bus=vmpodrp1',
    ]);
  });

  it('skips ids that are already taken, in either syntax', () => {
    const lib = [
      ...PC,
      '-netdev',
      'tap,id=vmpodnet0,fd=30',
      '-device',
      '{"driver":"vfio-pci","host":"0000:3e:00.0","id":"vmpodhostdev0"}',
    ];
    expect(buildQemuArgv(lib, [{ fds: [3], mac: '02:00:00:00:00:01', index: 0 }], [qat]).slice(lib.length)).toEqual([
      '-netdev',
      'tap,id=vmpodnet1,fd=3',
      '-device',
      'virtio-net-pci,netdev=vmpodnet1,id=vmpodnic1,mac=02:00:00:00:00:01',
      '-device',
      'vfio-pci,host=0000:3d:02.2,id=vmpodhostdev1',
    ]);
  });

  it('two interfaces keep their fdIndex numbering', () => {
    const out = buildQemuArgv(
      PC,
      [
        { fds: [3], mac: '02:00:00:00:00:01', index: 0 },
        { fds: [4], mac: '02:00:00:00:00:02', index: 1 },
      ],
      [],
    );
    expect(out.slice(PC.length)).toEqual([
      '-netdev',
      'tap,id=vmpodnet0,fd=3',
      '-device',
      'virtio-net-pci,netdev=vmpodnet0,id=vmpodnic0,mac=02:00:00:00:00:01',
      '-netdev',
      'tap,id=vmpodnet1,fd=4',
      '-device',
      'virtio-net-pci,netdev=vmpodnet1,id=vmpodnic1,mac=02:00:00:00:00:02',
    ]);
  });

  it('throws BadRequest listing every problem and renders nothing', () => {
    const e = thrown(() =>
      buildQemuArgv(
        PC,
        [
          { fds: [3], mac: '02:00:00:00:00:01', index: 0 },
          { fds: [3], mac: '02:00:00:00:00:01', index: 0, mtu: 10 },
        ],
        [{ address: '3d:02.2', source: 'QAT0' }, qat, qat],
      ),
    );
    expect(e.code).toBe(ErrorCode.BadRequest);
    expect(e.message).toBe(
      'build qemu argv: net 1 (index 0): MTU 10 is outside 68..65535; ' +
        'vfio 0 (3d:02.2 from QAT0): PCI address "3d:02.2" is not a full lower-case dddd:bb:dd.f; ' +
        'net index 0 given twice; fd 3 given to more than one interface or queue; MAC 02:00:00:00:00:01 given twice; ' +
        'vfio device 0000:3d:02.2 given twice',
    );
  });

  it('no devices: libvirt args only', () => {
    expect(buildQemuArgv(Q35, [], [])).toEqual(Q35);
  });
});
