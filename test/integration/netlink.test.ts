// The pod netns through rtnetlink (the addon's netlinkInNetns): what observeNetns reads equals what `ip -j -d` shows,
// and every kind of line the planner records does what `ip` would, fails as `ip -batch` would, and leaves nothing.
import { describe, it, expect, afterEach } from 'vitest';
import { existsSync, readlinkSync } from 'node:fs';
import { execa } from 'execa';
import { addFilterTable, deleteFilterTable, observeNetns, runIpLines } from '../../src/podnet/exec.js';
import { dhcp6FilterRules, dhcpFilterRules } from '../../src/podnet/plan.js';
import { ipRequest } from '../../src/podnet/iplines.js';
import { parseObserved } from '../helpers/ipjson.js';
import { uniqueName } from '../helpers/netns.js';

const made: string[] = [];

afterEach(async () => {
  for (const ns of made.splice(0)) {
    await execa('ip', ['netns', 'del', ns], { reject: false });
    expect(existsSync(`/var/run/netns/${ns}`), `netns ${ns} left`).toBe(false);
  }
});

async function netns(): Promise<{ ns: string; path: string; ip: (...a: string[]) => Promise<string> }> {
  const ns = uniqueName('vmpnl-');
  await execa('ip', ['netns', 'add', ns]);
  made.push(ns);
  const ip = async (...a: string[]) => (await execa('ip', ['-n', ns, ...a], { timeout: 10_000 })).stdout;
  return { ns, path: `/var/run/netns/${ns}`, ip };
}

async function ipView(ns: string) {
  const { stdout } = await execa('ip', ['-d', '-j', '-n', ns, '-batch', '-'], {
    input: 'addr show\nroute show\nroute show table all root ::/0\n',
    timeout: 10_000,
  });
  return parseObserved(stdout);
}

/** A pod-like netns: a veth pair (both ends inside) with IPv4 and IPv6 addresses and routes of every kind add meets. */
async function furnished() {
  const n = await netns();
  const lines = [
    'link add va type veth peer name vb',
    'link add brx type bridge',
    'link set dev vb master brx',
    'link set dev va up',
    'link set dev vb up',
    'link set dev brx up',
    'link set dev lo up',
    'addr add 10.77.0.5/24 brd 10.77.0.255 dev va',
    'addr add 10.77.1.5/32 scope link dev va',
    'addr add fd77::5/64 dev va nodad',
    'route add default via 10.77.0.1 dev va',
    'route add 10.78.0.0/16 via 10.77.0.1 dev va proto static metric 7',
    'route add 10.79.0.1 dev va scope link',
    'route add 10.80.0.0/16 via 10.81.0.1 dev va onlink',
    'route add ::/0 via fd77::1 dev va',
    'route add fd78::/48 via fd77::1 dev va metric 5 proto dhcp',
  ];
  await execa('ip', ['-n', n.ns, '-batch', '-'], { input: `${lines.join('\n')}\n`, timeout: 10_000 });
  return n;
}

describe('observeNetns (rtnetlink dumps)', () => {
  it('shows the links, addresses and main-table routes exactly as ip -j -d does', async () => {
    const n = await furnished();
    const ours = await observeNetns(n.path);
    expect(ours).toEqual(await ipView(n.ns));
    // and what add reads from it
    const va = ours.links.find((l) => l.name === 'va')!;
    expect(va).toMatchObject({ kind: 'veth', up: true });
    expect(va.addrs4).toEqual(
      expect.arrayContaining([
        { local: '10.77.0.5', prefixlen: 24, broadcast: '10.77.0.255', scope: 'global' },
        { local: '10.77.1.5', prefixlen: 32, scope: 'link' },
      ]),
    );
    expect(va.linkLocal6?.[0]?.local).toMatch(/^fe80::/);
    expect(ours.links.find((l) => l.name === 'vb')!.master).toBe('brx');
    expect(ours.routes4.find((r) => r.dst === '10.78.0.0/16')).toEqual({
      type: 'unicast',
      dst: '10.78.0.0/16',
      gateway: '10.77.0.1',
      dev: 'va',
      protocol: 'static',
      scope: 'global',
      metric: 7,
      flags: [],
    });
    expect(ours.routes4.find((r) => r.dst === '10.80.0.0/16')!.flags).toEqual(['onlink']);
    expect(ours.routes6!.find((r) => r.dst === 'fd78::/48')).toMatchObject({
      gateway: 'fd77::1',
      protocol: 'dhcp',
      metric: 5,
    });
  });

  it('an empty netns: lo only, no routes', async () => {
    const n = await netns();
    const ours = await observeNetns(n.path);
    expect(ours).toEqual(await ipView(n.ns));
    expect(ours.links.map((l) => l.name)).toEqual(['lo']);
  });

  it('a netns that does not exist is a clear error', async () => {
    await expect(observeNetns('/var/run/netns/vmpnl-nosuch')).rejects.toThrow(
      /netlink in \/var\/run\/netns\/vmpnl-nosuch: .*open the netns.*ENOENT/,
    );
  });

  it('on the event loop (offLoop false, a lone add): the same reading, the same errors, and the loop back home', async () => {
    const n = await furnished();
    const home = readlinkSync('/proc/thread-self/ns/net');
    expect(await observeNetns(n.path, undefined, { offLoop: false })).toEqual(await observeNetns(n.path));
    expect(readlinkSync('/proc/thread-self/ns/net')).toBe(home);
    await expect(observeNetns('/var/run/netns/vmpnl-nosuch', undefined, { offLoop: false })).rejects.toThrow(
      /netlink in \/var\/run\/netns\/vmpnl-nosuch: .*open the netns.*ENOENT/,
    );
    expect(readlinkSync('/proc/thread-self/ns/net')).toBe(home);
  });

  it('runIpLines writes sysctls in their turn of the batch; a failing one is a line with its errno', async () => {
    const n = await netns();
    await n.ip('link', 'add', 'va', 'type', 'veth', 'peer', 'name', 'vb');
    await n.ip('link', 'set', 'dev', 'va', 'up');
    expect(
      await runIpLines(n.path, [
        { sysctl: ['net.ipv6.conf.all.disable_ipv6=1', 'net.ipv6.conf.default.disable_ipv6=1'] },
        ['link', 'set', 'dev', 'lo', 'up'],
      ]),
    ).toEqual([]);
    const sysctl = (k: string) => execa('ip', ['netns', 'exec', n.ns, 'sysctl', '-n', k]).then((r) => r.stdout.trim());
    expect([await sysctl('net.ipv6.conf.all.disable_ipv6'), await sysctl('net.ipv6.conf.va.disable_ipv6')]).toEqual([
      '1',
      '1',
    ]);
    // no IPv6 address left on the link that was up
    expect((await observeNetns(n.path)).links.find((l) => l.name === 'va')?.linkLocal6 ?? []).toEqual([]);
    const bad = await runIpLines(n.path, [
      { sysctl: ['net.ipv6.conf.vmpnl-nosuch.disable_ipv6=1'] },
      ['link', 'set', 'dev', 'lo', 'up'],
    ]);
    expect(bad).toEqual([
      {
        line: 1,
        code: 'ENOENT',
        message: expect.stringContaining('sysctl -w net.ipv6.conf.vmpnl-nosuch.disable_ipv6=1'),
      },
    ]);
  });
});

describe("runIpLines (the planner's ip lines as rtnetlink requests)", () => {
  it('builds bridge and tap, moves MAC and addresses, and undoes it, as ip would', async () => {
    const n = await furnished();
    const before = await ipView(n.ns);
    const va = before.links.find((l) => l.name === 'va')!;
    const ll = va.linkLocal6![0]!.local;
    const lines = [
      ['route', 'del', 'default', 'via', '10.77.0.1', 'dev', 'va'],
      ['route', 'del', '10.78.0.0/16', 'via', '10.77.0.1', 'dev', 'va', 'metric', '7'],
      ['route', 'del', '::/0', 'via', 'fd77::1', 'dev', 'va', 'metric', '1024'],
      ['addr', 'del', '10.77.0.5/24', 'dev', 'va'],
      ['addr', 'del', 'fd77::5/64', 'dev', 'va'],
      ['link', 'set', 'dev', 'va', 'address', '02:aa:bb:cc:dd:ee'],
      ['link', 'set', 'dev', 'va', 'addrgenmode', 'none'],
      ['addr', 'del', `${ll}/64`, 'dev', 'va'],
      [
        'link',
        'add',
        'name',
        'br0',
        'address',
        '02:aa:bb:cc:dd:ee',
        'mtu',
        '1400',
        'type',
        'bridge',
        'ageing_time',
        '0',
      ],
      ['link', 'set', 'dev', 'br0', 'addrgenmode', 'none'],
      ['addr', 'add', '169.254.254.2/24', 'dev', 'br0'],
      ['addr', 'add', 'fe80::aa:bbff:fecc:ddee/64', 'dev', 'br0', 'nodad'],
      ['tuntap', 'add', 'dev', 'tap0', 'mode', 'tap', 'vnet_hdr'],
      ['link', 'set', 'dev', 'tap0', 'mtu', '1400'],
      ['link', 'set', 'dev', 'va', 'nomaster'],
      ['link', 'set', 'dev', 'va', 'master', 'br0'],
      ['link', 'set', 'dev', 'tap0', 'master', 'br0'],
      ['link', 'set', 'dev', 'tap0', 'up'],
      ['link', 'set', 'dev', 'br0', 'up'],
      ['route', 'replace', 'fd77::/64', 'dev', 'br0'],
      ['route', 'replace', 'fd79::/64', 'via', 'fd77::1', 'dev', 'br0'],
    ];
    expect(await runIpLines(n.path, lines)).toEqual([]);
    const d = JSON.parse(await n.ip('-d', '-j', 'link', 'show')) as {
      ifname: string;
      address: string;
      mtu: number;
      master?: string;
      flags: string[];
      linkinfo?: { info_kind: string; info_data?: Record<string, unknown> };
    }[];
    const by = (name: string) => d.find((l) => l.ifname === name)!;
    expect(by('va')).toMatchObject({ address: '02:aa:bb:cc:dd:ee', master: 'br0' });
    expect(by('br0')).toMatchObject({
      address: '02:aa:bb:cc:dd:ee',
      mtu: 1400,
      linkinfo: { info_kind: 'bridge', info_data: { ageing_time: 0 } },
    });
    expect(by('br0').flags).toContain('UP');
    expect(by('tap0')).toMatchObject({
      mtu: 1400,
      master: 'br0',
      linkinfo: { info_kind: 'tun', info_data: { type: 'tap', pi: false, vnet_hdr: true, persist: true } },
    });
    const after = await ipView(n.ns);
    const vaAfter = after.links.find((l) => l.name === 'va')!;
    expect(vaAfter.addrs4).toEqual([{ local: '10.77.1.5', prefixlen: 32, scope: 'link' }]);
    expect(vaAfter.addrs6).toBeUndefined();
    expect(vaAfter.linkLocal6).toBeUndefined();
    expect(after.links.find((l) => l.name === 'br0')!.addrs4).toEqual([
      { local: '169.254.254.2', prefixlen: 24, scope: 'global' },
    ]);
    expect(after.links.find((l) => l.name === 'br0')!.linkLocal6).toEqual([
      { local: 'fe80::aa:bbff:fecc:ddee', prefixlen: 64, scope: 'link' },
    ]);
    expect(after.routes4.filter((r) => r.dev === 'va' && r.protocol !== 'kernel').map((r) => r.dst)).toEqual([
      '10.79.0.1',
      '10.80.0.0/16',
    ]);
    expect(after.routes6!.filter((r) => r.dev === 'br0').map((r) => [r.dst, r.gateway])).toEqual([
      ['fd77::/64', undefined],
      ['fd79::/64', 'fd77::1'],
      ['fe80::/64', undefined],
    ]);

    // the undo lines (plan.ts's restore forms), then the links go
    const undo = [
      ['link', 'set', 'dev', 'va', 'nomaster'],
      ['link', 'set', 'dev', 'va', 'address', va.mac],
      ['link', 'set', 'dev', 'va', 'addrgenmode', 'eui64'],
      ['addr', 'replace', `${ll}/64`, 'dev', 'va', 'nodad'],
      ['addr', 'replace', '10.77.0.5/24', 'broadcast', '10.77.0.255', 'dev', 'va'],
      ['addr', 'replace', 'fd77::5/64', 'dev', 'va', 'nodad'],
      ['route', 'replace', 'default', 'via', '10.77.0.1', 'dev', 'va', 'proto', 'boot', 'scope', 'global'],
      [
        'route',
        'replace',
        '10.78.0.0/16',
        'via',
        '10.77.0.1',
        'dev',
        'va',
        'proto',
        'static',
        'scope',
        'global',
        'metric',
        '7',
      ],
      ['route', 'replace', '::/0', 'via', 'fd77::1', 'dev', 'va', 'proto', 'boot', 'scope', 'global', 'metric', '1024'],
      ['link', 'del', 'dev', 'tap0'],
      ['link', 'del', 'dev', 'br0'],
    ];
    expect(await runIpLines(n.path, undo, { force: true })).toEqual([]);
    const back = await ipView(n.ns);
    const order = <T>(xs: T[] | undefined) =>
      xs ? [...xs].sort((a, b) => JSON.stringify(a).localeCompare(JSON.stringify(b))) : xs;
    const norm = (o: typeof before) => ({
      links: o.links.map((l) => ({ ...l, linkLocal6: undefined, addrs4: order(l.addrs4) })),
      routes4: order(o.routes4),
      routes6: order(o.routes6),
    });
    expect(norm(back)).toEqual(norm(before));
  });

  it('stops at the first failing line, as ip -batch; with force runs every line and reports each failure', async () => {
    const n = await netns();
    const lines = [
      ['link', 'set', 'dev', 'lo', 'up'],
      ['link', 'set', 'dev', 'nosuch0', 'up'],
      ['link', 'add', 'name', 'br0', 'type', 'bridge'],
      ['addr', 'del', '10.1.2.3/24', 'dev', 'lo'],
    ];
    const first = await runIpLines(n.path, lines);
    expect(first).toEqual([{ line: 2, code: 'ENODEV', message: 'No such device: Cannot find device "nosuch0"' }]);
    expect(await n.ip('link', 'show', 'br0').catch(() => 'none')).toBe('none');
    const all = await runIpLines(n.path, lines, { force: true });
    expect(all.map((f) => [f.line, f.code])).toEqual([
      [2, 'ENODEV'],
      [4, 'EADDRNOTAVAIL'],
    ]);
    expect(all[1]!.message).toMatch(/^Cannot assign requested address/);
    expect(await n.ip('link', 'show', 'br0')).toMatch(/br0/);
    // the kernel's own reason (extended ack) comes through
    const dup = await runIpLines(n.path, [['link', 'add', 'name', 'br0', 'type', 'bridge']]);
    expect(dup[0]!.message).toMatch(/^File exists/);
  });

  it('refuses a line the planner does not write, before anything runs', async () => {
    const n = await netns();
    await expect(
      runIpLines(n.path, [
        ['link', 'set', 'dev', 'lo', 'up'],
        ['link', 'set', 'dev', 'lo', 'promisc', 'on'],
      ]),
    ).rejects.toThrow(/unknown or incomplete option "promisc"/);
    expect(() => ipRequest(['neigh', 'flush', 'all'])).toThrow(/not a line the planner writes/);
    expect(JSON.parse(await n.ip('-j', 'link', 'show', 'lo'))[0].flags).not.toContain('UP');
  });
});

describe('the DHCP filter as an nf_tables table (one transaction)', () => {
  it("makes the table with ebtables' rules in nft terms, refuses a second, and deletes it", async () => {
    const n = await netns();
    const rules = [...dhcpFilterRules('veth0'), ...dhcp6FilterRules('veth0', 'tap0')];
    await addFilterTable(n.path, 'vmpod-veth0', rules);
    const list = (await execa('nsenter', [`--net=${n.path}`, '--', 'nft', 'list', 'table', 'bridge', 'vmpod-veth0']))
      .stdout;
    expect(list).toMatch(/chain INPUT \{\s+type filter hook input priority filter; policy accept;/);
    expect(list).toMatch(/chain FORWARD \{\s+type filter hook forward priority filter; policy accept;/);
    expect(list).toMatch(/chain OUTPUT \{\s+type filter hook output priority filter; policy accept;/);
    for (const line of [
      'oifname "veth0" meta protocol ip udp dport 67 drop',
      'iifname "veth0" meta protocol ip udp dport 67 drop',
      'oifname "veth0" meta protocol ip6 udp dport 547 drop',
      'oifname "veth0" icmpv6 type nd-router-solicit drop',
      'iifname "veth0" icmpv6 type nd-router-advert drop',
      'iifname "tap0" meta protocol ip6 udp dport 547 drop',
    ]) {
      expect(list).toContain(line);
    }
    expect(list.split('\n').filter((l) => l.trim().endsWith('drop'))).toHaveLength(14);
    // all or nothing: a second table of that name is refused and the first one is untouched
    await expect(addFilterTable(n.path, 'vmpod-veth0', rules)).rejects.toThrow(
      /nf_tables table bridge vmpod-veth0 in .*: File exists/,
    );
    await expect(addFilterTable(n.path, 'vmpod-veth1', [['FORWARD', '-o', 'veth1', '-j', 'ACCEPT']])).rejects.toThrow(
      /unknown -j ACCEPT/,
    );
    await deleteFilterTable(n.path, 'vmpod-veth0');
    expect((await execa('nsenter', [`--net=${n.path}`, '--', 'nft', 'list', 'ruleset'])).stdout.trim()).toBe('');
    // deleting it again is "already undone"
    await deleteFilterTable(n.path, 'vmpod-veth0');
  });
});
