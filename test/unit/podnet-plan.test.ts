import { describe, it, expect } from 'vitest';
import {
  planContainerSide as planAnyBinding,
  randomLaaMac,
  dhcpFilterRules,
  preparedSteps,
} from '../../src/podnet/plan.js';
import { podNetnsSteps, rpFilterStep } from '../../src/podnet/netnssteps.js';
import { buildCsn, observedBeforeFromCsn } from '../../src/podnet/csn.js';
import { runsOf, ebtablesRestoreInput } from '../../src/podnet/steps.js';
import { ruleExprs } from '../../src/podnet/filter.js';
import type { Op, Step } from '../../src/state/record.js';
import { conventionRecord } from '../../src/podnet/recover.js';
import type { Observed } from '../../src/podnet/types.js';
import type { CniResult } from '../../src/cni/types.js';
import { resultForRecover } from '../../src/podnet/podnetwork.js';
import { isVmpodError } from '../../src/errors.js';
import { Binding } from '../../src/podnet/binding.js';
import type { ContainerSidePlanInput } from '../../src/podnet/plan.js';

/** The bridge binding's plan: what `--binding bridge` gives every link, and auto a veth with IPv6. */
const planContainerSide = (input: ContainerSidePlanInput) =>
  planAnyBinding({ bindingOf: () => Binding.Bridge, ...input });

const NS = '/var/run/netns/pod1';

/** What the bridge plugin leaves: the veth with its address, a default route and the kernel's prefix route. */
function observedAfterBridge(): Observed {
  return {
    links: [
      { name: 'lo', index: 1, mac: '00:00:00:00:00:00', mtu: 65536, up: false, addrs4: [] },
      {
        name: 'virtlet-eth0',
        index: 3,
        kind: 'veth',
        mac: '42:a4:a6:22:80:2e',
        mtu: 1450,
        up: true,
        addrs4: [{ local: '10.1.90.5', prefixlen: 24, broadcast: '10.1.90.255', scope: 'global' }],
      },
    ],
    routes4: [
      { dst: 'default', gateway: '10.1.90.1', dev: 'virtlet-eth0', protocol: 'boot', scope: 'global', flags: [] },
      { dst: '10.1.90.0/24', dev: 'virtlet-eth0', protocol: 'kernel', scope: 'link', prefsrc: '10.1.90.5', flags: [] },
    ],
  };
}

function bridgeResult(): CniResult {
  return {
    cniVersion: '1.0.0',
    interfaces: [
      { name: 'cni0', mac: 'aa:bb:cc:dd:ee:01' },
      { name: 'veth1234', mac: 'aa:bb:cc:dd:ee:02' },
      { name: 'virtlet-eth0', mac: '42:a4:a6:22:80:2e', sandbox: NS },
    ],
    ips: [{ address: '10.1.90.5/24', gateway: '10.1.90.1', interface: 2 }],
    routes: [{ dst: '0.0.0.0/0', gw: '10.1.90.1' }],
    dns: {},
  };
}

const ipLines = (ops: { op: string; args?: string[] }[]) =>
  ops.filter((o) => o.op === 'ip').map((o) => o.args!.join(' '));

describe('planContainerSide', () => {
  it('turns IPv6 off in the pod netns only when the result has no IPv6 address', () => {
    const sysctls = (r: CniResult) =>
      planContainerSide({
        observed: observedAfterBridge(),
        result: r,
        newMac: () => '02:11:22:33:44:55',
      }).steps.flatMap((st) =>
        st.do.flatMap((o) => (o.op === 'sysctl' ? [`${st.name}: ${o.settings.join(' ')}`] : [])),
      );
    expect(sysctls(bridgeResult())).toEqual([
      'ipv6-off: net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1',
    ]);
    const dual = bridgeResult();
    dual.ips.push({ address: 'fd00:10:1::5/64', gateway: 'fd00:10:1::1', interface: 2 });
    expect(sysctls(dual)).toEqual(['ipv6-forwarding: net.ipv6.conf.all.forwarding=1']);
  });

  it("turns IPv6 forwarding off again before the undo puts the veth's IPv6 address back for the DEL", () => {
    const dual = bridgeResult();
    dual.ips.push({ address: 'fd00:10:1::5/64', gateway: 'fd00:10:1::1', interface: 2 });
    const { steps } = planContainerSide({
      observed: observedAfterBridge(),
      result: dual,
      newMac: () => '02:11:22:33:44:55',
    });
    // the undo runs the steps in reverse: forwarding off comes before the addresses come back
    const undo = [...steps]
      .reverse()
      .flatMap((st) =>
        st.undo.map(
          (o) => `${st.name}: ${o.op === 'sysctl' ? o.settings.join(' ') : o.op === 'ip' ? o.args.join(' ') : o.op}`,
        ),
      );
    const off = undo.indexOf('ipv6-forwarding: net.ipv6.conf.all.forwarding=0');
    const back = undo.findIndex((l) => l.startsWith('strip-addrs: '));
    expect(off).toBeGreaterThanOrEqual(0);
    expect(back).toBeGreaterThan(off);
  });

  it('turns the sandboxed veth into veth + bridge + tap, every step with its undo', () => {
    const plan = planContainerSide({
      observed: observedAfterBridge(),
      result: bridgeResult(),
      newMac: () => '02:11:22:33:44:55',
    });
    expect(plan.interfaces).toEqual([
      {
        index: 2,
        cniName: 'virtlet-eth0',
        type: 'tap',
        binding: 'bridge',
        vmMac: '42:a4:a6:22:80:2e',
        vethMacNew: '02:11:22:33:44:55',
        mtu: 1450,
        tapName: 'tap0',
        multiQueue: true,
        bridgeName: 'br0',
        bridgeIp: '169.254.254.2',
        vlanId: 0,
      },
    ]);
    expect(plan.steps.map((s) => `${s.name}:${s.target}`)).toEqual([
      'ipv6-off:netns', // the result has no IPv6
      'lo-up:lo',
      'strip-routes:virtlet-eth0',
      'strip-addrs:virtlet-eth0',
      'veth-mac:virtlet-eth0',
      'bridge:br0',
      'tap:tap0',
      'enslave:virtlet-eth0',
      'links-up:br0',
      'dhcp-filter:virtlet-eth0',
    ]);
    const by = Object.fromEntries(plan.steps.map((s) => [s.name, s]));
    expect(ipLines(by['strip-routes']!.do)).toEqual(['route del default via 10.1.90.1 dev virtlet-eth0']);
    expect(ipLines(by['strip-routes']!.undo)).toEqual([
      'route replace default via 10.1.90.1 dev virtlet-eth0 proto boot scope global',
    ]);
    expect(ipLines(by['strip-addrs']!.do)).toEqual(['addr del 10.1.90.5/24 dev virtlet-eth0']);
    expect(ipLines(by['strip-addrs']!.undo)).toEqual([
      'addr replace 10.1.90.5/24 broadcast 10.1.90.255 dev virtlet-eth0',
    ]);
    expect(ipLines(by['veth-mac']!.do)).toEqual(['link set dev virtlet-eth0 address 02:11:22:33:44:55']);
    expect(ipLines(by['veth-mac']!.undo)).toEqual(['link set dev virtlet-eth0 address 42:a4:a6:22:80:2e']);
    expect(ipLines(by['bridge']!.do)).toEqual([
      'link add name br0 mtu 1450 type bridge ageing_time 0',
      'addr add 169.254.254.2/24 dev br0',
    ]);
    expect(ipLines(by['bridge']!.undo)).toEqual(['link del dev br0']);
    expect(ipLines(by['tap']!.do)).toEqual(['tuntap add dev tap0 mode tap vnet_hdr multi_queue']);
    expect(ipLines(by['tap']!.undo)).toEqual(['link del dev tap0']);
    // a link's attributes and its flags go in one request each
    expect(ipLines(by['enslave']!.do)).toEqual([
      'link set dev virtlet-eth0 master br0 up',
      'link set dev tap0 master br0',
    ]);
    expect(ipLines(by['enslave']!.undo)).toEqual(['link set dev virtlet-eth0 nomaster']);
    expect(ipLines(by['links-up']!.do)).toEqual(['link set dev tap0 mtu 1450 up', 'link set dev br0 mtu 1450 up']);
    // what lives only in the pod netns is left to the netns removal
    expect(by['bridge']!.undo.every((o) => 'withNetns' in o && o.withNetns)).toBe(true);
    expect(by['tap']!.undo.every((o) => 'withNetns' in o && o.withNetns)).toBe(true);
    // the veth leaves the bridge with the netns removal too (a port's removal waits for an RCU grace period)
    expect(by['enslave']!.undo.every((o) => 'withNetns' in o && o.withNetns)).toBe(true);
    expect(by['veth-mac']!.undo.some((o) => 'withNetns' in o)).toBe(false);
    const eb = by['dhcp-filter']!;
    expect(eb.do).toHaveLength(1);
    const nft = eb.do[0] as Extract<Op, { op: 'nft' }>;
    expect(nft).toMatchObject({ op: 'nft', table: 'vmpod-virtlet-eth0' });
    expect(nft.rules.map((r) => r.slice(0, 3).join(' '))).toEqual([
      'FORWARD -o virtlet-eth0',
      'FORWARD -o virtlet-eth0',
      'OUTPUT -o virtlet-eth0',
      'OUTPUT -o virtlet-eth0',
      'INPUT -i virtlet-eth0',
      'FORWARD -i virtlet-eth0',
      // an IPv4-only pod gets the IPv6 rules too: a guest's DHCPv6 and RS stay in, no outside RA or DHCPv6 gets in
      'FORWARD -o virtlet-eth0',
      'FORWARD -o virtlet-eth0',
      'FORWARD -i virtlet-eth0',
      'FORWARD -i virtlet-eth0',
      'FORWARD -o virtlet-eth0',
      'FORWARD -o virtlet-eth0',
      'FORWARD -i virtlet-eth0',
      'INPUT -i tap0',
    ]);
    expect(nft.rules.slice(6).map((r) => r.slice(5).join(' '))).toEqual([
      '--ip6-proto udp --ip6-dport 547 -j DROP',
      '--ip6-proto udp --ip6-dport 546 -j DROP',
      '--ip6-proto udp --ip6-dport 546 -j DROP',
      '--ip6-proto udp --ip6-dport 547 -j DROP',
      '--ip6-proto ipv6-icmp --ip6-icmp-type router-advertisement -j DROP',
      '--ip6-proto ipv6-icmp --ip6-icmp-type router-solicitation -j DROP',
      '--ip6-proto ipv6-icmp --ip6-icmp-type router-advertisement -j DROP',
      '--ip6-proto udp --ip6-dport 547 -j DROP',
    ]);
    // every rule translates (filter.ts), and the undo is the table's deletion, left to the netns removal
    for (const r of nft.rules) expect(ruleExprs(r).exprs.at(-1)![0]).toBe('immediate');
    expect(eb.undo).toEqual([{ op: 'nft-del', table: 'vmpod-virtlet-eth0', withNetns: true }]);
  });

  it("dual-stack: the veth gives up the link-local made from the VM's MAC and makes none; undo puts the EUI-64 one back", () => {
    const observed = observedAfterBridge();
    observed.links[1]!.addrs6 = [{ local: 'fd00:90::5', prefixlen: 64, scope: 'global' }];
    observed.links[1]!.linkLocal6 = [{ local: 'fe80::40a4:a6ff:fe22:802e', prefixlen: 64, scope: 'link' }];
    const result = bridgeResult();
    result.ips.push({ address: 'fd00:90::5/64', gateway: 'fd00:90::1', interface: 2 });
    result.routes.push({ dst: '::/0', gw: 'fd00:90::1' });
    const plan = planContainerSide({ observed, result, newMac: () => '02:11:22:33:44:55' });
    const step = plan.steps.find((s) => s.name === 'veth-mac')!;
    expect(ipLines(step.do)).toEqual([
      'link set dev virtlet-eth0 address 02:11:22:33:44:55',
      'link set dev virtlet-eth0 addrgenmode none',
      'addr del fe80::40a4:a6ff:fe22:802e/64 dev virtlet-eth0',
    ]);
    expect(ipLines(step.undo)).toEqual([
      'link set dev virtlet-eth0 address 42:a4:a6:22:80:2e',
      'link set dev virtlet-eth0 addrgenmode eui64',
      'addr replace fe80::40a4:a6ff:fe22:802e/64 dev virtlet-eth0 nodad',
    ]);
  });

  it('leaves out steps with nothing to do (no routes, no addresses)', () => {
    const observed = observedAfterBridge();
    observed.links[1]!.addrs4 = [];
    observed.routes4 = [];
    const plan = planContainerSide({ observed, result: bridgeResult(), newMac: () => '02:11:22:33:44:55' });
    expect(plan.steps.map((s) => s.name)).not.toContain('strip-routes');
    expect(plan.steps.map((s) => s.name)).not.toContain('strip-addrs');
  });

  it('numbers bridges and taps by interface ordinal, and keeps each result index', () => {
    const observed = observedAfterBridge();
    observed.links.push({
      name: 'net1',
      index: 5,
      kind: 'veth',
      mac: '42:00:00:00:00:09',
      mtu: 9000,
      up: true,
      addrs4: [],
    });
    const result = bridgeResult();
    result.interfaces.push({ name: 'net1', sandbox: NS });
    const plan = planContainerSide({ observed, result, newMac: (i) => `02:00:00:00:00:0${i}` });
    expect(plan.interfaces.map((i) => [i.index, i.cniName, i.bridgeName, i.tapName, i.mtu])).toEqual([
      [2, 'virtlet-eth0', 'br0', 'tap0', 1450],
      [3, 'net1', 'br1', 'tap1', 9000],
    ]);
  });

  it('refuses a VF (the SR-IOV hook) with a Device error', () => {
    try {
      planContainerSide({
        observed: observedAfterBridge(),
        result: bridgeResult(),
        newMac: randomLaaMacFn,
        vfs: new Set(['virtlet-eth0']),
      });
      expect.unreachable();
    } catch (e) {
      expect(isVmpodError(e) && e.code).toBe('DEVICE');
      expect(String(e)).toContain('interface virtlet-eth0 is an SR-IOV VF; SR-IOV support is not enabled');
    }
  });

  it('refuses a result naming a link the netns does not have', () => {
    const r = bridgeResult();
    r.interfaces[2]!.name = 'eth9';
    expect(() => planContainerSide({ observed: observedAfterBridge(), result: r, newMac: randomLaaMacFn })).toThrow(
      /names interface eth9 in the pod netns, but the netns has no such link/,
    );
  });

  it('refuses when tap0/br0 exist already', () => {
    const observed = observedAfterBridge();
    observed.links.push({
      name: 'br0',
      index: 9,
      kind: 'bridge',
      mac: '42:00:00:00:00:01',
      mtu: 1500,
      up: true,
      addrs4: [],
    });
    expect(() => planContainerSide({ observed, result: bridgeResult(), newMac: randomLaaMacFn })).toThrow(
      /already has a link named br0/,
    );
  });
});

describe('preparedSteps: what add makes while the CNI plugins run', () => {
  /** the netns after the plugin ran, with the prepared bridge and tap in it */
  function observedWithPrepared(): Observed {
    const o = observedAfterBridge();
    o.links.push({
      name: 'br0',
      index: 4,
      kind: 'bridge',
      mac: '4a:00:00:00:00:01',
      mtu: 1500,
      up: false,
      addrs4: [{ local: '169.254.254.2', prefixlen: 24 }],
    });
    o.links.push({ name: 'tap0', index: 5, kind: 'tun', mac: '4a:00:00:00:00:02', mtu: 1500, up: false, addrs4: [] });
    return o;
  }
  const allOps = (steps: Step[]) =>
    steps.flatMap((s) => s.do.map((o) => `${s.name}: ${o.op === 'ip' ? o.args.join(' ') : o.op}`));

  it('are lo up, interface 0 bridge (no MTU yet), its tap as its port and the DHCP filter of CNI_IFNAME, each undone with the netns', () => {
    const steps = preparedSteps('virtlet-eth0');
    expect(allOps(steps)).toEqual([
      'lo-up: link set dev lo up',
      'bridge: link add name br0 type bridge ageing_time 0',
      'bridge: addr add 169.254.254.2/24 dev br0',
      'tap: tuntap add dev tap0 mode tap vnet_hdr multi_queue',
      'tap: tc',
      'tap: link set dev tap0 master br0',
      'dhcp-filter: nft',
    ]);
    expect(steps[3]!.do[0]).toMatchObject({
      op: 'nft',
      table: 'vmpod-virtlet-eth0',
      rules: expect.arrayContaining([
        ['FORWARD', '-o', 'virtlet-eth0', '-p', 'IPv4', '--ip-proto', 'udp', '--ip-dport', '67', '-j', 'DROP'],
      ]),
    });
    expect(steps.every((s) => s.undo.every((o) => 'withNetns' in o && o.withNetns))).toBe(true);
    expect(steps[0]!.undo).toEqual([]);
  });

  it('the plan finishes them when interface 0 is that link: MTU set, nothing made twice', () => {
    const plan = planContainerSide({
      observed: observedWithPrepared(),
      result: bridgeResult(),
      newMac: () => '02:11:22:33:44:55',
      prepared: 'virtlet-eth0',
    });
    const ops = allOps(plan.steps);
    // each link's MTU comes with its link-up, one request each
    expect(ops).toContain('links-up: link set dev br0 mtu 1450 up');
    expect(ops).toContain('links-up: link set dev tap0 mtu 1450 up');
    // lo is up and the tap a port already: the veth alone joins the bridge; without IPv6 the bridge has nothing to do
    expect(ops.filter((o) => o.startsWith('lo-up') || o.startsWith('enslave'))).toEqual([
      'enslave: link set dev virtlet-eth0 master br0 up',
    ]);
    expect(plan.steps.map((s) => s.name)).not.toContain('bridge');
    expect(ops.filter((o) => / add name | tuntap add |: nft$/.test(o))).toEqual([]);
    expect(plan.steps.map((s) => s.name)).not.toContain('drop-prepared');
    expect(plan.interfaces.map((i) => [i.tapName, i.bridgeName])).toEqual([['tap0', 'br0']]);
  });

  it('an IPv6 interface: the prepared bridge gets the MAC and link-local of the plan before it is up', () => {
    const r = bridgeResult();
    r.ips.push({ address: 'fd00:10:1::5/64', gateway: 'fd00:10:1::1', interface: 2 });
    const plan = planContainerSide({
      observed: observedWithPrepared(),
      result: r,
      newMac: () => '02:11:22:33:44:55',
      prepared: 'virtlet-eth0',
    });
    const ops = allOps(plan.steps);
    const at = (o: string) => ops.indexOf(o);
    expect(at('bridge: link set dev br0 address 02:11:22:33:44:55')).toBeGreaterThan(-1);
    expect(at('bridge: link set dev br0 addrgenmode none')).toBeGreaterThan(-1);
    expect(at('bridge: addr add fe80::11:22ff:fe33:4455/64 dev br0 nodad')).toBeGreaterThan(-1);
    expect(at('bridge: link set dev br0 addrgenmode none')).toBeLessThan(at('links-up: link set dev br0 mtu 1450 up'));
    expect(plan.steps.find((s) => s.name === 'bridge')!.undo).toEqual([]);
  });

  it('deletes them first when interface 0 is not that link (a VF, or another name), and plans as without them', () => {
    const dropped = (prepared: string, vfs?: Set<string>) => {
      const plan = planContainerSide({
        observed: observedWithPrepared(),
        result: bridgeResult(),
        newMac: () => '02:11:22:33:44:55',
        prepared,
        ...(vfs
          ? {
              vfs,
              vfSetups: new Map([
                [
                  'virtlet-eth0',
                  {
                    kind: 'vmpodVfSetupV1',
                    ifname: 'virtlet-eth0',
                    pfIfname: 'pf0',
                    vfIndex: 1,
                    address: '0000:3b:02.1',
                    originalMac: '42:a4:a6:22:80:2e',
                    originalVlan: 0,
                    mac: '42:a4:a6:22:80:2e',
                    vlan: 0,
                  } as never,
                ],
              ]),
            }
          : {}),
      });
      return plan.steps;
    };
    const other = dropped('eth0');
    expect(other.map((s) => s.name).slice(0, 2)).toEqual(['ipv6-off', 'drop-prepared']);
    expect(other[1]!.do).toEqual([
      { op: 'ip', args: ['link', 'del', 'dev', 'br0'] },
      { op: 'ip', args: ['link', 'del', 'dev', 'tap0'] },
      { op: 'nft-del', table: 'vmpod-eth0' },
    ]);
    expect(allOps(other)).toContain('bridge: link add name br0 mtu 1450 type bridge ageing_time 0');
    expect(other.map((s) => s.name)).toContain('dhcp-filter');
    const vf = dropped('virtlet-eth0', new Set(['virtlet-eth0']));
    expect(vf.map((s) => s.name)).toEqual(['ipv6-off', 'drop-prepared', 'vf-setup']);
  });

  it('says whether DHCP may start while it is applied: only when every tap is on the prepared bridge and none has IPv6', () => {
    const plan = (o: { prepared?: string; v6?: boolean }) => {
      const r = bridgeResult();
      if (o.v6) r.ips.push({ address: 'fd00:10:1::5/64', gateway: 'fd00:10:1::1', interface: 2 });
      return planContainerSide({
        observed: observedWithPrepared(),
        result: r,
        newMac: () => '02:11:22:33:44:55',
        ...(o.prepared ? { prepared: o.prepared } : {}),
      });
    };
    expect(plan({ prepared: 'virtlet-eth0' }).dhcpEarly).toBe(true);
    // RA and DHCPv6 read the tap through a packet socket, which a link still down fails
    expect(plan({ prepared: 'virtlet-eth0', v6: true }).dhcpEarly).toBe(false);
    // the prepared links deleted first: the bridge the server binds to does not exist yet
    expect(plan({ prepared: 'eth0' }).dhcpEarly).toBe(false);
    // nothing prepared (recover's plan)
    expect(
      planContainerSide({ observed: observedAfterBridge(), result: bridgeResult(), newMac: () => '02:11:22:33:44:55' })
        .dhcpEarly,
    ).toBe(false);
  });
});

function randomLaaMacFn(): string {
  return randomLaaMac();
}

describe('randomLaaMac', () => {
  it('is unicast and locally administered', () => {
    expect(randomLaaMac(Buffer.from([1, 2, 3, 4, 0xff]))).toBe('02:01:02:03:04:ff');
    expect(randomLaaMac()).toMatch(/^02(:[0-9a-f]{2}){5}$/);
  });
});

describe('dhcpFilterRules', () => {
  it('drops udp/67 and udp/68 towards the veth, and udp/67 from it', () => {
    expect(dhcpFilterRules('eth0').map((r) => r.join(' '))).toEqual([
      'FORWARD -o eth0 -p IPv4 --ip-proto udp --ip-dport 67 -j DROP',
      'FORWARD -o eth0 -p IPv4 --ip-proto udp --ip-dport 68 -j DROP',
      'OUTPUT -o eth0 -p IPv4 --ip-proto udp --ip-dport 67 -j DROP',
      'OUTPUT -o eth0 -p IPv4 --ip-proto udp --ip-dport 68 -j DROP',
      'INPUT -i eth0 -p IPv4 --ip-proto udp --ip-dport 67 -j DROP',
      'FORWARD -i eth0 -p IPv4 --ip-proto udp --ip-dport 67 -j DROP',
    ]);
  });
});

describe('buildCsn', () => {
  it("is Virtlet's ContainerSideNetwork with the original MAC in base64", () => {
    const plan = planContainerSide({
      observed: observedAfterBridge(),
      result: bridgeResult(),
      newMac: () => '02:11:22:33:44:55',
    });
    const v031 = { cniVersion: '0.3.1', ips: [{ version: '4' as const, address: '10.1.90.5/24', interface: 2 }] };
    expect(buildCsn(v031, NS, plan.interfaces)).toEqual({
      Result: v031,
      NsPath: NS,
      Interfaces: [
        {
          Type: 0,
          Name: 'virtlet-eth0',
          HardwareAddr: 'QqSmIoAu',
          PCIAddress: '',
          MTU: 1450,
          VlanID: 0,
          mac: '42:a4:a6:22:80:2e',
        },
      ],
    });
  });
});

describe('recover planning', () => {
  it('rebuilds the same undo steps from the live (stripped) netns and the csn', () => {
    const added = planContainerSide({
      observed: observedAfterBridge(),
      result: bridgeResult(),
      newMac: () => '02:11:22:33:44:55',
    });
    const v031 = {
      cniVersion: '0.3.1',
      interfaces: [
        { name: 'cni0' },
        { name: 'veth1234' },
        { name: 'virtlet-eth0', mac: '42:a4:a6:22:80:2e', sandbox: NS },
      ],
      ips: [{ version: '4' as const, address: '10.1.90.5/24', gateway: '10.1.90.1', interface: 2 }],
      routes: [{ dst: '0.0.0.0/0', gw: '10.1.90.1' }],
    };
    const csn = buildCsn(v031, NS, added.interfaces);
    // the live netns after add: veth stripped, new MAC (tap0/br0 are left out by the caller)
    const live: Observed = {
      links: [
        observedAfterBridge().links[0]!,
        { ...observedAfterBridge().links[1]!, mac: '02:11:22:33:44:55', addrs4: [], master: 'br0' },
      ],
      routes4: [],
    };
    const result = resultForRecover(csn, NS);
    const before = observedBeforeFromCsn(live, result, csn);
    const plan = planContainerSide({ observed: before, result, newMac: () => '02:11:22:33:44:55' });
    expect(plan.interfaces).toEqual(added.interfaces);
    const undo = (p: typeof plan) => p.steps.map((s) => [s.name, ipLines(s.undo)]);
    const expected = undo(added).map(([n, u]) =>
      n === 'strip-routes'
        ? [n, ['route replace default via 10.1.90.1 dev virtlet-eth0']]
        : n === 'strip-addrs'
          ? [n, ['addr replace 10.1.90.5/24 dev virtlet-eth0']]
          : [n, u],
    );
    expect(undo(plan)).toEqual(expected);
  });
});

describe('the pod netns steps', () => {
  it('rp-filter comes right after the netns is made, before CNI ADD and any bridge, and has no undo', () => {
    expect(podNetnsSteps('pod1')).toEqual([
      {
        name: 'netns',
        target: 'pod1',
        do: [{ op: 'netns-add', name: 'pod1' }],
        undo: [{ op: 'netns-del', name: 'pod1' }],
      },
      {
        name: 'rp-filter',
        target: 'pod1',
        do: [
          {
            op: 'sysctl',
            settings: [
              'net.ipv4.conf.all.rp_filter=0',
              'net.ipv4.conf.default.rp_filter=0',
              'net.ipv6.conf.all.accept_ra=0',
              'net.ipv6.conf.default.accept_ra=0',
              'net.ipv6.conf.all.accept_dad=0',
              'net.ipv6.conf.default.accept_dad=0',
            ],
          },
        ],
        undo: [],
      },
    ]);
    expect(rpFilterStep('pod1')).toEqual(podNetnsSteps('pod1')[1]);
    // the records release and recover rebuild start the same way
    expect(
      conventionRecord('pod1', NS, 'virtlet-eth0', { podId: 'u', podNs: 'n', podName: 'p' }).steps.map((s) => s.name),
    ).toEqual(['netns', 'rp-filter', 'cni-add']);
  });
});

describe('runsOf (how the step engine spawns)', () => {
  it('one ip batch across steps (one netlink call, sysctls in their turn), the netns with its sysctls, every other op alone; ebtables rules (undo of old records) one transaction per step', () => {
    const plan = planContainerSide({
      observed: observedAfterBridge(),
      result: bridgeResult(),
      newMac: () => '02:11:22:33:44:55',
    });
    const steps = [...podNetnsSteps('pod1'), ...plan.steps];
    const runs = runsOf(steps.flatMap((step) => step.do.map((op) => ({ step, op }))));
    const shown = (r: (typeof runs)[number]): string =>
      r.kind === 'ip'
        ? `ip x${r.lines.length}`
        : r.kind === 'ebtables'
          ? `ebtables x${r.rules.length} ${r.step.name}`
          : r.kind === 'netns'
            ? `netns ${r.step.name}+${r.sysctl.name}`
            : `${r.op.op} ${r.step.name}`;
    // the netns with its sysctls one call; IPv6 off the first line of the links' batch
    expect(runs.map(shown)).toEqual(['netns netns+rp-filter', 'ip x13', 'nft dhcp-filter']);
    const ip = runs[1]!;
    expect(ip.kind === 'ip' && ip.lines.map((l) => l.step.name).slice(0, 2)).toEqual(['ipv6-off', 'lo-up']);
    // ebtables rules of two steps (records of earlier versions) are two transactions
    const old = {
      name: 'dhcp-filter',
      target: 'virtlet-eth0',
      do: [],
      undo: dhcpFilterRules('virtlet-eth0').map((r) => ({ op: 'ebtables' as const, args: ['-D', ...r] })),
    } as Step;
    const [a, b] = [
      { ...old, do: old.undo },
      { ...old, target: 'other', do: old.undo },
    ];
    expect(
      runsOf([...a.do.map((op) => ({ step: a, op })), ...b.do.map((op) => ({ step: b, op }))]).map((r) => r.kind),
    ).toEqual(['ebtables', 'ebtables']);
  });

  it('ebtablesRestoreInput adds the rules to the filter table without a flush', () => {
    expect(ebtablesRestoreInput([['-A', 'INPUT', '-i', 'eth0', '-j', 'DROP']])).toBe(
      '*filter\n-A INPUT -i eth0 -j DROP\nCOMMIT\n',
    );
  });
});
