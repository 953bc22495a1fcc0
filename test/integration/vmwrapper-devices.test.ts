// vmwrapper as libvirt runs it for a VM pod with device-plugin devices, on fake sysfs trees (VMPOD_SYSFS_ROOT):
// the added -device arguments, and the refusals.
import { describe, it, expect, afterEach } from 'vitest';
import { makeFakeHostRoot, makeFakeSysfs, type FakeHostRoot, type FakeSysfsTree } from '../helpers/fakesysfs.js';
import { startFakeKubelet, type FakeKubelet } from '../helpers/fakekubelet.js';
import { runVmwrapper, STUB_EMULATOR } from '../helpers/vmwrapper.js';

let tree: FakeSysfsTree | undefined;
let host: FakeHostRoot | undefined;
let kubelet: FakeKubelet | undefined;
afterEach(async () => {
  tree?.cleanup();
  tree = undefined;
  host?.cleanup();
  host = undefined;
  await kubelet?.close();
  kubelet = undefined;
});

const LIBVIRT_ARGS = [
  '-name',
  'guest=vm',
  '-machine',
  'pc-i440fx-7.2,usb=off',
  '-device',
  'vfio-pci,host=0000:01:00.0,id=hostdev0,bus=pci.0,addr=0x5',
];

function node(): FakeSysfsTree {
  tree = makeFakeSysfs();
  const qat = { class: 0x0b4000, vendor: '0x8086', device: '0x4941' };
  tree.addPci({ address: '0000:3d:02.2', ...qat, driver: 'vfio-pci', iommuGroup: '67' });
  tree.addPci({ address: '0000:3d:02.4', ...qat, driver: 'qat_4xxx', iommuGroup: '69' });
  tree.addPci({ address: '0001:8a:04.0', driver: 'vfio-pci', iommuGroup: '145' });
  // a two-function card: .0 allocated to this pod, .1 to a VM that is running
  tree.addPci({ address: '0000:60:00.0', driver: 'mlx5_vfio_pci', iommuGroup: '42' });
  tree.addPci({ address: '0000:60:00.1', driver: 'mlx5_vfio_pci', iommuGroup: '42' });
  host = makeFakeHostRoot();
  return tree;
}

const run = (t: FakeSysfsTree, env: Record<string, string>, args = LIBVIRT_ARGS) =>
  runVmwrapper({
    args,
    env: {
      VIRTLET_EMULATOR: STUB_EMULATOR,
      VMPOD_SYSFS_ROOT: t.root,
      VMPOD_DEV_ROOT: host!.root,
      VMPOD_LOG_LEVEL: 'silent',
      ...env,
    },
  });

describe('vmwrapper with device-plugin devices', () => {
  it('the seed case: QAT0 with /dev/vfio/67 gives exactly one vfio-pci device and no disk', async () => {
    const t = node();
    const r = await run(t, {
      QAT0: '0000:3d:02.2',
      VMPOD_CRI_DEVICES: JSON.stringify([
        { containerPath: '/dev/vfio/vfio', hostPath: '/dev/vfio/vfio', permissions: 'mrw' },
        { containerPath: '/dev/vfio/67', hostPath: '/dev/vfio/67', permissions: 'mrw' },
      ]),
    });
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(r.stub!.argv).toEqual([
      STUB_EMULATOR,
      ...LIBVIRT_ARGS,
      '-device',
      'vfio-pci,host=0000:3d:02.2,id=vmpodhostdev0',
    ]);
    expect(r.stub!.argv.join(' ')).not.toMatch(/-drive|\/dev\/vfio/);
  });

  it('an SR-IOV VF from PCIDEVICE_* with a non-zero PCI domain keeps its domain', async () => {
    const t = node();
    const r = await run(t, {
      PCIDEVICE_INTEL_COM_SRIOV_NETDEVICE: '0001:8a:04.0',
      PCIDEVICE_INTEL_COM_SRIOV_NETDEVICE_INFO: JSON.stringify({
        '0001:8a:04.0': {
          generic: { deviceID: '0001:8a:04.0' },
          vfio: { 'dev-mount': '/dev/vfio/145', mount: '/dev/vfio/vfio' },
        },
      }),
    });
    expect(r.code).toBe(0);
    expect(r.stub!.argv.slice(LIBVIRT_ARGS.length + 1)).toEqual([
      '-device',
      'vfio-pci,host=0001:8a:04.0,id=vmpodhostdev0',
    ]);
  });

  it('refuses a device on another driver, naming the device and the driver', async () => {
    const t = node();
    const r = await run(t, { QAT0: '0000:3d:02.4' });
    expect(r.code).toBe(1);
    expect(r.stub).toBeUndefined();
    expect(r.stderr.trim().split('\n')).toHaveLength(1);
    expect(r.stderr).toMatch(/^vmwrapper: .*0000:3d:02\.4.*qat_4xxx/);
  });

  it('refuses a malformed value, naming the variable and the value', async () => {
    const t = node();
    const r = await run(t, { PCI_RESOURCE_NVIDIA_COM_GPU: '0000:3d:02.2,not-an-address' });
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/^vmwrapper: .*PCI_RESOURCE_NVIDIA_COM_GPU.*not-an-address/);
  });

  it('on q35, each device gets its own pcie-root-port', async () => {
    const t = node();
    const args = ['-name', 'guest=vm', '-machine', 'pc-q35-7.2,usb=off'];
    const r = await run(t, { QAT0: '0000:3d:02.2', QAT1: '0001:8a:04.0' }, args);
    expect(r.code).toBe(0);
    const added = r.stub!.argv.slice(args.length + 1);
    expect(added.filter((a) => a.startsWith('pcie-root-port'))).toHaveLength(2);
    expect(added.filter((a) => a.startsWith('vfio-pci')).every((a) => /,bus=vmpodrp\d+/.test(a))).toBe(true);
  });

  it('one function of a multi-function card on a variant driver: that function only', async () => {
    const t = node();
    const r = await run(t, { PCIDEVICE_MELLANOX_COM_CX7: '0000:60:00.0' });
    expect(r.stderr).toBe('');
    expect(r.stub!.argv.slice(LIBVIRT_ARGS.length + 1)).toEqual([
      '-device',
      'vfio-pci,host=0000:60:00.0,id=vmpodhostdev0',
    ]);
  });

  it('refuses a group another VM holds open, naming its process, before qemu starts', async () => {
    const t = node();
    host!.addProcess(4242, 'qemu-system-x86', ['qemu-system-x86_64', '-name', 'guest=vm-b'], ['/dev/vfio/42']);
    const r = await run(t, { PCIDEVICE_MELLANOX_COM_CX7: '0000:60:00.0' });
    expect(r.code).toBe(1);
    expect(r.stub).toBeUndefined();
    expect(r.stderr).toMatch(
      /^vmwrapper: collect devices: \/dev\/vfio\/42 .* is held open by pid 4242 \(qemu-system-x86, VM "vm-b"\)/,
    );
  });

  it("asks kubelet's PodResources API (gRPC loaded from node_modules by the bundle)", async () => {
    const t = node();
    kubelet = await startFakeKubelet([
      {
        name: 'vm-a',
        namespace: 'vms',
        containers: [{ name: 'vm', devices: [{ resource_name: 'intel.com/sriov', device_ids: ['0001:8a:04.0'] }] }],
      },
    ]);
    // a generous deadline: the machine running the tests may be busy
    const r = await run(t, {
      VMPOD_POD_RESOURCES_SOCKET: kubelet.socket,
      VMPOD_POD_NAME: 'vm-a',
      VMPOD_POD_NAMESPACE: 'vms',
      VMPOD_POD_RESOURCES_TIMEOUT_MS: '60000',
    });
    expect(r.stderr).toBe('');
    expect(kubelet.calls).toEqual(['Get']);
    expect(r.stub!.argv.slice(LIBVIRT_ARGS.length + 1)).toEqual([
      '-device',
      'vfio-pci,host=0001:8a:04.0,id=vmpodhostdev0',
    ]);
  }, 180_000); // a whole VM start with gRPC loaded took 33 s on a machine shared by 8 test runs

  it('applies VIRTLET_CPUSETS: a bad list is refused before the exec', async () => {
    const t = node();
    const r = await run(t, { VIRTLET_CPUSETS: '0-3;x' });
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/VIRTLET_CPUSETS "0-3;x"/);
  });
});
