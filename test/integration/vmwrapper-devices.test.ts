// vmwrapper as libvirt runs it for a VM pod with device-plugin devices, on fake sysfs trees (VMPOD_SYSFS_ROOT):
// the added -device arguments, and the refusals.
import { describe, it, expect, afterEach } from 'vitest';
import { makeFakeSysfs, type FakeSysfsTree } from '../helpers/fakesysfs.js';
import { runVmwrapper, STUB_EMULATOR } from '../helpers/vmwrapper.js';

let tree: FakeSysfsTree | undefined;
afterEach(() => {
  tree?.cleanup();
  tree = undefined;
});

const LIBVIRT_ARGS = ['-name', 'guest=vm', '-machine', 'pc-i440fx-7.2,usb=off', '-device', 'vfio-pci,host=0000:01:00.0,id=hostdev0,bus=pci.0,addr=0x5'];

function node(): FakeSysfsTree {
  tree = makeFakeSysfs();
  const qat = { class: 0x0b4000, vendor: '0x8086', device: '0x4941' };
  tree.addPci({ address: '0000:3d:02.2', ...qat, driver: 'vfio-pci', iommuGroup: '67' });
  tree.addPci({ address: '0000:3d:02.4', ...qat, driver: 'qat_4xxx', iommuGroup: '69' });
  tree.addPci({ address: '0001:8a:04.0', driver: 'vfio-pci', iommuGroup: '145' });
  return tree;
}

const run = (t: FakeSysfsTree, env: Record<string, string>, args = LIBVIRT_ARGS) =>
  runVmwrapper({ args, env: { VIRTLET_EMULATOR: STUB_EMULATOR, VMPOD_SYSFS_ROOT: t.root, VMPOD_LOG_LEVEL: 'silent', ...env } });

describe('vmwrapper with device-plugin devices', () => {
  it('the seed case: QAT0 with /dev/vfio/67 gives exactly one vfio-pci device and no disk', async () => {
    const t = node();
    const r = await run(t, {
      QAT0: '0000:3d:02.2',
      VIRTLET_DEVICES: JSON.stringify([
        { containerPath: '/dev/vfio/vfio', hostPath: '/dev/vfio/vfio', permissions: 'mrw' },
        { containerPath: '/dev/vfio/67', hostPath: '/dev/vfio/67', permissions: 'mrw' },
      ]),
    });
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(r.stub!.argv).toEqual([STUB_EMULATOR, ...LIBVIRT_ARGS, '-device', 'vfio-pci,host=0000:3d:02.2,id=vmpodhostdev0']);
    expect(r.stub!.argv.join(' ')).not.toMatch(/-drive|\/dev\/vfio/);
  });

  it('an SR-IOV VF from PCIDEVICE_* with a non-zero PCI domain keeps its domain', async () => {
    const t = node();
    const r = await run(t, {
      PCIDEVICE_INTEL_COM_SRIOV_NETDEVICE: '0001:8a:04.0',
      PCIDEVICE_INTEL_COM_SRIOV_NETDEVICE_INFO: JSON.stringify({ '0001:8a:04.0': { generic: { deviceID: '0001:8a:04.0' }, vfio: { 'dev-mount': '/dev/vfio/145', mount: '/dev/vfio/vfio' } } }),
    });
    expect(r.code).toBe(0);
    expect(r.stub!.argv.slice(LIBVIRT_ARGS.length + 1)).toEqual(['-device', 'vfio-pci,host=0001:8a:04.0,id=vmpodhostdev0']);
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

  it('applies VIRTLET_CPUSETS: a bad list is refused before the exec', async () => {
    const t = node();
    const r = await run(t, { VIRTLET_CPUSETS: '0-3;x' });
    expect(r.code).toBe(1);
    expect(r.stderr).toMatch(/VIRTLET_CPUSETS "0-3;x"/);
  });
});
