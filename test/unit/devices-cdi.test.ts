// CDI names resolved through spec files (JSON and YAML, two dirs) to /dev/vfio/<N> nodes and to PCI functions on
// a fake sysfs tree, then to the qemu argv.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import {
  collectDevices,
  devicesOrThrow,
  parseQualifiedName,
  Sysfs,
  validateSpec,
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
let specs: string | undefined;
afterEach(() => {
  tree = removeFakeSysfs(tree);
  host?.cleanup();
  host = undefined;
  if (specs) fs.rmSync(specs, { recursive: true, force: true });
  specs = undefined;
});

function setup(): { etc: string; run: string } {
  tree = makeFakeSysfs();
  host = makeFakeHostRoot();
  const qat = { class: 0x0b4000, vendor: '0x8086', device: '0x4941' };
  tree.addPci({ address: '0000:3d:02.2', ...qat, driver: 'vfio-pci', iommuGroup: '67' });
  tree.addPci({ address: '0000:3d:02.3', ...qat, driver: 'vfio-pci', iommuGroup: '68' });
  // a GPU with its audio function in one group
  tree.addPci({ address: '0000:41:00.0', class: 0x030000, driver: 'vfio-pci', iommuGroup: '30' });
  tree.addPci({ address: '0000:41:00.1', class: 0x040300, driver: 'vfio-pci', iommuGroup: '30' });
  specs = fs.mkdtempSync(path.join(os.tmpdir(), 'vmpod-cdi-'));
  const etc = path.join(specs, 'etc-cdi');
  const run = path.join(specs, 'run-cdi');
  fs.mkdirSync(etc);
  fs.mkdirSync(run);
  return { etc, run };
}

const collect = (env: Record<string, string>): Promise<CollectedDevices> =>
  collectDevices(env, { sysfs: new Sysfs(tree!.root), hostRoot: host!.root });
const argvOf = async (env: Record<string, string>) => buildQemuArgv([], [], devicesOrThrow(await collect(env)));

const QAT_JSON = {
  cdiVersion: '0.5.0',
  kind: 'intel.com/qat',
  devices: [
    { name: 'vf0', containerEdits: { deviceNodes: [{ path: '/dev/vfio/67' }] } },
    { name: 'vf1', containerEdits: { deviceNodes: [{ path: '/dev/vfio/68', hostPath: '/dev/vfio/68' }] } },
  ],
  containerEdits: { deviceNodes: [{ path: '/dev/vfio/vfio' }] },
};

const GPU_YAML = `cdiVersion: 0.6.0
kind: nvidia.com/gpu
devices:
  - name: gpu0
    annotations:
      pci: "0000:41:00.0"
    containerEdits:
      deviceNodes:
        - path: /dev/vfio/30
  - name: gpu0-all
    containerEdits:
      deviceNodes:
        - path: /dev/vfio/30
containerEdits:
  deviceNodes:
    - path: /dev/vfio/vfio
`;

describe('CDI names', () => {
  it('JSON and YAML specs in two dirs; the functions a spec names, else the group', async () => {
    const { etc, run } = setup();
    fs.writeFileSync(path.join(etc, 'qat.json'), JSON.stringify(QAT_JSON));
    fs.writeFileSync(path.join(run, 'gpu.yaml'), GPU_YAML);
    const env = { VMPOD_CDI_SPEC_DIRS: `${etc}:${run}`, VMPOD_CDI_DEVICES: 'intel.com/qat=vf1, nvidia.com/gpu=gpu0' };
    const r = await collect(env);
    expect(r.devices).toEqual([
      { address: '0000:3d:02.3', group: '68', driver: 'vfio-pci', source: 'cdi intel.com/qat=vf1' },
      { address: '0000:41:00.0', group: '30', driver: 'vfio-pci', source: 'cdi nvidia.com/gpu=gpu0' },
    ]);
    expect(await argvOf(env)).toEqual([
      '-device',
      'vfio-pci,host=0000:3d:02.3,id=vmpodhostdev0',
      '-device',
      'vfio-pci,host=0000:41:00.0,id=vmpodhostdev1',
    ]);
    // a device whose spec names no function: its whole group (bridges aside)
    expect(await argvOf({ ...env, VMPOD_CDI_DEVICES: 'nvidia.com/gpu=gpu0-all' })).toEqual([
      '-device',
      'vfio-pci,host=0000:41:00.0,id=vmpodhostdev0',
      '-device',
      'vfio-pci,host=0000:41:00.1,id=vmpodhostdev1',
    ]);
  });

  it('a later dir replaces the same name from an earlier one', async () => {
    const { etc, run } = setup();
    fs.writeFileSync(path.join(etc, 'qat.json'), JSON.stringify(QAT_JSON));
    fs.writeFileSync(
      path.join(run, 'qat.yaml'),
      'cdiVersion: "0.5.0"\nkind: intel.com/qat\ndevices:\n  - name: vf0\n    containerEdits:\n      deviceNodes:\n        - path: /dev/vfio/68\n',
    );
    expect(await argvOf({ VMPOD_CDI_SPEC_DIRS: `${etc}:${run}`, VMPOD_CDI_DEVICES: 'intel.com/qat=vf0' })).toEqual([
      '-device',
      'vfio-pci,host=0000:3d:02.3,id=vmpodhostdev0',
    ]);
    expect(await argvOf({ VMPOD_CDI_SPEC_DIRS: `${run}:${etc}`, VMPOD_CDI_DEVICES: 'intel.com/qat=vf0' })).toEqual([
      '-device',
      'vfio-pci,host=0000:3d:02.2,id=vmpodhostdev0',
    ]);
  });

  it('errors name the file: unknown name, ambiguous spec, malformed file, not a VFIO device', async () => {
    const { etc, run } = setup();
    fs.writeFileSync(path.join(etc, 'qat.json'), JSON.stringify(QAT_JSON));
    fs.writeFileSync(path.join(etc, 'qat-copy.json'), JSON.stringify(QAT_JSON));
    fs.writeFileSync(path.join(run, 'broken.yaml'), 'cdiVersion: 0.6.0\nkind: acme.com/fpga\ndevices: [\n');
    fs.writeFileSync(
      path.join(run, 'old.json'),
      JSON.stringify({ ...QAT_JSON, kind: 'acme.com/nic', cdiVersion: '0.4.0' }),
    );
    fs.writeFileSync(
      path.join(run, 'tty.json'),
      JSON.stringify({
        cdiVersion: '0.3.0',
        kind: 'acme.com/tty',
        devices: [{ name: 't0', containerEdits: { deviceNodes: [{ path: '/dev/ttyS0' }] } }],
      }),
    );
    fs.writeFileSync(path.join(run, 'ignored.yml'), 'not: read');
    const r = await collect({
      VMPOD_CDI_SPEC_DIRS: `${etc}:${run}`,
      VMPOD_CDI_DEVICES:
        'intel.com/qat=vf0,intel.com/qat=vf9,acme.com/fpga=f0,acme.com/nic=vf1,acme.com/tty=t0,not-a-name',
    });
    expect(r.devices).toEqual([]);
    const all = r.inputErrors.join('\n');
    expect(all).toContain(
      `CDI device intel.com/qat=vf0 is ambiguous: defined in both ${etc}/qat-copy.json and ${etc}/qat.json (one directory)`,
    );
    // a file that does not parse could have held any name: it is named for every unresolved one
    expect(all).toContain(
      `CDI device intel.com/qat=vf9 is not defined by any valid spec; ${run}/broken.yaml does not parse`,
    );
    expect(all).toMatch(
      new RegExp(`CDI device acme.com/fpga=f0 is not defined by any valid spec; ${run}/broken.yaml does not parse`),
    );
    expect(all).toContain(
      `${run}/old.json device "vf1": deviceNodes[0].hostPath needs cdiVersion 0.5.0 or later (the file says 0.4.0)`,
    );
    expect(all).toContain(
      `CDI device acme.com/tty=t0 (${run}/tty.json) has no /dev/vfio/<group> device node: it is not a VFIO device`,
    );
    expect(all).toContain('VMPOD_CDI_DEVICES: "not-a-name" is not a CDI device name (<vendor>/<class>=<name>)');
    expect(() => devicesOrThrow(r)).toThrow(/collect devices: /);
    fs.rmSync(path.join(run, 'broken.yaml'));
    const again = await collect({ VMPOD_CDI_SPEC_DIRS: `${etc}:${run}`, VMPOD_CDI_DEVICES: 'intel.com/qat=vf9' });
    expect(again.inputErrors).toEqual([
      `unknown CDI device intel.com/qat=vf9: no spec file in ${etc}, ${run} defines it`,
    ]);
  });

  it('a no-IOMMU host path is refused', async () => {
    const { etc } = setup();
    fs.writeFileSync(
      path.join(etc, 'sriov.json'),
      JSON.stringify({
        cdiVersion: '0.5.0',
        kind: 'intel.com/sriov',
        devices: [
          {
            name: 'vf0',
            containerEdits: { deviceNodes: [{ path: '/dev/vfio/67', hostPath: '/dev/vfio/noiommu-67' }] },
          },
        ],
      }),
    );
    const r = await collect({ VMPOD_CDI_SPEC_DIRS: etc, VMPOD_CDI_DEVICES: 'intel.com/sriov=vf0' });
    expect(r.problems.join('\n')).toContain(
      `IOMMU group 67 (/dev/vfio/noiommu-67 from cdi intel.com/sriov=vf0 in ${etc}/sriov.json) is a vfio no-IOMMU group`,
    );
  });
});

describe('spec rules', () => {
  it('qualified names', () => {
    expect(parseQualifiedName('nvidia.com/gpu=0')).toEqual({
      vendor: 'nvidia.com',
      class: 'gpu',
      name: '0',
      kind: 'nvidia.com/gpu',
    });
    expect(parseQualifiedName('vendor.com/class=a:b.c_d-e')?.name).toBe('a:b.c_d-e');
    for (const bad of ['/dev/vfio/67', 'nvidia.com/gpu', 'nvidia.com=gpu0', '1vendor/gpu=0', 'v/c=-x', 'v/c='])
      expect(parseQualifiedName(bad), bad).toBeUndefined();
  });

  it('validation: versions, required fields, unknown fields', () => {
    expect(validateSpec(QAT_JSON)).toEqual([]);
    expect(validateSpec({ ...QAT_JSON, cdiVersion: 'v1.1.0' })).toEqual([]);
    expect(validateSpec({ ...QAT_JSON, cdiVersion: '0.2.0' })[0]).toMatch(/cdiVersion "0.2.0" is not one of/);
    expect(validateSpec({ ...QAT_JSON, extra: 1 })).toContain('unknown field "extra"');
    expect(validateSpec({ ...QAT_JSON, devices: [] })).toContain('devices is not a non-empty list');
    expect(validateSpec({ ...QAT_JSON, devices: [{ name: 'a', containerEdits: {} }] })).toContain(
      'device "a": containerEdits is empty',
    );
    expect(validateSpec({ ...QAT_JSON, cdiVersion: '0.5.0', annotations: { a: 'b' } })).toContain(
      'annotations needs cdiVersion 0.6.0 or later (the file says 0.5.0)',
    );
  });
});
