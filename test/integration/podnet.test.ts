// The pod network against the real kernel and the real bridge + host-local plugins, under the bridge binding (what a
// NIC or VLAN gets, and every link under --binding bridge) unless a test says auto (a veth: tc-redirect).
import { describe, it, expect, afterEach } from 'vitest';
import { existsSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';
import { PodNetwork, type PodNetworkState } from '../../src/podnet/index.js';
import { StateStore } from '../../src/state/store.js';
import { CniClient, loadConfList } from '../../src/cni/index.js';
import { silentLogger } from '../../src/log.js';
import { errorChain, isVmpodError } from '../../src/errors.js';
import { macToBase64 } from '../../src/protocol/mac.js';
import { planContainerSide, randomLaaMac } from '../../src/podnet/plan.js';
import { netnsStep, cniAddStep } from '../../src/podnet/netnssteps.js';
import { parseObserved } from '../helpers/ipjson.js';
import { RECORD_KIND } from '../../src/state/record.js';
import { native } from '../../src/native.js';
import { makeCniConf, type CniTestNet } from '../helpers/cniconf.js';
import { Binding, type BindingMode } from '../../src/podnet/binding.js';

const NETNS_DIR = '/var/run/netns';

interface Ctx {
  net: CniTestNet;
  stateDir: string;
  key: string;
  nets: PodNetwork[];
  make(wrap?: (c: CniClient) => CniClient): PodNetwork;
}

const cleanups: (() => Promise<void>)[] = [];

afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function setup(opts: { failingPlugin?: boolean; mtu?: number; binding?: BindingMode } = {}): Promise<Ctx> {
  const net = await makeCniConf(opts);
  const stateDir = mkdtempSync(join(tmpdir(), 'vmpod-podnet-state-'));
  const key = `vmpodt-${randomBytes(4).toString('hex')}`;
  const nets: PodNetwork[] = [];
  const ctx: Ctx = {
    net,
    stateDir,
    key,
    nets,
    make(wrap) {
      const real = new CniClient({ binDirs: net.binDirs, cacheDir: net.cacheDir });
      const cni = wrap ? wrap(real) : real;
      const pn = new PodNetwork({
        stateDir,
        cni,
        loadConfList: () => loadConfList(net.confDir),
        log: silentLogger(),
        binding: opts.binding ?? Binding.Bridge,
      });
      nets.push(pn);
      return pn;
    },
  };
  cleanups.push(async () => {
    for (const pn of nets) pn.closeAll();
    // whatever a failed test left: the netns (its veth goes with it) and the host-local files go with the dirs
    if (existsSync(join(NETNS_DIR, key))) await execa('ip', ['netns', 'del', key], { reject: false });
    await net.cleanup();
    rmSync(stateDir, { recursive: true, force: true });
    expect(existsSync(join(NETNS_DIR, key)), 'netns left').toBe(false);
    expect(await net.bridgeExists(), 'bridge left').toBe(false);
  });
  return ctx;
}

const desc = (key: string) => ({ podId: `uid-${key}`, podNs: 'default', podName: `vm-${key}`, DNS: null });

async function netnsState(key: string) {
  const { stdout } = await execa('ip', ['-d', '-j', '-n', key, '-batch', '-'], {
    input: 'addr show\nroute show\n',
    timeout: 10_000,
  });
  return parseObserved(stdout);
}

function fdinfo(fd: number): string {
  return readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8');
}

function isTunFd(fd: number): boolean {
  try {
    return readlinkSync(`/proc/self/fd/${fd}`) === '/dev/net/tun';
  } catch {
    return false;
  }
}

async function expectNothingLeft(ctx: Ctx, fds: number[]) {
  expect(existsSync(join(NETNS_DIR, ctx.key)), 'netns').toBe(false);
  expect(await ctx.net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
  expect(new StateStore(ctx.stateDir).keys(), 'records').toEqual([]);
  // nothing of a released pod stays in the state dir or the CNI cache dir: no file at all (dirs may stay)
  const files = (dir: string) =>
    existsSync(dir)
      ? readdirSync(dir, { recursive: true })
          .map(String)
          .filter((n) => !statSync(join(dir, n)).isDirectory())
      : [];
  expect(files(ctx.stateDir), 'state dir').toEqual([]);
  expect(files(ctx.net.cacheDir), 'CNI cache dir').toEqual([]);
  for (const fd of fds) {
    // the number may be reused by someone else, but not by a tap of ours
    expect(isTunFd(fd) && fdinfo(fd).includes(`iff:\ttap`), `fd ${fd} still a tap`).toBe(false);
  }
}

/** A snapshot of what must not change across a daemon restart. */
function shape(o: Awaited<ReturnType<typeof netnsState>>) {
  return {
    links: o.links
      .map((l) => ({ name: l.name, kind: l.kind, mac: l.mac, mtu: l.mtu, master: l.master, addrs4: l.addrs4 }))
      .sort((a, b) => a.name.localeCompare(b.name)),
    routes4: o.routes4,
  };
}

async function filterRules(key: string): Promise<string> {
  return (
    await execa(
      'nsenter',
      [`--net=${join(NETNS_DIR, key)}`, '--', 'nft', 'list', 'table', 'bridge', 'vmpod-virtlet-eth0'],
      { timeout: 10_000 },
    )
  ).stdout;
}

/** net.ipv4.conf.<dev>.rp_filter of each dev, read inside the netns (/proc/sys/net is the reader's netns). */
async function rpFilters(key: string, devs: string[]): Promise<string[]> {
  const { stdout } = await execa(
    'nsenter',
    [`--net=${join(NETNS_DIR, key)}`, '--', 'sysctl', '-n', ...devs.map((d) => `net.ipv4.conf.${d}.rp_filter`)],
    { timeout: 10_000 },
  );
  return stdout.split('\n');
}

/**
 * Every queue the multi-queue tap `name` can have (the kernel's MAX_TAP_QUEUES, 256), so that one more open fails with
 * E2BIG, as a VM would hold some; waits up to 5 s for the tap to be made.
 */
async function holdAllQueues(nsPath: string, name: string): Promise<number[]> {
  const opts = { vnetHdr: true, multiQueue: true };
  for (let i = 0; ; i++) {
    try {
      const fds = [await native().openTap(nsPath, name, opts)];
      for (;;) {
        try {
          fds.push(await native().openTap(nsPath, name, opts));
        } catch (e) {
          if ((e as NodeJS.ErrnoException).code === 'E2BIG') return fds;
          for (const fd of fds) native().close(fd);
          throw e;
        }
      }
    } catch (e) {
      if (i >= 500) throw e;
      await new Promise((r) => setTimeout(r, 10));
    }
  }
}

describe('PodNetwork (real kernel, bridge + host-local)', () => {
  it('add builds netns, veth -> bridge + tap, hands a tap fd; release leaves nothing', async () => {
    const ctx = await setup({ mtu: 1400 });
    // a plugin is exec'd before its turn and does nothing until it has its config (docs/decisions.md): ADD's before
    // the netns and the record exist, DEL's before the record says releasing
    let atAddExec: { record: boolean; netns: boolean } | undefined;
    let atDelExec: string | undefined;
    // what the record on disk says when CNI ADD runs, that is when its plugin gets its config: the netns and the ADD
    // (with its DEL), in one write
    let atAdd: { phase: string; steps: string[] } | undefined;
    // what the netns looks like when CNI DEL runs (gets its config): the container side must be undone by then
    let atDel: Awaited<ReturnType<typeof netnsState>> | undefined;
    const pn = ctx.make((real) => {
      const spy = {
        addDeferred: async (...[list, rt, signal, hold]: Parameters<CniClient['addDeferred']>) => {
          const until = hold?.until.then(() => {
            const r = new StateStore(ctx.stateDir).read(ctx.key)!;
            atAdd = { phase: r.phase, steps: r.steps.map((s) => s.name) };
          });
          const onExec = () => {
            atAddExec = {
              record: new StateStore(ctx.stateDir).read(ctx.key) !== undefined,
              netns: existsSync(join(NETNS_DIR, ctx.key)),
            };
            hold?.onExec?.();
          };
          return real.addDeferred(list, rt, signal, until && { until, onExec });
        },
        locate: real.locate.bind(real),
        cachedNetworks: real.cachedNetworks.bind(real),
        del: async (...[list, rt, signal, hold]: Parameters<CniClient['del']>) => {
          const until = (hold?.until ?? Promise.resolve()).then(async () => {
            atDel = await netnsState(ctx.key);
          });
          const onExec = () => {
            atDelExec = new StateStore(ctx.stateDir).read(ctx.key)?.phase;
            hold?.onExec?.();
          };
          return real.del(list, rt, signal, { until, onExec });
        },
      };
      return spy as unknown as CniClient;
    });
    const st: PodNetworkState = await pn.add(ctx.key, desc(ctx.key));
    const fds = [...st.fds];

    expect(st.nsPath).toBe(join(NETNS_DIR, ctx.key));
    expect(existsSync(st.nsPath)).toBe(true);
    expect(st.interfaces).toHaveLength(1);
    const i0 = st.interfaces[0]!;
    expect(i0).toMatchObject({
      cniName: 'virtlet-eth0',
      type: 'tap',
      tapName: 'tap0',
      bridgeName: 'br0',
      bridgeIp: '169.254.254.2',
      mtu: 1400,
      vlanId: 0,
    });

    const o = await netnsState(ctx.key);
    const link = (n: string) => o.links.find((l) => l.name === n)!;
    expect(link('lo').up).toBe(true);
    expect(link('tap0').kind).toBe('tun');
    expect(link('br0').kind).toBe('bridge');
    expect(link('virtlet-eth0').master).toBe('br0');
    expect(link('tap0').master).toBe('br0');
    expect(link('tap0').mtu).toBe(1400);
    expect(link('br0').mtu).toBe(1400);
    // the veth got a new MAC; the VM gets the one the CNI plugin reported
    const sandboxIf = st.csn.Result!.interfaces!.find((x) => x.sandbox)!;
    expect(i0.vmMac).toBe(sandboxIf.mac);
    expect(link('virtlet-eth0').mac).not.toBe(i0.vmMac);
    expect(link('virtlet-eth0').mac).toBe(i0.vethMacNew);
    expect(link('virtlet-eth0').mac).toMatch(/^02:/);
    expect(link('virtlet-eth0').addrs4).toEqual([]);
    expect(link('br0').addrs4.map((a) => `${a.local}/${a.prefixlen}`)).toEqual(['169.254.254.2/24']);
    expect(o.routes4.filter((r) => r.dev === 'virtlet-eth0')).toEqual([]);
    // an IPv4-only pod: IPv6 off in its netns, so no link there has an IPv6 address to announce
    expect((await execa('ip', ['-n', ctx.key, '-6', '-o', 'addr', 'show'])).stdout).toBe('');
    const { stdout: brd } = await execa('ip', ['-d', '-j', '-n', ctx.key, 'link', 'show', 'br0']);
    expect(JSON.parse(brd)[0].linkinfo.info_data.ageing_time).toBe(0);
    const rules = await filterRules(ctx.key);
    expect(rules).toContain('oifname "virtlet-eth0" meta protocol ip udp dport 67 drop');
    // an IPv4-only pod too keeps the guest's DHCPv6 and router solicitations in, and outside RAs out
    expect(rules).toContain('oifname "virtlet-eth0" meta protocol ip6 udp dport 547 drop');
    expect(rules).toContain('oifname "virtlet-eth0" icmpv6 type nd-router-solicit drop');
    expect(rules).toContain('iifname "virtlet-eth0" icmpv6 type nd-router-advert drop');
    // rp_filter off in the pod netns (all, default, and so the bridge made after), whatever the host has
    expect(await rpFilters(ctx.key, ['all', 'default', 'br0', 'virtlet-eth0'])).toEqual(['0', '0', '0', '0']);

    // the fd is the tap, opened in the pod netns, with the vnet header on
    expect(fds).toHaveLength(1);
    expect(fdinfo(fds[0]!)).toContain('iff:\ttap0');

    // csn: Virtlet's shape, the pod's IP from host-local in our subnet
    expect(st.csn.NsPath).toBe(st.nsPath);
    expect(st.csn.Interfaces).toEqual([
      {
        Type: 0,
        Name: 'virtlet-eth0',
        HardwareAddr: macToBase64(i0.vmMac),
        PCIAddress: '',
        MTU: 1400,
        VlanID: 0,
        mac: i0.vmMac,
      },
    ]);
    const ip = st.csn.Result!.ips!.find((x) => x.version === '4')!;
    expect(ip.address.startsWith(ctx.net.subnet.replace('0/24', ''))).toBe(true);
    expect(ip.gateway).toBe(ctx.net.gateway);

    // the record: ready, 0600, every step there
    const store = new StateStore(ctx.stateDir);
    const rec = store.read(ctx.key)!;
    // durable before anything is made: the netns, what is made in it while the plugin runs, the CNI ADD
    expect(atAddExec, "the record and the netns when ADD's plugin was exec'd").toEqual({ record: false, netns: false });
    expect(atAdd).toEqual({
      phase: 'adding',
      steps: ['netns', 'rp-filter', 'lo-up', 'bridge', 'tap', 'dhcp-filter', 'cni-add'],
    });
    expect(rec.kind).toBe(RECORD_KIND);
    expect(rec.phase).toBe('ready');
    expect(rec.steps.map((s) => s.name)).toEqual([
      'netns',
      'rp-filter',
      'lo-up',
      'bridge',
      'tap',
      'dhcp-filter',
      'cni-add',
      'ipv6-off',
      'strip-routes',
      'strip-addrs',
      'veth-mac',
      'enslave',
      'links-up',
    ]);
    expect(statSync(store.pathOf(ctx.key)).mode & 0o777).toBe(0o600);
    expect(pn.keys()).toEqual([ctx.key]);
    expect((await ctx.net.leftovers()).allocations).toHaveLength(1);

    // add again: a conflict that changes nothing
    await expect(pn.add(ctx.key, desc(ctx.key))).rejects.toMatchObject({ code: 'CONFLICT' });
    expect(shape(await netnsState(ctx.key))).toEqual(shape(o));

    await pn.release(ctx.key);
    expect(atDelExec, "the record's phase when DEL's plugin was exec'd").toBe('ready');
    // before CNI DEL the veth was as the plugin left it: original MAC, its address and route; still a port of br0,
    // which it leaves when the netns removal takes both (a port's removal alone waits for an RCU grace period)
    const veth = atDel!.links.find((l) => l.name === 'virtlet-eth0')!;
    expect(veth.mac).toBe(i0.vmMac);
    expect(veth.master).toBe('br0');
    expect(veth.addrs4.map((a) => `${a.local}/${a.prefixlen}`)).toEqual([ip.address]);
    expect(
      atDel!.routes4.filter((r) => r.dev === 'virtlet-eth0' && r.protocol !== 'kernel').map((r) => [r.dst, r.gateway]),
    ).toEqual([['default', ctx.net.gateway]]);
    // tap0 and br0 go with the netns (undo ops marked withNetns), after CNI DEL
    expect(atDel!.links.map((l) => l.name).sort()).toEqual(['br0', 'lo', 'tap0', 'virtlet-eth0']);
    await expectNothingLeft(ctx, fds);
    expect(pn.state(ctx.key)).toBeUndefined();
    await expect(pn.release(ctx.key)).rejects.toMatchObject({
      code: 'NOT_FOUND',
      message: `no pod network for key ${ctx.key}`,
    });
  });

  it('refuses a bad key before anything is created', async () => {
    const ctx = await setup();
    const pn = ctx.make();
    await expect(pn.add('../evil', desc('x'))).rejects.toMatchObject({ code: 'BAD_KEY' });
    await expect(pn.add('a b', desc('x'))).rejects.toMatchObject({ code: 'BAD_KEY' });
    expect(new StateStore(ctx.stateDir).keys()).toEqual([]);
    expect(await ctx.net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
  });

  it('whileApplying sees the pod network as it will be, while its links are applied; its throw rolls the add back', async () => {
    const ctx = await setup();
    const pn = ctx.make();
    let seen: { links: string[]; csnIfs: number; fds: number } | undefined;
    const st = await pn.add(ctx.key, desc(ctx.key), undefined, {
      whileApplying: (pre) => {
        seen = {
          links: pre.interfaces.map((i) => `${i.bridgeName}/${i.tapName}`),
          csnIfs: pre.csn.Interfaces.length,
          fds: pre.fds.length,
        };
      },
    });
    expect(seen).toEqual({ links: ['br0/tap0'], csnIfs: 1, fds: 0 });
    expect(st.fds).toHaveLength(1);
    await pn.release(ctx.key);

    const key2 = `${ctx.key}b`;
    await expect(
      pn.add(key2, desc(key2), undefined, {
        whileApplying: () => {
          throw new Error('no DHCP for you');
        },
      }),
    ).rejects.toMatchObject({
      op: 'dhcp',
      message: expect.stringMatching(new RegExp(`^add ${key2}: step "dhcp" failed: no DHCP for you`)),
    });
    expect(existsSync(join(NETNS_DIR, key2))).toBe(false);
    expect(pn.keys()).toEqual([]);
    expect(await ctx.net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
  });

  it('a failing plugin rolls everything back, and the error names the step', async () => {
    const ctx = await setup({ failingPlugin: true });
    const pn = ctx.make();
    let err: unknown;
    try {
      await pn.add(ctx.key, desc(ctx.key));
    } catch (e) {
      err = e;
    }
    expect(isVmpodError(err)).toBe(true);
    const e = err as Error & { op?: string; code?: string };
    expect(e.op).toBe('cni-add');
    expect(e.message).toMatch(
      new RegExp(`^add ${ctx.key}: step "cni-add" failed: .*code 100.*fake failure for the test`),
    );
    await expectNothingLeft(ctx, []);
    expect(pn.keys()).toEqual([]);
  });

  it.each([[Binding.Bridge], ['auto' as const]])(
    '%s: a failure after the container side was built undoes it (veth restored), then CNI DEL and netns removal',
    async (binding) => {
      const ctx = await setup({ binding });
      // make the tap's open fail: right after the CNI ADD, something else holds every queue the pod's tap can have, so
      // add gives up once the whole container side is built
      const nsPath = join(NETNS_DIR, ctx.key);
      let atDel: Awaited<ReturnType<typeof netnsState>> | undefined;
      let pluginMac: string | undefined;
      let held: number[] = [];
      const pn = ctx.make(
        (real) =>
          ({
            addDeferred: async (...a: Parameters<CniClient['addDeferred']>) => {
              const r = await real.addDeferred(...a);
              pluginMac = r.result.interfaces?.find((i) => i.sandbox)?.mac;
              held = await holdAllQueues(nsPath, 'tap0');
              return r;
            },
            locate: real.locate.bind(real),
            cachedNetworks: real.cachedNetworks.bind(real),
            del: async (...a: Parameters<CniClient['del']>) => ((atDel = await netnsState(ctx.key)), real.del(...a)),
          }) as unknown as CniClient,
      );
      let err: (Error & { op?: string }) | undefined;
      try {
        await pn.add(ctx.key, desc(ctx.key));
      } catch (e) {
        err = e as Error;
      } finally {
        for (const fd of held) native().close(fd);
      }
      expect(held).toHaveLength(256);
      expect(err?.op).toBe('open-tap');
      expect(err?.message).toMatch(
        new RegExp(`^add ${ctx.key}: step "open-tap" failed: open tap tap0 in ${nsPath}: .*E2BIG`),
      );
      const veth = atDel!.links.find((l) => l.name === 'virtlet-eth0')!;
      // the MAC the plugin gave it is back (ours, swapped in by the container side, is gone)
      expect(pluginMac).toMatch(/^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/);
      expect(veth.mac).toBe(pluginMac);
      expect(veth.addrs4).toHaveLength(1);
      expect(atDel!.routes4.filter((r) => r.dev === 'virtlet-eth0' && r.dst === 'default')).toHaveLength(1);
      // the bridge binding's veth leaves the bridge with the netns; tc-redirect's qdisc goes before the DEL
      expect(veth.master).toBe(binding === Binding.Bridge ? 'br0' : undefined);
      await expectNothingLeft(ctx, []);
    },
  );

  it('restore() undoes a record left in phase adding by a crash halfway', async () => {
    const ctx = await setup();
    const nsPath = join(NETNS_DIR, ctx.key);
    // a real partial add: netns, CNI ADD, the bridge made, the tap recorded but never made
    const store = new StateStore(ctx.stateDir);
    const steps = [netnsStep(ctx.key), cniAddStep('virtlet-eth0')];
    await execa('ip', ['netns', 'add', ctx.key]);
    const cni = new CniClient({ binDirs: ctx.net.binDirs, cacheDir: ctx.net.cacheDir });
    const list = await loadConfList(ctx.net.confDir);
    const result = await cni.add(list, {
      containerId: ctx.key,
      netns: nsPath,
      ifName: 'virtlet-eth0',
      args: [
        ['IgnoreUnknown', '1'],
        ['K8S_POD_NAMESPACE', 'default'],
        ['K8S_POD_NAME', `vm-${ctx.key}`],
        ['K8S_POD_INFRA_CONTAINER_ID', ctx.key],
      ],
    });
    const plan = planContainerSide({
      observed: await netnsState(ctx.key),
      result,
      newMac: () => randomLaaMac(),
      bindingOf: () => Binding.Bridge,
    });
    const upTo = plan.steps.findIndex((s) => s.name === 'tap');
    const applied = plan.steps.slice(0, upTo);
    const lines = applied.flatMap((s) =>
      s.do.filter((o) => o.op === 'ip').map((o) => (o as { args: string[] }).args.join(' ')),
    );
    await execa('ip', ['-n', ctx.key, '-batch', '-'], { input: `${lines.join('\n')}\n` });
    store.write({
      kind: RECORD_KIND,
      key: ctx.key,
      desc: desc(ctx.key),
      nsPath,
      phase: 'adding',
      steps: [...steps, ...plan.steps.slice(0, upTo + 1)],
      cniIfNames: ['virtlet-eth0'],
      interfaces: [],
      createdAt: new Date().toISOString(),
    });
    const before = await netnsState(ctx.key);
    expect(before.links.map((l) => l.name)).toContain('br0');
    expect((await ctx.net.leftovers()).allocations).toHaveLength(1);

    const pn = ctx.make();
    expect(await pn.restore()).toEqual({ restored: [], rolledBack: [ctx.key], netnsMissing: [], quarantined: [] });
    await expectNothingLeft(ctx, []);
  });

  it('a new PodNetwork on the same state dir reopens the taps without touching the network', async () => {
    const ctx = await setup();
    const pn1 = ctx.make();
    const st1 = await pn1.add(ctx.key, desc(ctx.key));
    const oldFd = st1.fds[0]!;
    const before = shape(await netnsState(ctx.key));
    pn1.closeAll(); // daemon exit: fds closed, network stays
    expect(isTunFd(oldFd) && fdinfo(oldFd).includes('iff:\ttap0')).toBe(false);
    expect(shape(await netnsState(ctx.key))).toEqual(before);

    const pn2 = ctx.make();
    expect(await pn2.restore()).toEqual({ restored: [ctx.key], rolledBack: [], netnsMissing: [], quarantined: [] });
    const st2 = pn2.state(ctx.key)!;
    expect(st2.fds).toHaveLength(1);
    expect(fdinfo(st2.fds[0]!)).toContain('iff:\ttap0');
    expect(st2.csn).toEqual(st1.csn);
    expect(shape(await netnsState(ctx.key))).toEqual(before);
    // get on a state with fds returns them as they are
    expect((await pn2.ensureFds(ctx.key)).fds).toEqual(st2.fds);

    await pn2.release(ctx.key);
    await expectNothingLeft(ctx, st2.fds);
  });

  it('restore attaches a pod whose tap a running VM holds (queues attached) without fds; get reopens once it is free', async () => {
    const ctx = await setup();
    const pn1 = ctx.make();
    const st1 = await pn1.add(ctx.key, desc(ctx.key));
    // pn1 keeps its fd open, as qemu would keep the one it was handed
    const pn2 = ctx.make();
    expect(await pn2.restore()).toEqual({ restored: [ctx.key], rolledBack: [], netnsMissing: [], quarantined: [] });
    expect(pn2.state(ctx.key)!.fds).toEqual([]);
    const busy = await pn2.ensureFds(ctx.key).catch((e: unknown) => e as Error);
    expect(busy).toMatchObject({ code: 'CONFLICT', message: expect.stringContaining('in use (EBUSY)') });
    // the addon asked the tap's queues before it opened anything: pn1's one queue
    expect(errorChain(busy)).toContain('tap tap0 in /var/run/netns/');
    expect(errorChain(busy)).toContain('has 1 queue attached');
    pn1.closeAll();
    const st2 = await pn2.ensureFds(ctx.key);
    expect(fdinfo(st2.fds[0]!)).toContain('iff:\ttap0');
    await pn2.release(ctx.key);
    await expectNothingLeft(ctx, [...st1.fds, ...st2.fds]);
  });

  it('recover re-attaches from the csn alone (no record), without CNI ADD; release then cleans up', async () => {
    const ctx = await setup();
    const pn1 = ctx.make();
    const st1 = await pn1.add(ctx.key, desc(ctx.key));
    const before = shape(await netnsState(ctx.key));
    pn1.closeAll();
    new StateStore(ctx.stateDir).remove(ctx.key); // a runtime that only has the csn

    const pn2 = ctx.make();
    const st2 = await pn2.recover(ctx.key, {
      podNetworkDesc: desc(ctx.key),
      csn: st1.csn,
      HaveRunningContainers: true,
    });
    expect(st2.interfaces).toEqual(st1.interfaces);
    expect(fdinfo(st2.fds[0]!)).toContain('iff:\ttap0');
    expect(shape(await netnsState(ctx.key))).toEqual(before);
    expect(new StateStore(ctx.stateDir).read(ctx.key)!.phase).toBe('ready');
    expect((await ctx.net.leftovers()).allocations).toHaveLength(1);

    await pn2.release(ctx.key);
    await expectNothingLeft(ctx, st2.fds);
  });

  it('recover of a key without a netns is NotFound', async () => {
    const ctx = await setup();
    const pn = ctx.make();
    await expect(
      pn.recover(ctx.key, {
        podNetworkDesc: desc(ctx.key),
        csn: { Result: null, NsPath: '', Interfaces: [] },
        HaveRunningContainers: false,
      }),
    ).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });
});
