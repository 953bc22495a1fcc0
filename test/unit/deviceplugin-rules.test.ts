// The plugin's pure rules on plain data: which devices a resource offers and their health (inventory.ts), the
// preferred allocation (preferred.ts), Allocate's answer and the CDI spec (allocate.ts).
import { describe, expect, it } from 'vitest';
import { validateSpec, type FunctionFacts, type GroupFacts } from '../../src/devices/index.js';
import { allocateContainer, cdiSpec, envName } from '../../src/deviceplugin/allocate.js';
import type { ResourceConfig } from '../../src/deviceplugin/config.js';
import { buildInventory, type PluginDevice } from '../../src/deviceplugin/inventory.js';
import { TICK_MS } from '../../src/deviceplugin/plugin.js';
import { preferredAllocation } from '../../src/deviceplugin/preferred.js';
import type { NodeFunction, NodeView } from '../../src/deviceplugin/scan.js';

const res = (r: Partial<ResourceConfig> & { resourceName: string }): ResourceConfig => ({
  vendors: [],
  devices: [],
  drivers: [],
  pciAddresses: [],
  unit: 'function',
  ...r,
});

function fn(address: string, group: string | undefined, o: Partial<NodeFunction> = {}): NodeFunction {
  return {
    address,
    exists: true,
    class: 0x0b4000,
    vendor: '8086',
    device: '4941',
    driver: 'vfio-pci',
    numa: 0,
    ...(group !== undefined ? { group } : {}),
    ...o,
  };
}

function view(
  fns: NodeFunction[],
  extraMembers: Record<string, FunctionFacts[]> = {},
  noiommu: string[] = [],
): NodeView {
  const groups = new Map<string, GroupFacts>();
  for (const f of fns) {
    if (f.group === undefined) continue;
    const g = groups.get(f.group) ?? {
      group: f.group,
      members: [...(extraMembers[f.group] ?? [])],
      mdevs: [],
      holders: [],
      ...(noiommu.includes(f.group) ? { noiommu: 'name is "vfio-noiommu"' } : {}),
    };
    g.members.push(f);
    groups.set(f.group, g);
  }
  return { sysfsRoot: '/sys', functions: new Map(fns.map((f) => [f.address, f])), groups, iommufd: false };
}

describe('buildInventory', () => {
  it('a function belongs to the first resource that selects it; IDs per unit', () => {
    const fns = [
      fn('0000:3d:02.1', '61'),
      fn('0000:60:00.0', '42', { vendor: '15b3', device: '101e' }),
      fn('0000:60:00.1', '42', { vendor: '15b3', device: '101e', numa: 1 }),
    ];
    const inv = buildInventory(
      [
        res({ resourceName: 'a.example/one', pciAddresses: ['0000:60:00.1'] }),
        res({ resourceName: 'a.example/all', vendors: ['8086', '15b3'], unit: 'group' }),
      ],
      view(fns),
    );
    expect(
      inv.resources.map((r) => [r.resource.resourceName, r.devices.map((d) => [d.id, d.functions, d.numa])]),
    ).toEqual([
      ['a.example/one', [['0000:60:00.1', ['0000:60:00.1'], [1]]]],
      [
        'a.example/all',
        [
          ['iommu-group-42', ['0000:60:00.0'], [0]],
          ['iommu-group-61', ['0000:3d:02.1'], [0]],
        ],
      ],
    ]);
  });

  it('viable: other members on a vfio driver (by vfio-dev too), pci-stub, unbound, or bridges; not on a host driver', () => {
    const others: Record<string, FunctionFacts[]> = {
      '1': [
        { address: '0000:01:00.1', exists: true, class: 0x020000, driver: 'pci-stub' },
        { address: '0000:01:00.2', exists: true, class: 0x020000 },
      ],
      '2': [
        { address: '0000:02:00.1', exists: true, class: 0x060400 },
        { address: '0000:02:00.2', exists: true, class: 0x020000, driver: 'pcieport' },
      ],
      '3': [{ address: '0000:03:00.1', exists: true, class: 0x020000, driver: 'my-vendor-driver', vfioDev: 'vfio7' }],
      '4': [{ address: '0000:04:00.1', exists: true, class: 0x040300, driver: 'snd_hda_intel' }],
    };
    const inv = buildInventory(
      [res({ resourceName: 'a.example/x', vendors: ['8086'] })],
      view(
        ['1', '2', '3', '4'].map((g) => fn(`0000:0${g}:00.0`, g)),
        others,
      ),
    );
    expect(inv.resources[0]!.devices.map((d) => [d.id, d.health])).toEqual([
      ['0000:01:00.0', 'Healthy'],
      ['0000:02:00.0', 'Healthy'],
      ['0000:03:00.0', 'Healthy'],
      ['0000:04:00.0', 'Unhealthy'],
    ]);
    expect(inv.resources[0]!.devices[3]!.problem).toMatchObject({
      code: 'group-not-viable',
      member: '0000:04:00.1',
      driver: 'snd_hda_intel',
    });
    expect(inv.resources[0]!.devices[3]!.problem!.text).toMatch(
      /^IOMMU group 4 is not viable: its member 0000:04:00\.1 is bound to snd_hda_intel; .*unbind it \(echo 0000:04:00\.1 > \/sys\/bus\/pci\/devices\/0000:04:00\.1\/driver\/unbind\)/,
    );
  });

  it('a function off vfio is unhealthy (its driver named); unit group: every function of the group must be on vfio', () => {
    const fns = [fn('0000:60:00.0', '42'), fn('0000:60:00.1', '42', { driver: 'mlx5_core' })];
    const inv = buildInventory([res({ resourceName: 'a.example/g', vendors: ['8086'], unit: 'group' })], view(fns));
    expect(inv.resources[0]!.devices[0]).toMatchObject({
      id: 'iommu-group-42',
      health: 'Unhealthy',
      problem: { code: 'not-vfio', member: '0000:60:00.1', driver: 'mlx5_core' },
    });
  });

  it('never offers a no-IOMMU group, a function without a group, or a bridge', () => {
    const fns = [
      fn('0000:01:00.0', '81'),
      fn('0000:02:00.0', undefined),
      fn('0000:03:00.0', '3', { class: 0x060400, driver: 'pcieport' }),
      fn('0000:04:00.0', '4'),
    ];
    const inv = buildInventory([res({ resourceName: 'a.example/x', vendors: ['8086'] })], view(fns, {}, ['81']));
    expect(inv.resources[0]!.devices.map((d) => d.id)).toEqual(['0000:04:00.0']);
    expect(inv.notOffered.map((n) => n.address)).toEqual(['0000:01:00.0', '0000:02:00.0', '0000:03:00.0']);
    expect(inv.notOffered[0]!.why).toMatch(/no-IOMMU group 81/);
  });
});

const dev = (id: string, group: string, numa: number, functions = [id]): PluginDevice => ({
  id,
  health: 'Healthy',
  numa: numa >= 0 ? [numa] : [],
  functions,
  groups: [group],
  cdevs: [],
});

describe('preferredAllocation', () => {
  // groups: 1 = {a1,a2,a3} numa 0; 2 = {b1,b2} numa 1; 3 = {c1} numa 1; 4 = {d1,d2} numa 0
  const devices = [
    dev('a1', '1', 0),
    dev('a2', '1', 0),
    dev('a3', '1', 0),
    dev('b1', '2', 1),
    dev('b2', '2', 1),
    dev('c1', '3', 1),
    dev('d1', '4', 0),
    dev('d2', '4', 0),
  ];
  const all = devices.map((d) => d.id);

  it('the fewest groups: the smallest group that fits, else the largest ones whole', () => {
    expect(preferredAllocation(devices, all, [], 1)).toEqual(['c1']);
    expect(preferredAllocation(devices, all, [], 2)).toEqual(['d1', 'd2']); // group 2 and 4 fit; numa 0 first
    expect(preferredAllocation(devices, all, [], 3)).toEqual(['a1', 'a2', 'a3']);
    expect(preferredAllocation(devices, all, [], 5)).toEqual(['a1', 'a2', 'a3', 'd1', 'd2']); // 2 groups, numa 0
  });

  it("must-include always, then its group's siblings, then one NUMA node (the must-include one first)", () => {
    expect(preferredAllocation(devices, all, ['b2'], 2)).toEqual(['b2', 'b1']);
    expect(preferredAllocation(devices, all, ['b2'], 3)).toEqual(['b2', 'b1', 'c1']);
    expect(preferredAllocation(devices, all, ['x9'], 1)).toEqual(['x9']);
    expect(preferredAllocation(devices, ['a1', 'b1'], ['a1', 'b1'], 1)).toEqual(['a1', 'b1']);
  });

  it('one node over fewer groups across nodes only when the count is the same', () => {
    // need 3 from {b1,b2}(1), {c1}(1), {d1,d2}(0): any pick takes 2 groups; numa 1 alone can
    expect(preferredAllocation(devices, ['b1', 'b2', 'c1', 'd1', 'd2'], [], 3)).toEqual(['b1', 'b2', 'c1']);
  });

  it('not enough available: what there is (kubelet decides)', () => {
    expect(preferredAllocation(devices, ['a1', 'b1'], [], 3)).toEqual(['a1', 'b1']);
  });
});

describe('Allocate and the CDI spec', () => {
  const r = res({ resourceName: 'vendor.example/qat-vf.v2', vendors: ['8086'] });
  const inv = {
    resource: r,
    devices: [
      dev('0000:3d:02.1', '61', 0),
      { ...dev('0000:3d:02.2', '62', 0), cdevs: ['vfio3'] },
      {
        ...dev('0000:3d:02.4', '64', 1),
        health: 'Unhealthy' as const,
        problem: { code: 'not-vfio' as const, member: '0000:3d:02.4', driver: 'qat_4xxx', text: 'bound to qat_4xxx' },
      },
    ],
  };

  it('envName: upper case, every other character "_"', () => {
    expect(envName('vendor.example/qat-vf.v2')).toBe('PCIDEVICE_VENDOR_EXAMPLE_QAT_VF_V2');
    expect(envName('intel.com/intel_sriov_netdevice')).toBe('PCIDEVICE_INTEL_COM_INTEL_SRIOV_NETDEVICE');
  });

  it('device nodes per group touched, iommufd nodes where the host has them, env with the sorted addresses', () => {
    const out = allocateContainer(inv, ['0000:3d:02.2', '0000:3d:02.1'], {
      iommufd: true,
      cdi: true,
      holders: new Map(),
    });
    expect(out).toEqual({
      ok: true,
      response: {
        envs: { PCIDEVICE_VENDOR_EXAMPLE_QAT_VF_V2: '0000:3d:02.1,0000:3d:02.2' },
        devices: ['/dev/vfio/vfio', '/dev/vfio/61', '/dev/vfio/62', '/dev/iommu', '/dev/vfio/devices/vfio3'].map(
          (p) => ({ container_path: p, host_path: p, permissions: 'rw' }),
        ),
        cdi_devices: [
          { name: 'vendor.example/qat-vf.v2=0000:3d:02.2' },
          { name: 'vendor.example/qat-vf.v2=0000:3d:02.1' },
        ],
      },
    });
  });

  it('refusals name the device and the reason: unknown, unhealthy, held open', () => {
    expect(allocateContainer(inv, ['0000:3d:09.0'], { iommufd: false, cdi: false, holders: new Map() })).toEqual({
      ok: false,
      code: 'unknown',
      problems: ['device 0000:3d:09.0 of vendor.example/qat-vf.v2 is unknown: this node does not offer it (any more)'],
    });
    const held = allocateContainer(inv, ['0000:3d:02.4', '0000:3d:02.1'], {
      iommufd: false,
      cdi: false,
      holders: new Map([['61', [{ pid: 7, comm: 'qemu-kvm', guest: 'old' }]]]),
    });
    expect(held.ok === false && held.problems).toEqual([
      'device 0000:3d:02.4 of vendor.example/qat-vf.v2 is unhealthy: bound to qat_4xxx',
      'device 0000:3d:02.1 of vendor.example/qat-vf.v2: its IOMMU group 61 (/dev/vfio/61) is held open by pid 7 (qemu-kvm, VM "old"): a group is opened by one process at a time; stop that process (a VM of a deleted pod?) or allocate another device',
    ]);
  });

  it('the CDI spec is valid CDI (a "." in the class, names that start with a digit) and names each device\'s functions', () => {
    const spec = cdiSpec(inv, true)!;
    expect(validateSpec(JSON.parse(JSON.stringify(spec)))).toEqual([]);
    expect(spec.devices[1]).toEqual({
      name: '0000:3d:02.2',
      containerEdits: {
        env: ['PCIDEVICE_VENDOR_EXAMPLE_QAT_VF_V2=0000:3d:02.2'],
        deviceNodes: [
          { path: '/dev/vfio/62', permissions: 'rw' },
          { path: '/dev/vfio/devices/vfio3', permissions: 'rw' },
        ],
      },
    });
    expect(cdiSpec({ resource: r, devices: [] }, false)).toBeUndefined();
  });
});

it('sysfs is read again at least once a second, so a change reaches kubelet within 2 s', () => {
  expect(TICK_MS).toBeLessThanOrEqual(1000);
});
