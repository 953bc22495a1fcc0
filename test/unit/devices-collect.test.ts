// The device inputs on fake sysfs trees (and a fake /dev + /proc), through the one merge step, to the qemu argv.
import { afterEach, describe, expect, it } from 'vitest';
import { ErrorCode, isVmpodError, type VmpodError } from '../../src/errors.js';
import {
  collectDevices,
  devicesOrThrow,
  isVfioDriverName,
  Sysfs,
  VFIO_DRIVERS,
  type CollectedDevices,
} from '../../src/devices/index.js';
import { buildQemuArgv } from '../../src/qemu/index.js';
import {
  makeFakeHostRoot,
  makeFakeSysfs,
  removeFakeSysfs,
  type FakeHostRoot,
  type FakeSysfsTree,
} from '../helpers/fakesysfs.js';

let tree: FakeSysfsTree | undefined;
let host: FakeHostRoot | undefined;
afterEach(() => {
  tree = removeFakeSysfs(tree);
  host?.cleanup();
  host = undefined;
});

const MDEV = '4b20d080-1b54-4048-85b3-a6a62d165c01';
const PC = ['-machine', 'pc-i440fx-7.2'];

/** The node: every case of issue 12 in one fake tree. */
function node(): FakeSysfsTree {
  const t = makeFakeSysfs();
  tree = t;
  host = makeFakeHostRoot();
  const qat = { class: 0x0b4000, vendor: '0x8086', device: '0x4941' };
  t.addPci({ address: '0000:3d:02.2', ...qat, driver: 'vfio-pci', iommuGroup: '67' });
  t.addPci({ address: '0000:3d:02.3', ...qat, driver: 'vfio-pci', iommuGroup: '68' });
  t.addPci({ address: '0000:3d:02.4', ...qat, driver: 'qat_4xxx', iommuGroup: '69' });
  t.addPci({ address: '0000:8a:04.0', driver: 'vfio-pci', iommuGroup: '145' });
  t.addPci({ address: '0000:8a:04.1', driver: 'vfio-pci', iommuGroup: '146' });
  // a GPU behind a PCIe switch port that shares its group: bridge + VGA function + audio function
  t.addPci({ address: '0000:40:00.0', class: 0x060400, driver: 'pcieport', iommuGroup: '30' });
  t.addPci({ address: '0000:41:00.0', class: 0x030000, driver: 'vfio-pci', iommuGroup: '30' });
  t.addPci({ address: '0000:41:00.1', class: 0x040300, driver: 'vfio-pci', iommuGroup: '30' });
  // a host bridge and an endpoint on its own driver
  t.addPci({ address: '0000:00:00.0', class: 0x060000, iommuGroup: '31' });
  t.addPci({ address: '0000:00:1f.6', driver: 'e1000e', iommuGroup: '31' });
  // a multi-function card in one group: siblings on vfio-pci, pci-stub and no driver (viable)
  t.addPci({ address: '0000:5e:00.0', driver: 'vfio-pci', iommuGroup: '40' });
  t.addPci({ address: '0000:5e:00.1', driver: 'vfio-pci', iommuGroup: '40' });
  t.addPci({ address: '0000:5e:00.2', iommuGroup: '40' });
  t.addPci({ address: '0000:5e:00.3', driver: 'pci-stub', iommuGroup: '40' });
  // a multi-function card whose sibling is still on its host driver
  t.addPci({ address: '0000:5f:00.0', driver: 'vfio-pci', iommuGroup: '41' });
  t.addPci({ address: '0000:5f:00.1', driver: 'mlx5_core', iommuGroup: '41' });
  // a multi-function card whose sibling went to another VM, which holds /dev/vfio/42 open
  t.addPci({ address: '0000:60:00.0', driver: 'vfio-pci', iommuGroup: '42' });
  t.addPci({ address: '0000:60:00.1', driver: 'vfio-pci', iommuGroup: '42' });
  host.addProcess(
    4242,
    'qemu-system-x86',
    ['/usr/bin/qemu-system-x86_64', '-name', 'guest=vm-b,debug-threads=on', '-S'],
    ['/dev/vfio/vfio', '/dev/vfio/42'],
  );
  host.addProcess(4243, 'bash', ['bash'], ['/dev/null']);
  // variant drivers: by name (no vfio-dev: before Linux 6.1), and by vfio-dev whatever the name
  t.addPci({ address: '0000:61:00.0', driver: 'mlx5_vfio_pci', iommuGroup: '43' });
  t.addPci({ address: '0000:62:00.0', driver: 'acme_migr', vfioDev: 'vfio7', iommuGroup: '44' });
  t.addPci({ address: '0000:63:00.0', driver: 'acme_migr', iommuGroup: '45' });
  // a no-IOMMU group (vfio.enable_unsafe_noiommu_mode=1)
  t.addPci({ address: '0001:02:00.0', driver: 'vfio-pci', iommuGroup: '90' });
  t.markNoiommu('90');
  t.addPci({ address: '0001:03:00.0', driver: 'vfio-pci', iommuGroup: '91' });
  host.addNode('noiommu-91');
  // mediated device on an iGPU
  t.addPci({ address: '0000:00:02.0', class: 0x030000, driver: 'i915', iommuGroup: '1' });
  t.addMdev(MDEV, '0000:00:02.0', '20');
  return t;
}

const collect = (env: Record<string, string>, vfs?: { address: string }[]): Promise<CollectedDevices> =>
  collectDevices(env, { sysfs: new Sysfs(tree!.root), hostRoot: host!.root, ...(vfs ? { vfs } : {}) });

/** The -device values added to a pc machine's argv. */
async function argvOf(env: Record<string, string>, vfs?: { address: string }[]): Promise<string[]> {
  const devs = devicesOrThrow(await collect(env, vfs));
  return buildQemuArgv(PC, [], devs).slice(PC.length);
}

async function failure(env: Record<string, string>): Promise<VmpodError> {
  try {
    devicesOrThrow(await collect(env));
  } catch (e) {
    if (isVmpodError(e)) return e;
    throw e;
  }
  throw new Error('did not throw');
}

const nodes = (...paths: string[]) =>
  JSON.stringify(paths.map((p) => ({ containerPath: p, hostPath: p, permissions: 'mrw' })));

describe('the seed case', () => {
  it('QAT0 with /dev/vfio/vfio and /dev/vfio/67 in VMPOD_CRI_DEVICES: one vfio-pci device, no disk', async () => {
    node();
    const r = await collect({
      QAT0: '0000:3d:02.2',
      VMPOD_CRI_DEVICES: nodes('/dev/vfio/vfio', '/dev/vfio/67'),
      PATH: '/usr/bin',
    });
    expect(r.devices).toEqual([{ address: '0000:3d:02.2', group: '67', driver: 'vfio-pci', source: 'QAT0' }]);
    expect(await argvOf({ QAT0: '0000:3d:02.2', VMPOD_CRI_DEVICES: nodes('/dev/vfio/vfio', '/dev/vfio/67') })).toEqual([
      '-device',
      'vfio-pci,host=0000:3d:02.2,id=vmpodhostdev0',
    ]);
  });
});

describe('1. only what was allocated', () => {
  it('a multi-function card with one function allocated: that function only (siblings on vfio-pci, pci-stub, no driver)', async () => {
    node();
    expect(
      await argvOf({
        PCIDEVICE_ACME_COM_NIC: '0000:5e:00.0',
        VMPOD_CRI_DEVICES: nodes('/dev/vfio/vfio', '/dev/vfio/40'),
      }),
    ).toEqual(['-device', 'vfio-pci,host=0000:5e:00.0,id=vmpodhostdev0']);
  });

  it('a GPU: the allocated function only, not its audio sibling, never the bridge', async () => {
    node();
    expect(await argvOf({ PCI_RESOURCE_NVIDIA_COM_GPU: '0000:41:00.0' })).toEqual([
      '-device',
      'vfio-pci,host=0000:41:00.0,id=vmpodhostdev0',
    ]);
  });

  it('a group named only by its node (CRI devices) is passed whole, without its bridge', async () => {
    node();
    expect(await argvOf({ VMPOD_CRI_DEVICES: nodes('/dev/vfio/30') })).toEqual([
      '-device',
      'vfio-pci,host=0000:41:00.0,id=vmpodhostdev0',
      '-device',
      'vfio-pci,host=0000:41:00.1,id=vmpodhostdev1',
    ]);
  });

  it('a sibling on a host driver: refused, naming the sibling, its driver and what to do', async () => {
    node();
    const e = await failure({ PCIDEVICE_ACME_COM_NIC: '0000:5f:00.0' });
    expect(e.code).toBe(ErrorCode.Device);
    expect(e.message).toBe(
      `collect devices: IOMMU group 41 of 0000:5f:00.0 (from PCIDEVICE_ACME_COM_NIC="0000:5f:00.0") is not viable: its other member 0000:5f:00.1 (not allocated to this pod) is bound to mlx5_core; the kernel gives a group to a VM only when every member is on a vfio driver, pci-stub or no driver: unbind it (echo 0000:5f:00.1 > ${tree!.root}/bus/pci/devices/0000:5f:00.1/driver/unbind) or bind it to vfio-pci, or allocate a function from another group`,
    );
  });

  it('a sibling allocated to another VM: its qemu holds the group open; refused, naming the process and the VM', async () => {
    node();
    const e = await failure({ PCIDEVICE_ACME_COM_NIC: '0000:60:00.0' });
    expect(e.code).toBe(ErrorCode.Device);
    expect(e.message).toContain(
      '/dev/vfio/42 (IOMMU group 42 of 0000:60:00.0 (from PCIDEVICE_ACME_COM_NIC="0000:60:00.0")) is held open by pid 4242 (qemu-system-x86, VM "vm-b")',
    );
    expect(e.message).toContain('stop it, or allocate a function from another group');
    expect(e.message).not.toContain('4243');
  });

  it('a CRI group whose endpoint is on its own driver is refused; the host bridge stays out of it', async () => {
    node();
    const e = await failure({ VMPOD_CRI_DEVICES: nodes('/dev/vfio/31') });
    expect(e.message).toContain(
      '0000:00:1f.6 (from VMPOD_CRI_DEVICES) is bound to e1000e, not to a vfio driver: bind it to vfio-pci',
    );
    expect(e.message).not.toContain('0000:00:00.0');
  });

  it('tapmanager VFs go through the same checks and come first', async () => {
    node();
    expect(await argvOf({ QAT0: '0000:3d:02.2' }, [{ address: '0000:8A:04.1' }])).toEqual([
      '-device',
      'vfio-pci,host=0000:8a:04.1,id=vmpodhostdev0',
      '-device',
      'vfio-pci,host=0000:3d:02.2,id=vmpodhostdev1',
    ]);
  });
});

describe('2. every vfio driver counts', () => {
  it('a variant driver without vfio-dev (kernel before 6.1): recognised by name', async () => {
    node();
    expect(await argvOf({ PCIDEVICE_MELLANOX_COM_CX7_MIG: '0000:61:00.0' })).toEqual([
      '-device',
      'vfio-pci,host=0000:61:00.0,id=vmpodhostdev0',
    ]);
  });

  it('a driver with a vfio-dev/vfioN entry: vfio whatever its name; the same name without it is not', async () => {
    node();
    expect(await argvOf({ QAT0: '0000:62:00.0' })).toEqual(['-device', 'vfio-pci,host=0000:62:00.0,id=vmpodhostdev0']);
    expect((await failure({ QAT0: '0000:63:00.0' })).message).toContain(
      '0000:63:00.0 (from QAT0) is bound to acme_migr, not to a vfio driver',
    );
  });

  it('the driver name table', () => {
    for (const d of [
      'vfio-pci',
      'mlx5_vfio_pci',
      'hisi_acc_vfio_pci',
      'pds_vfio_pci',
      'virtio_vfio_pci',
      'nvgrace_gpu_vfio_pci',
      'qat_vfio_pci',
      'xe-vfio-pci',
    ])
      expect(isVfioDriverName(d), d).toBe(true);
    expect(VFIO_DRIVERS).toContain('nvgrace_gpu_vfio_pci');
    for (const d of ['mlx5_core', 'qat_4xxx', 'pci-stub', 'vfiox', 'novfio', undefined])
      expect(isVfioDriverName(d), String(d)).toBe(false);
  });
});

describe('3. no-IOMMU groups are refused up front', () => {
  it('by sysfs (iommu_groups/<N>/name is vfio-noiommu), even under a plain-looking node', async () => {
    node();
    const e = await failure({
      PCIDEVICE_X: '0001:02:00.0',
      PCIDEVICE_X_INFO: '{"0001:02:00.0":{"vfio":{"dev-mount":"/dev/vfio/90"}}}',
    });
    expect(e.code).toBe(ErrorCode.Device);
    expect(e.message).toContain('IOMMU group 90 (0001:02:00.0 (from PCIDEVICE_X="0001:02:00.0")');
    expect(e.message).toContain(
      'is a vfio no-IOMMU group (/dev/vfio/noiommu-90): a VM cannot use it (no DMA isolation',
    );
    expect(e.message).toContain('/kernel/iommu_groups/90/name is "vfio-noiommu"');
  });

  it('by its node under /dev, by a CRI noiommu path, by an _INFO dev-mount', async () => {
    node();
    expect((await failure({ QAT0: '0001:03:00.0' })).message).toMatch(
      /IOMMU group 91 \(0001:03:00.0 .*dev\/vfio\/noiommu-91 exists\) is a vfio no-IOMMU group/,
    );
    expect((await failure({ VMPOD_CRI_DEVICES: nodes('/dev/vfio/noiommu-67') })).message).toContain(
      'IOMMU group 67 (/dev/vfio/noiommu-67 from VMPOD_CRI_DEVICES) is a vfio no-IOMMU group (/dev/vfio/noiommu-67)',
    );
    expect(
      (
        await failure({
          PCIDEVICE_X: '0000:3d:02.2',
          PCIDEVICE_X_INFO: '{"0000:3d:02.2":{"vfio":{"dev-mount":"/dev/vfio/noiommu-67"}}}',
        })
      ).message,
    ).toContain('is a vfio no-IOMMU group (/dev/vfio/noiommu-67)');
  });
});

describe('4. VMPOD_CRI_DEVICES', () => {
  it('snake_case, /dev/vfio/vfio adds nothing, a disk is not ours', async () => {
    node();
    const cri = JSON.stringify([
      { container_path: '/dev/vfio/vfio', host_path: '/dev/vfio/vfio', permissions: 'mrw' },
      { container_path: '/dev/vfio/68', host_path: '/dev/vfio/68', permissions: 'mrw' },
      { container_path: '/dev/sdb', host_path: '/dev/sdb', permissions: 'mrw' },
    ]);
    expect(await argvOf({ VMPOD_CRI_DEVICES: cri })).toEqual([
      '-device',
      'vfio-pci,host=0000:3d:02.3,id=vmpodhostdev0',
    ]);
  });

  it('VIRTLET_DEVICES is refused with its new name', async () => {
    node();
    const e = await failure({ VIRTLET_DEVICES: nodes('/dev/vfio/67') });
    expect(e.code).toBe(ErrorCode.BadRequest);
    expect(e.message).toContain('VIRTLET_DEVICES is set: the variable is now called VMPOD_CRI_DEVICES');
  });
});

describe('7. _INFO twins', () => {
  it('the vfio dev-mount cross-checks the group', async () => {
    node();
    const env = {
      PCIDEVICE_INTEL_COM_INTEL_SRIOV_NETDEVICE: '0000:8a:04.0,0000:8a:04.1',
      PCIDEVICE_INTEL_COM_INTEL_SRIOV_NETDEVICE_INFO: JSON.stringify({
        '0000:8a:04.0': {
          generic: { deviceID: '0000:8a:04.0' },
          vfio: { 'dev-mount': '/dev/vfio/145', mount: '/dev/vfio/vfio' },
        },
        '0000:8a:04.1': {
          generic: { deviceID: '0000:8a:04.1' },
          vfio: { 'dev-mount': '/dev/vfio/146', mount: '/dev/vfio/vfio' },
          vhost: { 'net-mount': '/dev/vhost-net', 'tun-mount': '/dev/net/tun' },
        },
      }),
    };
    expect(await argvOf(env)).toEqual([
      '-device',
      'vfio-pci,host=0000:8a:04.0,id=vmpodhostdev0',
      '-device',
      'vfio-pci,host=0000:8a:04.1,id=vmpodhostdev1',
    ]);
    const e = await failure({
      PCIDEVICE_X: '0000:8a:04.0',
      PCIDEVICE_X_INFO: '{"0000:8a:04.0":{"vfio":{"dev-mount":"/dev/vfio/146"}}}',
    });
    expect(e.message).toContain(
      '0000:8a:04.0 (from PCIDEVICE_X="0000:8a:04.0"): PCIDEVICE_X says IOMMU group 146, sysfs says 145',
    );
  });

  it('a vDPA device is refused as not supported, not passed as VFIO', async () => {
    node();
    const e = await failure({
      PCIDEVICE_NVIDIA_COM_VDPA: '0000:8a:04.0',
      PCIDEVICE_NVIDIA_COM_VDPA_INFO: JSON.stringify({
        '0000:8a:04.0': { generic: { deviceID: '0000:8a:04.0' }, vdpa: { mount: '/dev/vhost-vdpa-0' } },
      }),
    });
    expect(e.code).toBe(ErrorCode.BadRequest);
    expect(e.message).toContain(
      '0000:8a:04.0 (from PCIDEVICE_NVIDIA_COM_VDPA="0000:8a:04.0") is a vDPA device (PCIDEVICE_NVIDIA_COM_VDPA_INFO gives it the vhost-vdpa node /dev/vhost-vdpa-0): vmwrapper passes VFIO devices only, and vDPA is not supported by this binding',
    );
  });
});

describe('the other conventions', () => {
  it('mediated devices: sysfsdev, deduplicated with their own group node', async () => {
    const t = node();
    expect(await argvOf({ MDEV_PCI_RESOURCE_INTEL_COM_GVT: MDEV, VMPOD_CRI_DEVICES: nodes('/dev/vfio/20') })).toEqual([
      '-device',
      `vfio-pci,sysfsdev=${t.root}/bus/mdev/devices/${MDEV},id=vmpodhostdev0`,
    ]);
  });

  it('QAT<n> in numeric order; the first source that names a function is its source', async () => {
    node();
    const r = await collect({ QAT10: '0000:3d:02.2', QAT1: '0000:3d:02.3', PCIDEVICE_QAT_X: '0000:3d:02.2' });
    expect(r.devices.map((d) => `${d.address} ${d.source}`)).toEqual([
      '0000:3d:02.2 PCIDEVICE_QAT_X',
      '0000:3d:02.3 QAT1',
    ]);
  });

  it('no variables, no devices', async () => {
    node();
    expect(await collect({ HOME: '/root', PCIDEVICE_EMPTY: '', VMPOD_CRI_DEVICES: '' })).toEqual({
      devices: [],
      problems: [],
      skipped: [],
      inputErrors: [],
    });
  });

  it('a resource whose name ends in _INFO but holds addresses is a resource', async () => {
    node();
    expect((await collect({ PCIDEVICE_ACME_COM_DEV_INFO: '0000:3d:02.2' })).devices.map((d) => d.source)).toEqual([
      'PCIDEVICE_ACME_COM_DEV_INFO',
    ]);
  });
});

describe('errors', () => {
  it('every problem at once: missing device, empty group, wrong driver, bridge', async () => {
    node();
    const e = await failure({
      VMPOD_CRI_DEVICES: nodes('/dev/vfio/77'),
      QAT0: '0000:3d:02.4',
      QAT1: '0000:3d:07.0',
      QAT2: '0000:40:00.0',
    });
    expect(e.code).toBe(ErrorCode.Device);
    expect(e.message).toContain('0000:3d:07.0 (from QAT1="0000:3d:07.0") does not exist');
    expect(e.message).toContain('IOMMU group 77 (/dev/vfio/77 from VMPOD_CRI_DEVICES) has no devices');
    expect(e.message).toContain('0000:3d:02.4 (from QAT0) is bound to qat_4xxx, not to a vfio driver');
    expect(e.message).toContain('0000:40:00.0 (from QAT2="0000:40:00.0") is a PCI bridge (class 0x060400)');
  });

  it('malformed values: BadRequest naming the variable and the value, all at once', async () => {
    node();
    const e = await failure({
      PCIDEVICE_A: '0000:8a:04.0,garbage',
      PCIDEVICE_A_INFO: '{not json',
      PCI_RESOURCE_B: '0000:3d:02.2;0000:3d:02.3',
      MDEV_PCI_RESOURCE_C: 'not-a-uuid',
      QAT0: '0000:3d:02.2,0000:3d:02.3',
      VMPOD_CRI_DEVICES: '{"hostPath":"/dev/vfio/67"}',
    });
    expect(e.code).toBe(ErrorCode.BadRequest);
    expect(e.message).toContain('PCIDEVICE_A_INFO="{not json" is not JSON');
    expect(e.message).toContain('PCIDEVICE_A="0000:8a:04.0,garbage": "garbage" is not a PCI address');
    expect(e.message).toContain(
      'PCI_RESOURCE_B="0000:3d:02.2;0000:3d:02.3": "0000:3d:02.2;0000:3d:02.3" is not a PCI address',
    );
    expect(e.message).toContain('MDEV_PCI_RESOURCE_C="not-a-uuid": "not-a-uuid" is not a mediated device uuid');
    expect(e.message).toContain('QAT0="0000:3d:02.2,0000:3d:02.3" is not one PCI address');
    expect(e.message).toContain('VMPOD_CRI_DEVICES="{\\"hostPath\\":\\"/dev/vfio/67\\"}" is not a JSON array');
  });
});
