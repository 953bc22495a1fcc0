// kubelet's PodResources API as a device input: a fake kubelet gRPC server on a Unix socket (Get, List where Get is
// unimplemented or disabled, an unknown pod, a kubelet that never answers), fake sysfs behind it, qemu argv out.
import { afterEach, describe, expect, it } from 'vitest';
import {
  collectDevices,
  devicesOrThrow,
  podResourcesTarget,
  Sysfs,
  type CollectedDevices,
  type PodResourcesMsg,
} from '../../src/devices/index.js';
import { buildQemuArgv } from '../../src/qemu/index.js';
import {
  makeFakeHostRoot,
  makeFakeSysfs,
  removeFakeSysfs,
  type FakeHostRoot,
  type FakeSysfsTree,
} from '../helpers/fakesysfs.js';
import { startFakeKubelet, startSilentSocket, type FakeKubelet } from '../helpers/fakekubelet.js';

let tree: FakeSysfsTree | undefined;
let host: FakeHostRoot | undefined;
let kubelet: FakeKubelet | undefined;
afterEach(async () => {
  tree = removeFakeSysfs(tree);
  host?.cleanup();
  host = undefined;
  await kubelet?.close();
  kubelet = undefined;
});

const MDEV = '4b20d080-1b54-4048-85b3-a6a62d165c01';

function node(): void {
  tree = makeFakeSysfs();
  host = makeFakeHostRoot();
  tree.addPci({ address: '0000:8a:04.0', driver: 'vfio-pci', iommuGroup: '145' });
  tree.addPci({ address: '0000:8a:04.1', driver: 'vfio-pci', iommuGroup: '146' });
  tree.addPci({ address: '0000:3d:02.2', class: 0x0b4000, driver: 'vfio-pci', iommuGroup: '67' });
  tree.addPci({ address: '0000:00:02.0', class: 0x030000, driver: 'i915', iommuGroup: '1' });
  tree.addMdev(MDEV, '0000:00:02.0', '20');
}

const VM_POD: PodResourcesMsg = {
  name: 'vm-a',
  namespace: 'vms',
  containers: [
    {
      name: 'vm',
      devices: [
        { resource_name: 'intel.com/intel_sriov_netdevice', device_ids: ['0000:8a:04.1'] },
        { resource_name: 'devices.kubevirt.io/kvm', device_ids: ['1'] },
        { resource_name: 'qat.intel.com/generic', device_ids: ['vfio-67'] },
      ],
    },
    // a sidecar's devices are part of the pod's allocation too
    { name: 'sidecar', devices: [{ resource_name: 'intel.com/gvt', device_ids: [MDEV] }] },
  ],
};
const OTHER_POD: PodResourcesMsg = {
  name: 'vm-b',
  namespace: 'vms',
  containers: [
    { name: 'vm', devices: [{ resource_name: 'intel.com/intel_sriov_netdevice', device_ids: ['0000:8a:04.0'] }] },
  ],
};

const RESOURCE_MAP = JSON.stringify({
  'qat.intel.com/generic': { ids: 'iommu-group', pattern: '^vfio-(\\d+)$' },
  'intel.com/gvt': 'mdev',
  'devices.kubevirt.io/kvm': 'ignore',
});

const collect = (env: Record<string, string>): Promise<CollectedDevices> =>
  collectDevices(
    {
      VMPOD_POD_NAME: 'vm-a',
      VMPOD_POD_NAMESPACE: 'vms',
      VMPOD_RESOURCE_MAP: RESOURCE_MAP,
      VMPOD_POD_RESOURCES_TIMEOUT_MS: '60000',
      ...env,
    },
    { sysfs: new Sysfs(tree!.root), hostRoot: host!.root },
  );

describe('PodResources', () => {
  it("Get: the pod's devices only, mapped through VMPOD_RESOURCE_MAP, to the qemu argv", async () => {
    node();
    kubelet = await startFakeKubelet([OTHER_POD, VM_POD]);
    const r = await collect({ VMPOD_POD_RESOURCES_SOCKET: kubelet.socket });
    expect(kubelet.calls).toEqual(['Get']);
    expect(r.inputErrors).toEqual([]);
    expect(r.podResourcesVia).toBe('Get');
    expect(r.devices.map((d) => `${d.address} ${d.source}`)).toEqual([
      '0000:8a:04.1 podresources intel.com/intel_sriov_netdevice',
      '0000:00:02.0 podresources intel.com/gvt',
      '0000:3d:02.2 podresources qat.intel.com/generic',
    ]);
    expect(r.skipped).toEqual(['devices.kubevirt.io/kvm of container vm: "ignore" in VMPOD_RESOURCE_MAP']);
    expect(buildQemuArgv([], [], devicesOrThrow(r))).toEqual([
      '-device',
      'vfio-pci,host=0000:8a:04.1,id=vmpodhostdev0',
      '-device',
      `vfio-pci,sysfsdev=${tree!.root}/bus/mdev/devices/${MDEV},id=vmpodhostdev1`,
      '-device',
      'vfio-pci,host=0000:3d:02.2,id=vmpodhostdev2',
    ]);
  });

  it('falls back to List where Get is unimplemented (before 1.27) or disabled (gate off, 1.27-1.33)', async () => {
    node();
    for (const mode of ['unimplemented', 'disabled'] as const) {
      kubelet = await startFakeKubelet([OTHER_POD, VM_POD], mode);
      const r = await collect({ VMPOD_POD_RESOURCES_SOCKET: kubelet.socket });
      expect(kubelet.calls, mode).toEqual(['Get', 'List']);
      expect(r.podResourcesVia).toBe('List');
      expect(r.devices.map((d) => d.address)).toEqual(['0000:8a:04.1', '0000:00:02.0', '0000:3d:02.2']);
      await kubelet.close();
      kubelet = undefined;
    }
  });

  it('an unknown pod is a clear error, by Get and by List', async () => {
    node();
    kubelet = await startFakeKubelet([OTHER_POD]);
    const r = await collect({ VMPOD_POD_RESOURCES_SOCKET: kubelet.socket });
    expect(r.inputErrors).toEqual([
      `kubelet's PodResources API (${kubelet.socket}) does not know pod vms/vm-a (pod vm-a in namespace vms not found): check VMPOD_POD_NAME and VMPOD_POD_NAMESPACE`,
    ]);
    await kubelet.close();
    kubelet = await startFakeKubelet([OTHER_POD], 'disabled');
    const l = await collect({ VMPOD_POD_RESOURCES_SOCKET: kubelet.socket });
    expect(l.inputErrors).toEqual([
      `kubelet's PodResources API (${kubelet.socket}) does not list pod vms/vm-a: check VMPOD_POD_NAME and VMPOD_POD_NAMESPACE`,
    ]);
  });

  it('a kubelet that never answers: an error at the deadline, no hang', async () => {
    node();
    kubelet = await startSilentSocket();
    const r = await collect({ VMPOD_POD_RESOURCES_SOCKET: kubelet.socket, VMPOD_POD_RESOURCES_TIMEOUT_MS: '500' });
    expect(r.inputErrors).toHaveLength(1);
    expect(r.inputErrors[0]).toContain(
      `ask kubelet's PodResources API (${kubelet.socket}) for the devices of pod vms/vm-a: Get: kubelet did not answer within 500 ms`,
    );
  });

  it('IDs that are not PCI addresses and have no rule are skipped and reported, not guessed', async () => {
    node();
    kubelet = await startFakeKubelet([
      {
        name: 'vm-a',
        namespace: 'vms',
        containers: [{ name: 'vm', devices: [{ resource_name: 'nvidia.com/gpu', device_ids: ['GPU-8f6c'] }] }],
      },
    ]);
    const r = await collect({ VMPOD_POD_RESOURCES_SOCKET: kubelet.socket, VMPOD_RESOURCE_MAP: '' });
    expect(r.devices).toEqual([]);
    expect(r.skipped).toEqual([
      'nvidia.com/gpu (GPU-8f6c) of container vm: the IDs are not PCI addresses and VMPOD_RESOURCE_MAP has no rule for it',
    ]);
  });

  it('when to ask: the variable, else the default socket if it exists; names required with an explicit socket', () => {
    const none = () => false;
    expect(podResourcesTarget({ VMPOD_POD_NAME: 'a', VMPOD_POD_NAMESPACE: 'b' }, none)).toBeUndefined();
    expect(podResourcesTarget({ VMPOD_POD_NAME: 'a', VMPOD_POD_NAMESPACE: 'b' }, () => true)).toEqual({
      socket: '/var/lib/kubelet/pod-resources/kubelet.sock',
      podName: 'a',
      podNamespace: 'b',
      timeoutMs: 5000,
    });
    expect(podResourcesTarget({}, () => true)).toBeUndefined();
    expect(
      podResourcesTarget({ VMPOD_POD_RESOURCES_SOCKET: '', VMPOD_POD_NAME: 'a', VMPOD_POD_NAMESPACE: 'b' }, () => true),
    ).toBeUndefined();
    expect(() => podResourcesTarget({ VMPOD_POD_RESOURCES_SOCKET: '/x.sock' }, none)).toThrow(
      /VMPOD_POD_RESOURCES_SOCKET="\/x.sock" is set but VMPOD_POD_NAME and VMPOD_POD_NAMESPACE are not both set/,
    );
  });
});
