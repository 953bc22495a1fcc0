// The binding of each CNI interface (bridge or tc-redirect) and the tc-redirect plan: macvlan and ipvlan (whose MAC
// cannot move) get tc redirects instead of a bridge, keep their MAC, and every recorded line is one the codec knows.
import { describe, expect, it } from 'vitest';
import type { CniResult } from '../../src/cni/types.js';
import { Binding, chooseBinding, expectedBinding } from '../../src/podnet/binding.js';
import { lineRequest } from '../../src/podnet/exec.js';
import { planContainerSide, preparedSteps } from '../../src/podnet/plan.js';
import { buildCsn, observedBeforeFromCsn } from '../../src/podnet/csn.js';
import { resultForRecover } from '../../src/podnet/recover.js';
import { KEPT_FROM_NETWORK, KEPT_FROM_VM, REDIRECT_PRIO } from '../../src/podnet/tcredirect.js';
import type { Observed, ObservedLink } from '../../src/podnet/types.js';
import { runsOf } from '../../src/podnet/steps.js';
import type { Op, Step } from '../../src/state/record.js';

const NS = '/var/run/netns/podm';
const MAC = '5e:1f:0a:11:22:33';
const TAP_MAC = '02:aa:bb:cc:dd:ee';

/** The pod netns as the plugins left it; `tap`: with the tap add made while they ran (tc-redirect's, up). */
function observed(
  kind: string | undefined,
  opts: { v6?: boolean; tap?: { mac: string; mtu?: number } } = {},
): Observed {
  const link: ObservedLink = {
    name: 'virtlet-eth0',
    index: 4,
    ...(kind ? { kind } : {}),
    mac: MAC,
    mtu: 1500,
    up: true,
    addrs4: [{ local: '192.168.77.20', prefixlen: 24, broadcast: '192.168.77.255', scope: 'global' }],
    ...(opts.v6
      ? {
          addrs6: [{ local: 'fd77::20', prefixlen: 64, scope: 'global' }],
          linkLocal6: [{ local: 'fe80::5c1f:aff:fe11:2233', prefixlen: 64, scope: 'link' }],
        }
      : {}),
  };
  const tap: ObservedLink[] = opts.tap
    ? [{ name: 'tap0', index: 3, kind: 'tun', mac: opts.tap.mac, mtu: opts.tap.mtu ?? 1500, up: true, addrs4: [] }]
    : [];
  return {
    links: [{ name: 'lo', index: 1, mac: '00:00:00:00:00:00', mtu: 65536, up: true, addrs4: [] }, ...tap, link],
    routes4: [
      { dst: 'default', gateway: '192.168.77.1', dev: 'virtlet-eth0', protocol: 'boot', scope: 'global', flags: [] },
      {
        dst: '192.168.77.0/24',
        dev: 'virtlet-eth0',
        protocol: 'kernel',
        scope: 'link',
        prefsrc: '192.168.77.20',
        flags: [],
      },
    ],
    routes6: [],
  };
}

function result(opts: { v6?: boolean } = {}): CniResult {
  return {
    cniVersion: '1.0.0',
    interfaces: [{ name: 'virtlet-eth0', mac: MAC, sandbox: NS }],
    ips: [
      { address: '192.168.77.20/24', gateway: '192.168.77.1', interface: 0 },
      ...(opts.v6 ? [{ address: 'fd77::20/64', gateway: 'fd77::1', interface: 0 }] : []),
    ],
    routes: [{ dst: '0.0.0.0/0', gw: '192.168.77.1' }],
    dns: {},
  };
}

const lines = (ops: Op[]) =>
  ops.flatMap((o) => (o.op === 'ip' || o.op === 'tc' ? [`${o.op} ${o.args.join(' ')}`] : []));
const names = (steps: Step[]) => steps.map((s) => s.name);
/** An IPv6 interface's steps under tc-redirect (the tap comes up after its addrgenmode: links-up) */
const V6_REDIRECT_STEPS = ['lo-up', 'strip-routes', 'strip-addrs', 'link-local-off', 'tap', 'links-up', 'tc-redirect'];

describe('chooseBinding', () => {
  it('auto: tc-redirect for the kinds whose MAC must stay, and for a veth', () => {
    for (const kind of ['macvlan', 'macvtap', 'ipvlan', 'ipvtap', 'veth'])
      expect(chooseBinding('auto', { kind })).toBe(Binding.TcRedirect);
  });

  it('auto: the bridge for every other link (a NIC, a VLAN, a kind not shown)', () => {
    for (const kind of ['vlan', 'bridge', 'dummy', undefined])
      expect(chooseBinding('auto', kind ? { kind } : {})).toBe(Binding.Bridge);
  });

  it('a mode that names a binding is that binding for every link', () => {
    expect(chooseBinding('bridge', { kind: 'macvlan' })).toBe(Binding.Bridge);
    expect(chooseBinding('bridge', { kind: 'veth' })).toBe(Binding.Bridge);
    expect(chooseBinding('tc-redirect', { kind: 'vlan' })).toBe(Binding.TcRedirect);
  });
});

describe('the tc-redirect plan', () => {
  it.each([['macvlan'], ['ipvlan']])(
    '%s: no bridge, the MAC kept, the tap with the DHCP server address, redirects both ways',
    (kind) => {
      const plan = planContainerSide({ observed: observed(kind), result: result(), newMac: () => TAP_MAC });
      // the interface is up as its plugin left it, and the tap comes up with its MTU and MAC: no links-up step
      expect(names(plan.steps)).toEqual(['ipv6-off', 'lo-up', 'strip-routes', 'strip-addrs', 'tap', 'tc-redirect']);
      expect(plan.interfaces).toEqual([
        {
          index: 0,
          cniName: 'virtlet-eth0',
          type: 'tap',
          binding: 'tc-redirect',
          vmMac: MAC,
          mtu: 1500,
          tapName: 'tap0',
          multiQueue: true,
          bridgeName: '',
          bridgeIp: '169.254.254.2',
          vlanId: 0,
        },
      ]);
      const step = (n: string) => plan.steps.find((s) => s.name === n)!;
      // nothing changes the interface's MAC
      expect(
        plan.steps.flatMap((s) => lines(s.do)).filter((l) => / address /.test(l) && l.includes('virtlet-eth0')),
      ).toEqual([]);
      expect(lines(step('tap').do)).toEqual([
        'ip tuntap add dev tap0 mode tap vnet_hdr multi_queue',
        'tc qdisc replace dev tap0 root noqueue',
        `ip link set dev tap0 mtu 1500 address ${TAP_MAC} up`,
        'ip addr add 169.254.254.2/24 dev tap0',
      ]);
      const tc = lines(step('tc-redirect').do);
      expect(tc[0]).toBe('tc qdisc add dev virtlet-eth0 ingress');
      expect(tc).toContain(
        'tc filter add dev virtlet-eth0 parent ffff: prio 1 protocol ip u32 match u8 17 0xff at 9 match u16 68 0xffff at 22 classid ffff:1',
      );
      expect(tc).toContain(
        `tc filter add dev virtlet-eth0 parent ffff: prio ${REDIRECT_PRIO} protocol all u32 match u8 0 0 at 0 action mirred egress redirect dev tap0`,
      );
      expect(tc).toContain('tc qdisc add dev tap0 ingress');
      expect(tc).toContain(
        'tc filter add dev tap0 parent ffff: prio 3 protocol arp u32 match u32 0xa9fefe02 0xffffffff at 24 classid ffff:1',
      );
      expect(tc).toContain(
        `tc filter add dev tap0 parent ffff: prio ${REDIRECT_PRIO} protocol all u32 match u8 0 0 at 0 action mirred egress redirect dev virtlet-eth0`,
      );
      // the keep filters come before the redirect on each device, one prio each
      expect(tc.length).toBe(2 + KEPT_FROM_NETWORK.length + 2 + KEPT_FROM_VM.length);
      // undo: the interface's qdisc before its CNI DEL; the tap's goes with the netns
      expect(step('tc-redirect').undo).toEqual([
        { op: 'tc', args: ['qdisc', 'del', 'dev', 'virtlet-eth0', 'ingress'] },
        { op: 'tc', args: ['qdisc', 'del', 'dev', 'tap0', 'ingress'], withNetns: true },
      ]);
      expect(step('tap').undo).toEqual([{ op: 'ip', args: ['link', 'del', 'dev', 'tap0'], withNetns: true }]);
    },
  );

  it('every line it records is one the codecs turn into a request, all in one batch', () => {
    const plan = planContainerSide({
      observed: observed('macvlan', { v6: true }),
      result: result({ v6: true }),
      newMac: () => TAP_MAC,
    });
    const items = plan.steps.flatMap((step) => [...step.do, ...step.undo].map((op) => ({ step, op })));
    const batch = runsOf(items.filter(({ op }) => op.op === 'ip' || op.op === 'tc'));
    expect(batch).toHaveLength(1);
    for (const r of batch)
      if (r.kind === 'ip')
        for (const { op } of r.lines)
          if (op.op !== 'sysctl')
            expect(() => lineRequest(op.op === 'tc' ? ['tc', ...op.args] : op.args)).not.toThrow();
  });

  it('IPv6 on a veth: the pod netns routes for the VM from a link-local of its own; frames to the router stay in it', () => {
    const plan = planContainerSide({
      observed: observed('veth', { v6: true }),
      result: {
        ...result({ v6: true }),
        routes: [
          { dst: '0.0.0.0/0', gw: '192.168.77.1' },
          { dst: '::/0', gw: 'fd77::1' },
        ],
      },
      newMac: () => TAP_MAC,
    });
    // the macvlan's steps, then the routing
    expect(names(plan.steps)).toEqual([...V6_REDIRECT_STEPS, 'ipv6-forwarding', 'ipv6-routes']);
    const step = (n: string) => plan.steps.find((s) => s.name === n)!;
    // its own link-local: the MAC's EUI-64 with ff:fd for ff:fe (the VM has the ff:fe one), a /128 with the link-local
    // route beside it (a /64 would join the subnet-router anycast address once forwarding is on)
    expect(lines(step('link-local-off').do)).toEqual([
      'ip link set dev virtlet-eth0 addrgenmode none',
      'ip addr del fe80::5c1f:aff:fe11:2233/64 dev virtlet-eth0',
      'ip addr add fe80::5c1f:aff:fd11:2233/128 dev virtlet-eth0 nodad',
      'ip route replace fe80::/64 dev virtlet-eth0',
    ]);
    expect(lines(step('link-local-off').undo).slice(0, 2)).toEqual([
      'ip route del fe80::/64 dev virtlet-eth0',
      'ip addr del fe80::5c1f:aff:fd11:2233/128 dev virtlet-eth0',
    ]);
    const tc = lines(step('tc-redirect').do);
    // from the network: IPv6 to that address stays; from the VM: IPv6 to the tap's MAC (its router) stays
    expect(tc).toContain(
      'tc filter add dev virtlet-eth0 parent ffff: prio 5 protocol ipv6 u32 match u32 0xfe800000 0xffffffff at 24 match u32 0x00000000 0xffffffff at 28 match u32 0x5c1f0aff 0xffffffff at 32 match u32 0xfd112233 0xffffffff at 36 classid ffff:1',
    );
    // and the solicitations for it, multicast to the solicited-node group it shares with the VM's
    expect(tc).toContain(
      'tc filter add dev virtlet-eth0 parent ffff: prio 6 protocol ipv6 u32 match u8 58 0xff at 6 match u8 135 0xff at 40 match u32 0xfe800000 0xffffffff at 48 match u32 0x00000000 0xffffffff at 52 match u32 0x5c1f0aff 0xffffffff at 56 match u32 0xfd112233 0xffffffff at 60 classid ffff:1',
    );
    expect(tc).toContain(
      'tc filter add dev tap0 parent ffff: prio 8 protocol ipv6 u32 match u16 0x02aa 0xffff at -14 match u32 0xbbccddee 0xffffffff at -12 classid ffff:1',
    );
    expect(lines(step('ipv6-routes').do)).toEqual([
      'ip route replace fd77::/64 dev virtlet-eth0',
      'ip route replace ::/0 via fd77::1 dev virtlet-eth0',
    ]);
    expect(plan.interfaces[0]).toMatchObject({ binding: 'tc-redirect', routed6: true, bridgeMac: TAP_MAC });
    // every line is one the codecs turn into a request
    for (const s of plan.steps)
      for (const op of [...s.do, ...s.undo])
        if (op.op === 'ip' || op.op === 'tc')
          expect(() => lineRequest(op.op === 'tc' ? ['tc', ...op.args] : op.args)).not.toThrow();
  });

  it('IPv6 on a veth, its tap prepared: the keep filter for the router MAC comes with the redirect', () => {
    const plan = planContainerSide({
      observed: observed('veth', { v6: true, tap: { mac: TAP_MAC } }),
      result: result({ v6: true }),
      newMac: () => '02:99:99:99:99:99',
      prepared: 'virtlet-eth0',
      preparedFor: Binding.TcRedirect,
    });
    // the router the guest sees is the tap, with the MAC the kernel gave it; it is up already, so the RA and DHCPv6
    // servers can start while the plan is applied
    expect(plan.interfaces[0]).toMatchObject({ bridgeMac: TAP_MAC, bridgeIp6: 'fe80::aa:bbff:fecc:ddee' });
    expect(names(plan.steps)).not.toContain('links-up');
    expect(plan.dhcpEarly).toBe(true);
    expect(lines(plan.steps.find((s) => s.name === 'tc-redirect')!.do).filter((l) => l.includes('dev tap0 '))).toEqual([
      'tc filter add dev tap0 parent ffff: prio 8 protocol ipv6 u32 match u16 0x02aa 0xffff at -14 match u32 0xbbccddee 0xffffffff at -12 classid ffff:1',
      `tc filter add dev tap0 parent ffff: prio ${REDIRECT_PRIO} protocol all u32 match u8 0 0 at 0 action mirred egress redirect dev virtlet-eth0`,
    ]);
  });

  it('IPv6: the interface gives up the link-local it shares with the VM; the tap is the router the guest sees', () => {
    const plan = planContainerSide({
      observed: observed('macvlan', { v6: true }),
      result: result({ v6: true }),
      newMac: () => TAP_MAC,
    });
    expect(names(plan.steps)).toEqual(V6_REDIRECT_STEPS);
    const ll = plan.steps.find((s) => s.name === 'link-local-off')!;
    expect(lines(ll.do)).toEqual([
      'ip link set dev virtlet-eth0 addrgenmode none',
      'ip addr del fe80::5c1f:aff:fe11:2233/64 dev virtlet-eth0',
    ]);
    expect(lines(ll.undo)).toEqual([
      'ip link set dev virtlet-eth0 addrgenmode eui64',
      'ip addr replace fe80::5c1f:aff:fe11:2233/64 dev virtlet-eth0 nodad',
    ]);
    expect(plan.interfaces[0]).toMatchObject({ bridgeMac: TAP_MAC, bridgeIp6: 'fe80::aa:bbff:fecc:ddee' });
    expect(lines(plan.steps.find((s) => s.name === 'tap')!.do)[2]).toBe(
      `ip link set dev tap0 mtu 1500 address ${TAP_MAC} addrgenmode none`,
    );
    // no forwarding and no routes: the pod netns routes nothing for the VM
    expect(names(plan.steps)).not.toContain('ipv6-forwarding');
  });

  it('the prepared bridge, tap and filter are deleted first when interface 0 gets tc-redirect', () => {
    const plan = planContainerSide({
      observed: observed('macvlan'),
      result: result(),
      newMac: () => TAP_MAC,
      prepared: 'virtlet-eth0',
    });
    expect(names(plan.steps)).toEqual([
      'ipv6-off',
      'drop-prepared',
      'strip-routes',
      'strip-addrs',
      'tap',
      'tc-redirect',
    ]);
  });

  it('links prepared for tc-redirect (the tap alone) are finished, not deleted: no link is deleted or made again', () => {
    const plan = planContainerSide({
      observed: observed('macvlan', { tap: { mac: TAP_MAC } }),
      result: result(),
      newMac: () => '02:99:99:99:99:99',
      prepared: 'virtlet-eth0',
      preparedFor: Binding.TcRedirect,
    });
    // the tap is up already, with the MAC the kernel gave it and the CNI link's MTU: nothing to set
    expect(names(plan.steps)).toEqual(['ipv6-off', 'strip-routes', 'strip-addrs', 'tc-redirect']);
    // the tap's address, ingress qdisc and keep filters were made with it: only its redirect is left
    expect(lines(plan.steps.find((s) => s.name === 'tc-redirect')!.do).filter((l) => l.includes('dev tap0 '))).toEqual([
      `tc filter add dev tap0 parent ffff: prio ${REDIRECT_PRIO} protocol all u32 match u8 0 0 at 0 action mirred egress redirect dev virtlet-eth0`,
    ]);
    expect(plan.steps.flatMap((s) => lines(s.do)).filter((l) => /^ip link del |^ip tuntap /.test(l))).toEqual([]);
    // its DHCP server binds to the tap, which exists already: it starts while the plan is applied
    expect(plan.dhcpEarly).toBe(true);
  });

  it('a prepared tc-redirect tap gets the MTU of a CNI link whose MTU is not the default, and that alone', () => {
    const jumbo = observed('veth', { tap: { mac: TAP_MAC } });
    jumbo.links.find((l) => l.name === 'virtlet-eth0')!.mtu = 9000;
    const plan = planContainerSide({
      observed: jumbo,
      result: result(),
      newMac: () => TAP_MAC,
      prepared: 'virtlet-eth0',
      preparedFor: Binding.TcRedirect,
    });
    expect(lines(plan.steps.find((s) => s.name === 'tap')!.do)).toEqual(['ip link set dev tap0 mtu 9000']);
    expect(plan.interfaces[0]!.mtu).toBe(9000);
  });

  it('a prepared tc-redirect tap that is not in the pod netns fails the plan, saying so', () => {
    expect(() =>
      planContainerSide({
        observed: observed('veth'),
        result: result(),
        newMac: () => TAP_MAC,
        prepared: 'virtlet-eth0',
        preparedFor: Binding.TcRedirect,
      }),
    ).toThrow(/the tap tap0 made while the plugins ran is not in the pod netns/);
  });

  it('prepared and finished, tc-redirect makes what its plan makes without preparing, but for the tap up early', () => {
    const input = { observed: observed('veth'), result: result(), newMac: () => TAP_MAC };
    const whole = planContainerSide(input);
    const finished = planContainerSide({
      ...input,
      observed: observed('veth', { tap: { mac: TAP_MAC } }),
      prepared: 'virtlet-eth0',
      preparedFor: Binding.TcRedirect,
    });
    const made = (steps: Step[]) =>
      steps.flatMap((s) => lines(s.do)).filter((l) => !l.startsWith('ip link set dev lo'));
    const tapLink = (l: string) => l.startsWith('ip link set dev tap0 ');
    const prepared = preparedSteps('virtlet-eth0', Binding.TcRedirect);
    expect([...made(prepared), ...made(finished.steps)].filter((l) => !tapLink(l)).sort()).toEqual(
      made(whole.steps)
        .filter((l) => !tapLink(l))
        .sort(),
    );
    // made whole, the tap comes up with its MTU and the plan's MAC; prepared, it comes up once its address and keep
    // filters are made, keeping the kernel's MAC
    expect(made(whole.steps).filter(tapLink)).toEqual([`ip link set dev tap0 mtu 1500 address ${TAP_MAC} up`]);
    expect(made(prepared).slice(2)).toEqual([
      'ip addr add 169.254.254.2/24 dev tap0',
      'tc qdisc add dev tap0 ingress',
      ...KEPT_FROM_VM.map((_, n) =>
        expect.stringMatching(new RegExp(`^tc filter add dev tap0 parent ffff: prio ${n + 1} `)),
      ),
      'ip link set dev tap0 addrgenmode none',
      'ip link set dev tap0 up',
    ]);
  });

  it('an interface its plugin left down is brought up; with IPv6 the tap too, once it makes no link-local', () => {
    const down = observed('macvlan');
    down.links[1]!.up = false;
    const plan = planContainerSide({ observed: down, result: result(), newMac: () => TAP_MAC });
    expect(lines(plan.steps.find((s) => s.name === 'links-up')!.do)).toEqual(['ip link set dev virtlet-eth0 up']);
    const v6 = planContainerSide({
      observed: observed('macvlan', { v6: true }),
      result: result({ v6: true }),
      newMac: () => TAP_MAC,
    });
    expect(lines(v6.steps.find((s) => s.name === 'links-up')!.do)).toEqual(['ip link set dev tap0 up']);
  });

  it('links prepared for tc-redirect that a VLAN does not fit: the tap deleted, the bridge binding made anew', () => {
    const plan = planContainerSide({
      observed: observed('vlan'),
      result: result(),
      newMac: () => TAP_MAC,
      prepared: 'virtlet-eth0',
      preparedFor: Binding.TcRedirect,
    });
    expect(lines(plan.steps.find((s) => s.name === 'drop-prepared')!.do)).toEqual(['ip link del dev tap0']);
    expect(plan.interfaces[0]!.binding).toBe('bridge');
    expect(plan.steps.flatMap((s) => lines(s.do))).toContain('ip tuntap add dev tap0 mode tap vnet_hdr multi_queue');
  });

  it("what add prepares for: the mode, or under auto the binding the first plugin's link most likely gets", () => {
    for (const type of ['macvlan', 'ipvlan', 'bridge', 'ptp', 'flannel', 'calico', 'sriov'])
      expect(expectedBinding('auto', type)).toBe(Binding.TcRedirect);
    // a NIC or a VLAN keeps the bridge; so does a node without a network list
    for (const type of ['host-device', 'vlan', undefined]) expect(expectedBinding('auto', type)).toBe(Binding.Bridge);
    expect(expectedBinding(Binding.TcRedirect, 'host-device')).toBe(Binding.TcRedirect);
    expect(expectedBinding(Binding.Bridge, 'macvlan')).toBe(Binding.Bridge);
    expect(names(preparedSteps('virtlet-eth0', Binding.TcRedirect))).toEqual(['lo-up', 'tap']);
  });

  it('the operator may force either binding: bridge for a macvlan, tc-redirect for a veth', () => {
    const bridged = planContainerSide({
      observed: observed('macvlan'),
      result: result(),
      newMac: () => TAP_MAC,
      bindingOf: () => Binding.Bridge,
    });
    expect(bridged.interfaces[0]!.binding).toBe('bridge');
    const redirected = planContainerSide({
      observed: observed('veth'),
      result: result(),
      newMac: () => TAP_MAC,
      bindingOf: () => Binding.TcRedirect,
    });
    expect(redirected.interfaces[0]!.binding).toBe('tc-redirect');
  });

  it('recover plans the same undo from the csn and the live netns (tap MAC, no bridge)', () => {
    const added = planContainerSide({ observed: observed('macvlan'), result: result(), newMac: () => TAP_MAC });
    const v031 = {
      cniVersion: '0.3.1',
      interfaces: [{ name: 'virtlet-eth0', mac: MAC, sandbox: NS }],
      ips: [{ version: '4' as const, address: '192.168.77.20/24', gateway: '192.168.77.1' }],
      routes: [{ dst: '0.0.0.0/0', gw: '192.168.77.1' }],
    };
    const csn = buildCsn(v031, NS, added.interfaces);
    const live: Observed = {
      links: [observed('macvlan').links[0]!, { ...observed('macvlan').links[1]!, addrs4: [] }],
      routes4: [],
    };
    const r = resultForRecover(csn, NS);
    const plan = planContainerSide({
      observed: observedBeforeFromCsn(live, r, csn),
      result: r,
      newMac: () => TAP_MAC,
      bindingOf: () => Binding.TcRedirect,
    });
    expect(plan.interfaces).toEqual(added.interfaces);
    expect(plan.steps.map((s) => [s.name, lines(s.undo)]).filter(([n]) => n === 'tc-redirect' || n === 'tap')).toEqual(
      added.steps.map((s) => [s.name, lines(s.undo)]).filter(([n]) => n === 'tc-redirect' || n === 'tap'),
    );
  });
});
