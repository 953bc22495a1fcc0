import { afterEach, describe, expect, it } from 'vitest';
import { ErrorCode } from '../../src/errors.js';
import { classifyCriDevices, collectPluginDevices, parseCriDevices, Sysfs } from '../../src/devices/index.js';
import { buildQemuArgv } from '../../src/qemu/index.js';
import { thrownVmpodError as thrown } from '../helpers/errors.js';
import { makeFakeSysfs, removeFakeSysfs, type FakeSysfsTree } from '../helpers/fakesysfs.js';

let tree: FakeSysfsTree | undefined;
afterEach(() => {
  tree = removeFakeSysfs(tree);
});

const MDEV = '4b20d080-1b54-4048-85b3-a6a62d165c01';

/** QAT VFs in groups 67/68, SR-IOV VFs in 145/146, a GPU group with a bridge, an mdev, a device on its own driver. */
function node(): { tree: FakeSysfsTree; sysfs: Sysfs } {
  const t = makeFakeSysfs();
  tree = t;
  const qat = { class: 0x0b4000, vendor: '0x8086', device: '0x4941' };
  t.addPci({ address: '0000:3d:02.2', ...qat, driver: 'vfio-pci', iommuGroup: '67' });
  t.addPci({ address: '0000:3d:02.3', ...qat, driver: 'vfio-pci', iommuGroup: '68' });
  t.addPci({ address: '0000:3d:02.4', ...qat, driver: 'qat_4xxx', iommuGroup: '69' });
  t.addPci({ address: '0000:8a:04.0', driver: 'vfio-pci', iommuGroup: '145' });
  t.addPci({ address: '0000:8a:04.1', driver: 'vfio-pci', iommuGroup: '146' });
  // a GPU behind a PCIe switch port that shares its group: bridge (0x0604) + VGA function + audio function
  t.addPci({ address: '0000:40:00.0', class: 0x060400, driver: 'pcieport', iommuGroup: '30' });
  t.addPci({ address: '0000:41:00.0', class: 0x030000, driver: 'vfio-pci', iommuGroup: '30' });
  t.addPci({ address: '0000:41:00.1', class: 0x040300, driver: 'vfio-pci', iommuGroup: '30' });
  // a group with a host bridge and an endpoint still on its own driver
  t.addPci({ address: '0000:00:00.0', class: 0x060000, iommuGroup: '31' });
  t.addPci({ address: '0000:00:1f.6', driver: 'e1000e', iommuGroup: '31' });
  // non-zero domain
  t.addPci({ address: '0001:02:00.0', driver: 'vfio-pci', iommuGroup: '90' });
  // mediated device on an iGPU
  t.addPci({ address: '0000:00:02.0', class: 0x030000, driver: 'i915', iommuGroup: '1' });
  t.addMdev(MDEV, '0000:00:02.0', '20');
  return { tree: t, sysfs: new Sysfs(t.root) };
}

const GROUP67 = JSON.stringify([
  { containerPath: '/dev/vfio/vfio', hostPath: '/dev/vfio/vfio', permissions: 'mrw' },
  { containerPath: '/dev/vfio/67', hostPath: '/dev/vfio/67', permissions: 'mrw' },
]);

describe('collectPluginDevices: the seed case', () => {
  it('QAT0=0000:3d:02.2 with /dev/vfio/67 in VIRTLET_DEVICES gives one vfio-pci device and no disk', () => {
    const { sysfs } = node();
    const env = { QAT0: '0000:3d:02.2', VIRTLET_DEVICES: GROUP67, PATH: '/usr/bin' };
    const devs = collectPluginDevices(env, sysfs);
    expect(devs).toEqual([{ address: '0000:3d:02.2', source: 'QAT0' }]);
    const cls = classifyCriDevices(parseCriDevices(GROUP67, 'VIRTLET_DEVICES'));
    expect(cls.block).toEqual([]);
    const argv = buildQemuArgv(['-machine', 'pc-i440fx-7.2'], [], devs);
    expect(argv.filter((a) => a.startsWith('vfio-pci,'))).toEqual(['vfio-pci,host=0000:3d:02.2,id=vmpodhostdev0']);
    expect(argv.some((a) => a.includes('/dev/vfio') || a === '-drive')).toBe(false);
  });
});

describe('collectPluginDevices: conventions', () => {
  it('PCIDEVICE_<R> with its _INFO twin skipped and its dev-mount used for the group', () => {
    const { sysfs } = node();
    const env = {
      PCIDEVICE_INTEL_COM_INTEL_SRIOV_NETDEVICE: '0000:8a:04.0,0000:8a:04.1',
      PCIDEVICE_INTEL_COM_INTEL_SRIOV_NETDEVICE_INFO: JSON.stringify({
        '0000:8a:04.0': { generic: { deviceID: '0000:8a:04.0' }, vfio: { 'dev-mount': '/dev/vfio/145', mount: '/dev/vfio/vfio' } },
        '0000:8a:04.1': { generic: { deviceID: '0000:8a:04.1' }, vfio: { 'dev-mount': '/dev/vfio/146', mount: '/dev/vfio/vfio' } },
      }),
    };
    expect(collectPluginDevices(env, sysfs)).toEqual([
      { address: '0000:8a:04.0', source: 'PCIDEVICE_INTEL_COM_INTEL_SRIOV_NETDEVICE' },
      { address: '0000:8a:04.1', source: 'PCIDEVICE_INTEL_COM_INTEL_SRIOV_NETDEVICE' },
    ]);
  });

  it('a twin whose group disagrees with sysfs is a Device error naming both', () => {
    const { sysfs } = node();
    const e = thrown(() =>
      collectPluginDevices(
        { PCIDEVICE_X: '0000:8a:04.0', PCIDEVICE_X_INFO: '{"0000:8a:04.0":{"vfio":{"dev-mount":"/dev/vfio/146"}}}' },
        sysfs,
      ),
    );
    expect(e.code).toBe(ErrorCode.Device);
    expect(e.message).toContain('PCIDEVICE_X_INFO says IOMMU group 146, sysfs says 145');
  });

  it('PCI_RESOURCE_<R> with a trailing comma, short addresses normalised, non-zero domain', () => {
    const { sysfs } = node();
    expect(collectPluginDevices({ PCI_RESOURCE_NVIDIA_COM_GPU: '0001:02:00.0,8a:04.1,' }, sysfs)).toEqual([
      { address: '0001:02:00.0', source: 'PCI_RESOURCE_NVIDIA_COM_GPU' },
      { address: '0000:8a:04.1', source: 'PCI_RESOURCE_NVIDIA_COM_GPU' },
    ]);
  });

  it('MDEV_PCI_RESOURCE_<R>: mediated devices by sysfsdev, parent on its own driver', () => {
    const { tree: t, sysfs } = node();
    expect(collectPluginDevices({ MDEV_PCI_RESOURCE_INTEL_COM_GVT: MDEV }, sysfs)).toEqual([
      { address: '0000:00:02.0', sysfsdev: `${t.root}/bus/mdev/devices/${MDEV}`, source: 'MDEV_PCI_RESOURCE_INTEL_COM_GVT' },
    ]);
    // the mdev's own IOMMU group node resolves to the same mediated device, deduplicated
    const groupOfMdev = JSON.stringify([{ containerPath: '/dev/vfio/20', hostPath: '/dev/vfio/20', permissions: 'mrw' }]);
    expect(collectPluginDevices({ MDEV_PCI_RESOURCE_INTEL_COM_GVT: MDEV, VIRTLET_DEVICES: groupOfMdev }, sysfs)).toHaveLength(1);
    expect(collectPluginDevices({ VIRTLET_DEVICES: groupOfMdev }, sysfs)).toEqual([
      { address: '0000:00:02.0', sysfsdev: `${t.root}/bus/mdev/devices/${MDEV}`, source: 'VIRTLET_DEVICES' },
    ]);
  });

  it('QAT<n> read by number; VIRTLET_DEVICES snake_case; noiommu nodes; /dev/vfio/vfio adds nothing', () => {
    const { sysfs } = node();
    const env = {
      QAT10: '0000:3d:02.2',
      QAT1: '0000:3d:02.3',
      VIRTLET_DEVICES: JSON.stringify([
        { container_path: '/dev/vfio/vfio', host_path: '/dev/vfio/vfio', permissions: 'mrw' },
        { container_path: '/dev/vfio/noiommu-90', host_path: '/dev/vfio/noiommu-90', permissions: 'mrw' },
        { container_path: '/dev/sdb', host_path: '/dev/sdb', permissions: 'mrw' },
      ]),
    };
    expect(collectPluginDevices(env, sysfs)).toEqual([
      { address: '0000:3d:02.3', source: 'QAT1' },
      { address: '0000:3d:02.2', source: 'QAT10' },
      { address: '0001:02:00.0', source: 'VIRTLET_DEVICES' },
    ]);
  });

  it('expands a device to its whole IOMMU group, without the bridge', () => {
    const { sysfs } = node();
    expect(collectPluginDevices({ PCI_RESOURCE_NVIDIA_COM_GPU: '0000:41:00.1' }, sysfs)).toEqual([
      { address: '0000:41:00.1', source: 'PCI_RESOURCE_NVIDIA_COM_GPU' },
      { address: '0000:41:00.0', source: 'PCI_RESOURCE_NVIDIA_COM_GPU' },
    ]);
  });

  it('deduplicates across sources, first source wins', () => {
    const { sysfs } = node();
    const env = {
      VIRTLET_DEVICES: JSON.stringify([{ containerPath: '/dev/vfio/30', hostPath: '/dev/vfio/30', permissions: 'mrw' }]),
      QAT0: '0000:3d:02.2',
      PCI_RESOURCE_NVIDIA_COM_GPU: '0000:41:00.0',
      PCIDEVICE_QAT_X: '0000:3d:02.2',
    };
    expect(collectPluginDevices(env, sysfs)).toEqual([
      { address: '0000:3d:02.2', source: 'PCIDEVICE_QAT_X' },
      { address: '0000:41:00.0', source: 'PCI_RESOURCE_NVIDIA_COM_GPU' },
      { address: '0000:41:00.1', source: 'PCI_RESOURCE_NVIDIA_COM_GPU' },
    ]);
  });

  it('no variables, no devices', () => {
    const { sysfs } = node();
    expect(collectPluginDevices({ HOME: '/root', PCIDEVICE_EMPTY: '', VIRTLET_DEVICES: '' }, sysfs)).toEqual([]);
  });
});

describe('collectPluginDevices: errors', () => {
  it('a device on the wrong driver, named with its driver', () => {
    const { sysfs } = node();
    const e = thrown(() => collectPluginDevices({ QAT0: '0000:3d:02.4' }, sysfs));
    expect(e.code).toBe(ErrorCode.Device);
    expect(e.message).toBe('collect plugin devices: 0000:3d:02.4 is bound to qat_4xxx, not vfio-pci');
  });

  it('a group member on the wrong driver, and every problem at once', () => {
    const { sysfs } = node();
    const e = thrown(() =>
      collectPluginDevices(
        {
          VIRTLET_DEVICES: JSON.stringify([
            { containerPath: '/dev/vfio/31', hostPath: '/dev/vfio/31', permissions: 'mrw' },
            { containerPath: '/dev/vfio/77', hostPath: '/dev/vfio/77', permissions: 'mrw' },
          ]),
          QAT0: '0000:3d:02.4',
          QAT1: '0000:3d:07.0',
        },
        sysfs,
      ),
    );
    expect(e.code).toBe(ErrorCode.Device);
    expect(e.message).toContain('0000:3d:07.0 (from QAT1="0000:3d:07.0") does not exist');
    expect(e.message).toContain('IOMMU group 77 (from VIRTLET_DEVICES /dev/vfio/77) has no devices');
    expect(e.message).toContain('0000:3d:02.4 is bound to qat_4xxx, not vfio-pci');
    expect(e.message).toContain('0000:00:1f.6 is bound to e1000e, not vfio-pci');
    expect(e.message).not.toContain('0000:00:00.0'); // the host bridge stays with the host
  });

  it('a bridge named directly', () => {
    const { sysfs } = node();
    expect(thrown(() => collectPluginDevices({ QAT0: '0000:40:00.0' }, sysfs)).message).toContain('is a PCI bridge (class 0x060400)');
  });

  it('malformed values: BadRequest naming the variable and the value, all at once, nothing resolved', () => {
    const { sysfs } = node();
    const e = thrown(() =>
      collectPluginDevices(
        {
          PCIDEVICE_A: '0000:8a:04.0,garbage',
          PCIDEVICE_A_INFO: '{not json',
          PCI_RESOURCE_B: '0000:3d:02.2;0000:3d:02.3',
          MDEV_PCI_RESOURCE_C: 'not-a-uuid',
          QAT0: '0000:3d:02.2,0000:3d:02.3',
          VIRTLET_DEVICES: '{"hostPath":"/dev/vfio/67"}',
        },
        sysfs,
      ),
    );
    expect(e.code).toBe(ErrorCode.BadRequest);
    expect(e.message).toContain('PCIDEVICE_A_INFO="{not json" is not JSON');
    expect(e.message).toContain('PCIDEVICE_A="0000:8a:04.0,garbage": "garbage" is not a PCI address');
    expect(e.message).toContain('PCI_RESOURCE_B="0000:3d:02.2;0000:3d:02.3": "0000:3d:02.2;0000:3d:02.3" is not a PCI address');
    expect(e.message).toContain('MDEV_PCI_RESOURCE_C="not-a-uuid": "not-a-uuid" is not a mediated device uuid');
    expect(e.message).toContain('QAT0="0000:3d:02.2,0000:3d:02.3" is not one PCI address');
    expect(e.message).toContain('VIRTLET_DEVICES="{\\"hostPath\\":\\"/dev/vfio/67\\"}" is not a JSON array');
  });

  it('an mdev that does not exist', () => {
    const { sysfs } = node();
    expect(thrown(() => collectPluginDevices({ MDEV_PCI_RESOURCE_X: '00000000-0000-0000-0000-000000000000' }, sysfs)).code).toBe(ErrorCode.Device);
  });

  it('a resource whose name ends in _INFO but holds addresses is a resource', () => {
    const { sysfs } = node();
    expect(collectPluginDevices({ PCIDEVICE_ACME_COM_DEV_INFO: '0000:3d:02.2' }, sysfs)).toEqual([
      { address: '0000:3d:02.2', source: 'PCIDEVICE_ACME_COM_DEV_INFO' },
    ]);
  });
});
