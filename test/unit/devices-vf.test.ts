import { afterEach, describe, expect, it } from 'vitest';
import { ErrorCode } from '../../src/errors.js';
import { applyVfSetup, describeVf, parseVfState, planVfSetup, undoVfSetup } from '../../src/devices/index.js';
import { FakeSysfs, makeFakeSysfs, removeFakeSysfs, type FakeSysfsTree } from '../helpers/fakesysfs.js';

let tree: FakeSysfsTree | undefined;
afterEach(() => {
  tree = removeFakeSysfs(tree);
});

function sriov(): FakeSysfs {
  tree = makeFakeSysfs();
  tree.addPci({ address: '0000:8a:00.0', driver: 'ice', iommuGroup: '40', net: [{ ifname: 'ens1f0' }] });
  tree.addPci({
    address: '0000:8a:01.0',
    driver: 'iavf',
    iommuGroup: '145',
    physfn: '0000:8a:00.0',
    vfIndex: 0,
    net: [{ ifname: 'ens1f0v0' }],
  });
  tree.addPci({
    address: '0000:8a:01.3',
    driver: 'iavf',
    iommuGroup: '148',
    physfn: '0000:8a:00.0',
    vfIndex: 3,
    net: [{ ifname: 'net1', mac: '5A:00:00:00:00:03' }],
  });
  tree.ensureDriver('vfio-pci');
  return new FakeSysfs(tree);
}

/** Records argv; fails the ones matching `fail`. */
function recorder(fail?: (argv: string[]) => boolean) {
  const calls: string[][] = [];
  const run = async (argv: string[]) => {
    calls.push(argv);
    if (fail?.(argv)) throw new Error(`${argv.join(' ')}: RTNETLINK answers: Operation not supported`);
  };
  return { calls, run };
}

const IP_JSON = JSON.stringify([
  {
    ifname: 'ens1f0',
    vfinfo_list: [
      { vf: 0, link_type: 'ether', address: '00:00:00:00:00:00' },
      { vf: 3, link_type: 'ether', address: '5A:00:00:00:00:03', vlan_list: [{ vlan: 12, qos: 0 }] },
    ],
  },
]);

describe('SR-IOV VF', () => {
  it('describeVf: PF, index, driver, MAC', () => {
    const s = sriov();
    expect(describeVf(s, 'net1')).toEqual({
      ifname: 'net1',
      address: '0000:8a:01.3',
      pfAddress: '0000:8a:00.0',
      pfIfname: 'ens1f0',
      vfIndex: 3,
      driver: 'iavf',
      mac: '5a:00:00:00:00:03',
    });
    expect(() => describeVf(s, 'ens1f0')).toThrow(expect.objectContaining({ code: ErrorCode.Device }));
  });

  it('parseVfState reads vlan_list, plain vlan, or none', () => {
    expect(parseVfState(IP_JSON, 3)).toEqual({ mac: '5a:00:00:00:00:03', vlan: 12 });
    expect(parseVfState(IP_JSON, 0)).toEqual({ mac: '00:00:00:00:00:00', vlan: 0 });
    expect(parseVfState('[{"vfinfo_list":[{"vf":1,"address":"02:00:00:00:00:01","vlan":7}]}]', 1)).toEqual({
      mac: '02:00:00:00:00:01',
      vlan: 7,
    });
    expect(() => parseVfState(IP_JSON, 9)).toThrow(expect.objectContaining({ code: ErrorCode.Device }));
  });

  it('plan, apply and undo', async () => {
    const s = sriov();
    const rec = planVfSetup(describeVf(s, 'net1'), parseVfState(IP_JSON, 3), { mac: '42:A4:A6:22:80:2E', vlan: 100 });
    expect(rec).toEqual({
      kind: 'vmpodVfSetupV1',
      ifname: 'net1',
      pfIfname: 'ens1f0',
      vfIndex: 3,
      address: '0000:8a:01.3',
      originalDriver: 'iavf',
      originalMac: '5a:00:00:00:00:03',
      originalVlan: 12,
      mac: '42:a4:a6:22:80:2e',
      vlan: 100,
    });
    const r = recorder();
    await applyVfSetup(s, rec, r.run);
    expect(r.calls).toEqual([['ip', 'link', 'set', 'ens1f0', 'vf', '3', 'mac', '42:a4:a6:22:80:2e', 'vlan', '100']]);
    expect(tree!.driverOf('0000:8a:01.3')).toBe('vfio-pci');

    s.writes.length = 0;
    await undoVfSetup(s, rec, r.run);
    expect(r.calls[1]).toEqual(['ip', 'link', 'set', 'ens1f0', 'vf', '3', 'mac', '5a:00:00:00:00:03', 'vlan', '12']);
    expect(s.writes.map((w) => [w.path, w.data])).toEqual([
      ['bus/pci/devices/0000:8a:01.3/driver/unbind', '0000:8a:01.3'],
      ['bus/pci/devices/0000:8a:01.3/driver_override', '\n'],
      ['bus/pci/drivers_probe', '0000:8a:01.3'],
    ]);
  });

  it('plan rejects a bad MAC and VLAN at once', () => {
    const s = sriov();
    expect(() =>
      planVfSetup(describeVf(s, 'net1'), { mac: '00:00:00:00:00:00', vlan: 0 }, { mac: 'x', vlan: 4095 }),
    ).toThrow(
      expect.objectContaining({
        code: ErrorCode.BadRequest,
        message: 'plan VF net1 setup: MAC "x" is not colon-hex of 6 bytes; VLAN 4095 is outside 0..4094',
      }),
    );
  });

  it('apply fails before binding when the PF refuses the MAC', async () => {
    const s = sriov();
    const rec = planVfSetup(describeVf(s, 'net1'), { mac: '00:00:00:00:00:00', vlan: 0 }, { mac: '02:00:00:00:00:09' });
    await expect(applyVfSetup(s, rec, recorder(() => true).run)).rejects.toMatchObject({
      code: ErrorCode.Device,
      message: 'set MAC 02:00:00:00:00:09 VLAN 0 on VF 3 of ens1f0',
    });
    expect(s.writes).toEqual([]);
  });

  it('undo keeps going when the MAC restore fails and reports it', async () => {
    const s = sriov();
    const rec = planVfSetup(describeVf(s, 'net1'), { mac: '00:00:00:00:00:00', vlan: 0 }, { mac: '02:00:00:00:00:09' });
    await applyVfSetup(s, rec, recorder().run);
    const r = recorder(() => true);
    await expect(undoVfSetup(s, rec, r.run)).rejects.toMatchObject({
      code: ErrorCode.Device,
      message: 'undo VF setup of net1 (0000:8a:01.3)',
    });
    expect(tree!.read('bus/pci/devices/0000:8a:01.3/driver_override')).toBe('\n');
    expect(r.calls).toHaveLength(1);
  });
});
