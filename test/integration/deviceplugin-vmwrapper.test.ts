// End to end on one fake node: vfio-device-plugin advertises, the fake kubelet asks for a preferred allocation and
// allocates, and the container's env from Allocate goes to vmwrapper (the stub qemu in place of qemu): qemu's command
// line gets exactly the allocated functions. Also through the CDI names alone, as a VM runtime may pass them, and
// through kubelet's PodResources API (a fake one) reporting the plugin's device IDs.
import * as path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { startFakeDpKubelet, type FakeDpKubelet } from '../helpers/fakedpkubelet.js';
import { startFakeKubelet, type FakeKubelet } from '../helpers/fakekubelet.js';
import { makeDpNode, startPlugin, writeConfig, type DpNode, type RunningPlugin } from '../helpers/dpplugin.js';
import { runVmwrapper, STUB_EMULATOR } from '../helpers/vmwrapper.js';

const LIBVIRT_ARGS = ['-name', 'guest=vm', '-machine', 'pc-i440fx-7.2,usb=off'];
const CONFIG = `- resourceName: vendor.example/qat
  vendors: ["8086"]
  devices: ["4941"]
- resourceName: vendor.example/cx7
  devices: ["101e"]
`;

let node: DpNode | undefined;
let kubelet: FakeDpKubelet | undefined;
let plugin: RunningPlugin | undefined;
let podResources: FakeKubelet | undefined;
afterEach(async () => {
  await podResources?.close();
  podResources = undefined;
  if (plugin) expect((await plugin.stop()).code, plugin.stderr).toBe(0);
  plugin = undefined;
  kubelet?.close();
  kubelet = undefined;
  node?.cleanup();
  node = undefined;
});

async function start() {
  return startWith(CONFIG);
}

async function startWith(config: string) {
  node = makeDpNode();
  kubelet = await startFakeDpKubelet();
  const cdiDir = path.join(node.dir, 'cdi');
  plugin = startPlugin({
    args: ['--config', writeConfig(node.dir, 'dp.yaml', config), '--kubelet-dir', kubelet.dir, '--cdi-dir', cdiDir],
    env: { VMPOD_SYSFS_ROOT: node.tree.root, VMPOD_DEV_ROOT: node.host.root },
  });
  return { node, kubelet, cdiDir };
}

const vmwrapper = (n: DpNode, env: Record<string, string>) =>
  runVmwrapper({
    args: LIBVIRT_ARGS,
    env: {
      VIRTLET_EMULATOR: STUB_EMULATOR,
      VMPOD_SYSFS_ROOT: n.tree.root,
      VMPOD_DEV_ROOT: n.host.root,
      VMPOD_LOG_LEVEL: 'silent',
      VMPOD_POD_RESOURCES_SOCKET: '',
      ...env,
    },
  });

const added = (argv: string[]) => argv.slice(LIBVIRT_ARGS.length + 1);

describe('plugin -> kubelet -> vmwrapper -> qemu', () => {
  it('a pod asking for 2 cx7 functions gets one whole group, and qemu gets exactly those two', async () => {
    const { node: n, kubelet: k } = await start();
    const c = await k.plugin('vendor.example/cx7');
    const list = await c.nextList((l) => l.length === 3);
    const available = list.filter((d) => d.health === 'Healthy').map((d) => d.ID);
    expect(available).toEqual(['0000:60:00.0', '0000:60:00.1']); // 0000:70:00.0's group is not viable
    const [preferred] = await c.preferred([{ available, size: 2 }]);
    const [resp] = await c.allocate([preferred!]);
    expect(resp!.envs).toEqual({ PCIDEVICE_VENDOR_EXAMPLE_CX7: '0000:60:00.0,0000:60:00.1' });
    const r = await vmwrapper(n, resp!.envs);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(added(r.stub!.argv)).toEqual([
      '-device',
      'vfio-pci,host=0000:60:00.0,id=vmpodhostdev0',
      '-device',
      'vfio-pci,host=0000:60:00.1,id=vmpodhostdev1',
    ]);
  }, 180_000);

  it("one QAT VF allocated: qemu gets that one, none of the node's others; the same through the CDI names alone", async () => {
    const { node: n, kubelet: k, cdiDir } = await start();
    const c = await k.plugin('vendor.example/qat');
    await c.nextList((l) => l.length === 4);
    const [resp] = await c.allocate([['0000:3d:02.2']]);
    const viaEnv = await vmwrapper(n, resp!.envs);
    expect(viaEnv.stderr).toBe('');
    expect(added(viaEnv.stub!.argv)).toEqual(['-device', 'vfio-pci,host=0000:3d:02.2,id=vmpodhostdev0']);
    const names = resp!.cdi_devices.map((d) => d.name).join(',');
    expect(names).toBe('vendor.example/qat=0000:3d:02.2');
    const viaCdi = await vmwrapper(n, { VMPOD_CDI_DEVICES: names, VMPOD_CDI_SPEC_DIRS: cdiDir });
    expect(viaCdi.stderr).toBe('');
    expect(added(viaCdi.stub!.argv)).toEqual(['-device', 'vfio-pci,host=0000:3d:02.2,id=vmpodhostdev0']);
  }, 180_000);

  it("unit group, found through kubelet's PodResources API with the iommu-group rule: the group's functions", async () => {
    const { node: n, kubelet: k } = await startWith(
      `- resourceName: vendor.example/cx7g\n  devices: ["101e"]\n  unit: group\n`,
    );
    const c = await k.plugin('vendor.example/cx7g');
    await c.nextList((l) => l.length === 2);
    const [resp] = await c.allocate([['iommu-group-42']]);
    expect(resp!.envs).toEqual({ PCIDEVICE_VENDOR_EXAMPLE_CX7G: '0000:60:00.0,0000:60:00.1' });
    // what kubelet then reports for the pod: the plugin's device IDs
    podResources = await startFakeKubelet([
      {
        name: 'vm-a',
        namespace: 'vms',
        containers: [
          { name: 'vm', devices: [{ resource_name: 'vendor.example/cx7g', device_ids: ['iommu-group-42'] }] },
        ],
      },
    ]);
    const r = await vmwrapper(n, {
      VMPOD_POD_RESOURCES_SOCKET: podResources.socket,
      VMPOD_POD_NAME: 'vm-a',
      VMPOD_POD_NAMESPACE: 'vms',
      VMPOD_POD_RESOURCES_TIMEOUT_MS: '60000',
      VMPOD_RESOURCE_MAP: JSON.stringify({
        'vendor.example/cx7g': { ids: 'iommu-group', pattern: '^iommu-group-(\\d+)$' },
      }),
    });
    expect(r.stderr).toBe('');
    expect(added(r.stub!.argv)).toEqual([
      '-device',
      'vfio-pci,host=0000:60:00.0,id=vmpodhostdev0',
      '-device',
      'vfio-pci,host=0000:60:00.1,id=vmpodhostdev1',
    ]);
  }, 180_000);
});
