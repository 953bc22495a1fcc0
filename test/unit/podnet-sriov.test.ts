// The pure side of SR-IOV in the pod network: planning a VF next to a veth, the vf-setup step, the VLAN from
// the conflist, the csn, and the record's validation of the vf ops; describeVfAt on a fake tree.
import * as fs from 'node:fs';
import { afterEach, describe, expect, it } from 'vitest';
import { planContainerSide as planAnyBinding, vfSetupStep, vlanFromConf } from '../../src/podnet/plan.js';
import { buildCsn } from '../../src/podnet/csn.js';
import type { Observed } from '../../src/podnet/types.js';
import type { CniResult } from '../../src/cni/types.js';
import { planVfSetup, describeVfAt, type VfSetupRecord } from '../../src/devices/vf.js';
import { RECORD_KIND, recordProblems } from '../../src/state/record.js';
import { ErrorCode } from '../../src/errors.js';
import { FakeSysfs, makeFakeSysfs, type FakeSysfsTree } from '../helpers/fakesysfs.js';
import { Binding } from '../../src/podnet/binding.js';
import type { ContainerSidePlanInput } from '../../src/podnet/plan.js';

/** The bridge binding's plan: what `--binding bridge` gives every link, and auto a veth with IPv6. */
const planContainerSide = (input: ContainerSidePlanInput) =>
  planAnyBinding({ bindingOf: () => Binding.Bridge, ...input });

const NS = '/var/run/netns/pod1';

function observed(): Observed {
  return {
    links: [
      { name: 'lo', index: 1, mac: '00:00:00:00:00:00', mtu: 65536, up: false, addrs4: [] },
      {
        name: 'net1',
        index: 5,
        mac: '5a:00:00:00:00:03',
        mtu: 9000,
        up: true,
        parentBus: 'pci',
        parentDev: '0000:8a:01.3',
        addrs4: [{ local: '192.0.2.10', prefixlen: 24 }],
      },
      {
        name: 'virtlet-eth0',
        index: 3,
        kind: 'veth',
        mac: '42:a4:a6:22:80:2e',
        mtu: 1450,
        up: true,
        addrs4: [{ local: '10.1.90.5', prefixlen: 24 }],
      },
    ],
    routes4: [{ dst: 'default', gateway: '10.1.90.1', dev: 'virtlet-eth0', protocol: 'boot', flags: [] }],
  };
}

function result(): CniResult {
  return {
    cniVersion: '1.0.0',
    interfaces: [
      { name: 'net1', mac: '5a:00:00:00:00:03', sandbox: NS },
      { name: 'virtlet-eth0', mac: '42:a4:a6:22:80:2e', sandbox: NS },
    ],
    ips: [
      { address: '192.0.2.10/24', interface: 0 },
      { address: '10.1.90.5/24', gateway: '10.1.90.1', interface: 1 },
    ],
    routes: [],
    dns: {},
  };
}

const vfRec: VfSetupRecord = {
  kind: 'vmpodVfSetupV1',
  ifname: 'net1',
  pfIfname: 'ens1f0',
  vfIndex: 3,
  address: '0000:8a:01.3',
  originalDriver: 'iavf',
  originalMac: '00:00:00:00:00:00',
  originalVlan: 12,
  mac: '5a:00:00:00:00:03',
  vlan: 100,
};

describe('planContainerSide with a VF', () => {
  it('a VF gets one vf-setup step and no bridge or tap; the veth next to it gets tap1/br1', () => {
    const plan = planContainerSide({
      observed: observed(),
      result: result(),
      newMac: () => '02:11:22:33:44:55',
      vfs: new Set(['net1']),
      vfSetups: new Map([['net1', vfRec]]),
    });
    expect(plan.interfaces.map((i) => [i.cniName, i.type, i.tapName, i.bridgeName, i.pciAddress, i.vlanId])).toEqual([
      ['net1', 'vf', '', '', '0000:8a:01.3', 100],
      ['virtlet-eth0', 'tap', 'tap1', 'br1', undefined, 0],
    ]);
    expect(plan.interfaces[0]).toMatchObject({ index: 0, vmMac: '5a:00:00:00:00:03', mtu: 9000, vf: vfRec });
    expect(plan.steps.map((s) => `${s.name}:${s.target}`)).toEqual([
      'ipv6-off:netns',
      'lo-up:lo',
      'vf-setup:net1',
      'strip-routes:virtlet-eth0',
      'strip-addrs:virtlet-eth0',
      'veth-mac:virtlet-eth0',
      'bridge:br1',
      'tap:tap1',
      'enslave:virtlet-eth0',
      'links-up:br1',
      'dhcp-filter:virtlet-eth0',
    ]);
    // nothing of the VF's netdev is touched in the pod netns: no ip op names it
    expect(JSON.stringify(plan.steps.filter((s) => s.name !== 'vf-setup'))).not.toContain('net1');
  });

  it('a VF without a planned setup (SR-IOV off) is refused, naming the flag and the env variable', () => {
    expect(() =>
      planContainerSide({
        observed: observed(),
        result: result(),
        newMac: () => '02:11:22:33:44:55',
        vfs: new Set(['net1']),
      }),
    ).toThrow(
      expect.objectContaining({
        code: ErrorCode.Device,
        message:
          'interface net1 is an SR-IOV VF; SR-IOV support is not enabled (tapmanager --enable-sriov, env VIRTLET_SRIOV_SUPPORT=true)',
      }),
    );
  });

  it('csn: Type 1, full PCI address, base64 MAC, VLAN, MTU', () => {
    const plan = planContainerSide({
      observed: observed(),
      result: result(),
      newMac: () => '02:11:22:33:44:55',
      vfs: new Set(['net1']),
      vfSetups: new Map([['net1', vfRec]]),
    });
    const csn = buildCsn({ cniVersion: '0.3.1', interfaces: [], ips: [], routes: [], dns: {} }, NS, plan.interfaces);
    expect(csn.Interfaces[0]).toEqual({
      Type: 1,
      Name: 'net1',
      HardwareAddr: 'WgAAAAAD',
      PCIAddress: '0000:8a:01.3',
      MTU: 9000,
      VlanID: 100,
      mac: '5a:00:00:00:00:03',
    });
    expect(csn.Interfaces[1]).toMatchObject({ Type: 0, PCIAddress: '', VlanID: 0 });
  });
});

describe('vfSetupStep', () => {
  it('bind, then MAC/VLAN on the PF; undo: driver, original MAC/VLAN, the netdev back', () => {
    expect(vfSetupStep(vfRec)).toEqual({
      name: 'vf-setup',
      target: 'net1',
      do: [
        { op: 'vf-bind', address: '0000:8a:01.3' },
        { op: 'vf-link', pf: 'ens1f0', vf: 3, mac: '5a:00:00:00:00:03', vlan: 100 },
      ],
      undo: [
        { op: 'vf-restore-driver', address: '0000:8a:01.3', driver: 'iavf' },
        { op: 'vf-link', pf: 'ens1f0', vf: 3, mac: '00:00:00:00:00:00', vlan: 12 },
        { op: 'vf-netdev-return', address: '0000:8a:01.3', name: 'net1' },
      ],
    });
  });

  it('a VF on vfio-pci already has no netdev to bring back', () => {
    const { originalDriver: _d, ...noDriver } = vfRec;
    expect(vfSetupStep({ ...vfRec, originalDriver: 'vfio-pci' }).undo.map((o) => o.op)).toEqual([
      'vf-restore-driver',
      'vf-link',
    ]);
    expect(vfSetupStep(noDriver).undo[0]).toEqual({ op: 'vf-restore-driver', address: '0000:8a:01.3' });
  });
});

describe('vlanFromConf', () => {
  it("takes sriov-cni's integer vlan only", () => {
    expect(
      vlanFromConf([
        { type: 'bridge', vlan: 5 },
        { type: 'sriov', vlan: 100 },
      ]),
    ).toBe(100);
    expect(vlanFromConf([{ type: 'sriov', vlan: 0 }])).toBe(0);
    expect(vlanFromConf([{ type: 'sriov' }, { type: 'bridge', vlan: 5 }])).toBeUndefined();
    expect(
      vlanFromConf([
        { type: 'sriov', vlan: '7' },
        { type: 'sriov', vlan: 1.5 },
      ]),
    ).toBeUndefined();
  });
});

describe('the record with vf ops', () => {
  const rec = (steps: unknown[]) => ({
    kind: RECORD_KIND,
    key: 'k1',
    desc: {},
    nsPath: NS,
    phase: 'ready',
    steps,
    cniIfNames: [],
    interfaces: [],
    createdAt: '',
  });

  it('accepts a vf-setup step', () => {
    expect(recordProblems(rec([vfSetupStep(vfRec)]), 'k1')).toEqual([]);
  });

  it('names every malformed vf op', () => {
    const bad = {
      name: 'vf-setup',
      do: [{ op: 'vf-bind' }, { op: 'vf-link', pf: 'ens1f0', vf: '3', mac: 'x', vlan: 0 }],
      undo: [
        { op: 'vf-restore-driver', address: 'a', driver: 7 },
        { op: 'vf-netdev-return', address: 'a' },
      ],
    };
    expect(recordProblems(rec([bad]), 'k1')).toEqual([
      'steps[0].do[0]: vf-bind op without string address',
      'steps[0].do[1]: vf-link op without number vf',
      'steps[0].undo[0]: vf-restore-driver op without string driver',
      'steps[0].undo[1]: vf-netdev-return op without string name',
    ]);
  });
});

describe('describeVfAt', () => {
  let tree: FakeSysfsTree | undefined;
  afterEach(() => {
    tree?.cleanup();
    if (tree) expect(fs.existsSync(tree.root)).toBe(false);
    tree = undefined;
  });

  it('PF, index and driver from bus/pci (no class/net of the VF needed)', () => {
    tree = makeFakeSysfs();
    tree.addPci({ address: '0000:8a:00.0', driver: 'ice', net: [{ ifname: 'ens1f0' }] });
    tree.addPci({ address: '0000:8a:01.3', driver: 'iavf', physfn: '0000:8a:00.0', vfIndex: 3 });
    tree.addPci({ address: '0000:8b:00.0', driver: 'ixgbe' });
    const s = new FakeSysfs(tree);
    const d = describeVfAt(s, 'net1', '8a:01.3', '5A:00:00:00:00:03');
    expect(d).toEqual({
      ifname: 'net1',
      address: '0000:8a:01.3',
      pfAddress: '0000:8a:00.0',
      pfIfname: 'ens1f0',
      vfIndex: 3,
      driver: 'iavf',
      mac: '5a:00:00:00:00:03',
    });
    expect(planVfSetup(d, { mac: '00:00:00:00:00:00', vlan: 0 }, { mac: d.mac! })).toMatchObject({
      originalDriver: 'iavf',
      vlan: 0,
    });
    expect(() => describeVfAt(s, 'eth0', '0000:8b:00.0')).toThrow(
      expect.objectContaining({ code: ErrorCode.Device, message: expect.stringContaining('is not an SR-IOV VF') }),
    );
    expect(() => describeVfAt(s, 'eth0', '0000:8c:00.0')).toThrow(
      expect.objectContaining({
        code: ErrorCode.Device,
        message: expect.stringContaining('no PCI device 0000:8c:00.0'),
      }),
    );
  });
});
