// SR-IOV VFs in the pod network, against the real kernel and a fake sysfs tree. A fake CNI plugin stands in for
// sriov-cni: its ADD makes a netdev in the pod netns named CNI_IFNAME (dummy, or ifb where the kernel has no
// dummy driver), and the fake tree maps that name to a VF (class/net/<if>/device -> the VF, physfn -> the PF).
// A FakeSysfs subclass plays the kernel's part (driver links, the netdev that comes and goes with the driver);
// the PF commands go to a recorder, as a dummy PF takes no `vf N mac`.
import { describe, it, expect, afterEach } from 'vitest';
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';
import { PodNetwork } from '../../src/podnet/index.js';
import { StateStore } from '../../src/state/store.js';
import { CniClient, loadConfList } from '../../src/cni/index.js';
import { silentLogger } from '../../src/log.js';
import { macToBase64 } from '../../src/protocol/mac.js';
import { getInfos } from '../../src/tapmanager/service.js';
import { FakeSysfs, makeFakeSysfs, type FakeSysfsTree } from '../helpers/fakesysfs.js';
import { listLinks, listNetns, uniqueName } from '../helpers/netns.js';

const NETNS_DIR = '/var/run/netns';
const PF = '0000:3b:00.0';
const VF = '0000:3b:02.1';
/** the name the "kernel" gives the VF's netdev when its driver is back (host netns) */
const KERNEL_NAME = 'eth7';
/** Linux O_CLOEXEC (asm-generic/fcntl.h), as /proc/<pid>/fdinfo prints flags: octal */
const O_CLOEXEC = 0o2000000;

/** The kernel's side of binding, on the fake tree: the VF's netdev goes with its driver and comes back with it. */
class KernelSysfs extends FakeSysfs {
  constructor(
    tree: FakeSysfsTree,
    private readonly events: string[],
    private readonly vfDriver: string,
  ) {
    super(tree);
  }

  override write(rel: string, data: string): void {
    this.events.push(`sysfs ${rel} ${JSON.stringify(data)}`);
    super.write(rel, data);
    const net = this.tree.p(`bus/pci/devices/${VF}/net`);
    if (rel === `bus/pci/devices/${VF}/driver/unbind`) rmSync(net, { recursive: true, force: true });
    const override = this.tree.read(`bus/pci/devices/${VF}/driver_override`).trim();
    if (rel === 'bus/pci/drivers_probe' && data === VF && this.tree.driverOf(VF) === undefined && override === '') {
      // driver_override cleared: the probe finds the VF's own driver, which registers a new netdev
      this.tree.setDriver(VF, this.vfDriver);
      mkdirSync(join(net, KERNEL_NAME), { recursive: true });
    }
  }
}

function pluginScript(mac: string): string {
  return `#!/bin/bash
# fake SR-IOV CNI plugin (see the test file). Absolute paths: the CNI environment has no PATH.
while IFS= read -r _l; do :; done
ns="\${CNI_NETNS##*/}"
case "$CNI_COMMAND" in
  ADD)
    /bin/ip -n "$ns" link add name "$CNI_IFNAME" address ${mac} type dummy 2>/dev/null ||
      /bin/ip -n "$ns" link add name "$CNI_IFNAME" address ${mac} type ifb || {
        printf '{"cniVersion":"1.0.0","code":999,"msg":"cannot create the stand-in VF netdev"}'; exit 1; }
    /bin/ip -n "$ns" link set dev "$CNI_IFNAME" up
    printf '{"cniVersion":"1.0.0","interfaces":[{"name":"%s","mac":"${mac}","sandbox":"%s"}],"ips":[{"address":"192.0.2.10/24","gateway":"192.0.2.1","interface":0}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{}}' "$CNI_IFNAME" "$CNI_NETNS"
    ;;
  DEL)
    [ -e "$CNI_NETNS" ] && /bin/ip -n "$ns" link del dev "$CNI_IFNAME" 2>/dev/null
    exit 0
    ;;
  VERSION) printf '%s' '{"cniVersion":"1.0.0","supportedVersions":["0.3.1","0.4.0","1.0.0"]}' ;;
esac
`;
}

interface Ctx {
  key: string;
  ifName: string;
  pfName: string;
  mac: string;
  root: string;
  stateDir: string;
  cacheDir: string;
  tree: FakeSysfsTree;
  sysfs: KernelSysfs;
  events: string[];
  /** stdout the recorder gives `ip -d -j link show dev <pf>` */
  pfJson: string;
  /** argv (joined) the recorder fails, with a message */
  failing: Map<string, string>;
  make(opts?: { enableSriov?: boolean }): PodNetwork;
  nets: PodNetwork[];
}

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function setup(opts: { pluginType?: string; vlan?: number } = {}): Promise<Ctx> {
  const id = randomBytes(4).toString('hex');
  const key = `vmpsr-${id}`;
  const ifName = uniqueName('vmpsv');
  const pfName = uniqueName('vmpsp');
  const mac = `5a:${randomBytes(5).toString('hex').match(/../g)!.join(':')}`;
  const root = mkdtempSync(join(tmpdir(), 'vmpod-sriov-'));
  const bin = join(root, 'bin');
  const confDir = join(root, 'net.d');
  const cacheDir = join(root, 'cache');
  const stateDir = join(root, 'state');
  for (const d of [bin, confDir, cacheDir]) mkdirSync(d, { recursive: true });
  const type = opts.pluginType ?? 'vmpod-test-vf';
  writeFileSync(join(bin, type), pluginScript(mac));
  chmodSync(join(bin, type), 0o755);
  const plugin = { type, ...(opts.vlan !== undefined ? { vlan: opts.vlan } : {}) };
  writeFileSync(
    join(confDir, '10-sriov.conflist'),
    JSON.stringify({ cniVersion: '1.0.0', name: `vmpsr-${id}`, plugins: [plugin] }),
  );

  const tree = makeFakeSysfs();
  tree.addPci({ address: PF, driver: 'ice', iommuGroup: '40', net: [{ ifname: pfName, mac: '3c:fd:fe:00:00:01' }] });
  tree.addPci({
    address: VF,
    driver: 'iavf',
    iommuGroup: '77',
    physfn: PF,
    vfIndex: 1,
    net: [{ ifname: ifName, mac }],
  });
  tree.ensureDriver('vfio-pci');
  tree.ensureDriver('iavf');

  const events: string[] = [];
  const nets: PodNetwork[] = [];
  const sysfs = new KernelSysfs(tree, events, 'iavf');
  const ctx: Ctx = {
    key,
    ifName,
    pfName,
    mac,
    root,
    stateDir,
    cacheDir,
    tree,
    sysfs,
    events,
    nets,
    pfJson: '[]',
    failing: new Map(),
    make(o = {}) {
      const real = new CniClient({ binDirs: [bin], cacheDir });
      const cni = {
        addDeferred: real.addDeferred.bind(real),
        locate: real.locate.bind(real),
        cachedNetworks: real.cachedNetworks.bind(real),
        // the DEL's plugins act once they have their config: when its hold lets go (it is started early)
        del: async (...a: Parameters<CniClient['del']>) => {
          void (a[3]?.until ?? Promise.resolve()).then(() => events.push('cni-del'));
          return real.del(...a);
        },
      } as unknown as CniClient;
      const pn = new PodNetwork({
        stateDir,
        cni,
        loadConfList: () => loadConfList(confDir),
        log: silentLogger(),
        ifNamePrefix: ifName,
        enableSriov: o.enableSriov ?? true,
        sysfs,
        vfLink: async (argv) => {
          const line = argv.join(' ');
          events.push(line);
          const f = ctx.failing.get(line);
          if (f !== undefined) throw new Error(`${line}: ${f}`);
          return argv.includes('show') ? ctx.pfJson : '';
        },
        vfNetdevTimeoutMs: 500,
      });
      nets.push(pn);
      return pn;
    },
  };
  cleanups.push(async () => {
    for (const pn of nets) pn.closeAll();
    if (existsSync(join(NETNS_DIR, key))) await execa('ip', ['netns', 'del', key], { reject: false });
    tree.cleanup();
    rmSync(root, { recursive: true, force: true });
    expect(
      (await listNetns()).filter((n) => n === key),
      'netns left',
    ).toEqual([]);
    expect(
      (await listLinks()).filter((l) => l === ifName || l === pfName),
      'links left',
    ).toEqual([]);
  });
  return ctx;
}

const desc = (key: string) => ({ podId: `uid-${key}`, podNs: 'default', podName: `vm-${key}`, DNS: null });

async function podLinks(key: string): Promise<string[]> {
  return (await listLinks(key)).sort();
}

function filesUnder(dir: string): string[] {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => !e.isDirectory())
    .map((e) => join(e.parentPath, e.name));
}

function isDevNull(fd: number): boolean {
  try {
    return readlinkSync(`/proc/self/fd/${fd}`) === '/dev/null';
  } catch {
    return false;
  }
}

async function expectNothingLeft(ctx: Ctx, fds: number[]) {
  expect(existsSync(join(NETNS_DIR, ctx.key)), 'netns').toBe(false);
  expect(new StateStore(ctx.stateDir).keys(), 'records').toEqual([]);
  expect(filesUnder(ctx.cacheDir), 'CNI cache').toEqual([]);
  expect(await listLinks(), 'host links').not.toContain(ctx.ifName);
  for (const fd of fds) expect(isDevNull(fd), `fd ${fd} still open`).toBe(false);
}

const bindWrites = [
  `sysfs bus/pci/devices/${VF}/driver/unbind "${VF}"`,
  `sysfs bus/pci/devices/${VF}/driver_override "vfio-pci"`,
  `sysfs bus/pci/drivers_probe "${VF}"`,
];
const restoreWrites = [
  `sysfs bus/pci/devices/${VF}/driver/unbind "${VF}"`,
  `sysfs bus/pci/devices/${VF}/driver_override "\\n"`,
  `sysfs bus/pci/drivers_probe "${VF}"`,
];

describe('PodNetwork with SR-IOV VFs (fake sysfs tree, real netns and CNI exec)', () => {
  it('add binds the VF to vfio-pci, sets MAC/VLAN on the PF, reports type 1; release restores all before CNI DEL', async () => {
    const ctx = await setup();
    const pn = ctx.make();
    const st = await pn.add(ctx.key, desc(ctx.key));
    const fds = [...st.fds];

    // csn and get: Virtlet's shape, the full PCI address, one fd (/dev/null) for the VF
    expect(st.csn.Interfaces).toEqual([
      {
        Type: 1,
        Name: ctx.ifName,
        HardwareAddr: macToBase64(ctx.mac),
        PCIAddress: VF,
        MTU: 1500,
        VlanID: 0,
        mac: ctx.mac,
      },
    ]);
    expect(getInfos(st)).toEqual([{ type: 1, mac: macToBase64(ctx.mac), fdIndex: 0, pciAddress: VF }]);
    expect(fds).toHaveLength(1);
    expect(isDevNull(fds[0]!)).toBe(true);
    const flags = parseInt(/flags:\s*([0-7]+)/.exec(readFileSync(`/proc/self/fdinfo/${fds[0]!}`, 'utf8'))![1]!, 8);
    expect(flags & 3, 'O_RDONLY').toBe(0);
    expect(flags & O_CLOEXEC, 'O_CLOEXEC').toBe(O_CLOEXEC);

    // the host side: the PF asked first, the VF bound to vfio-pci through driver_override, then MAC/VLAN on the PF
    expect(ctx.events).toEqual([
      `ip -d -j link show dev ${ctx.pfName}`,
      ...bindWrites,
      `ip link set ${ctx.pfName} vf 1 mac ${ctx.mac} vlan 0`,
    ]);
    expect(ctx.tree.driverOf(VF)).toBe('vfio-pci');
    expect(ctx.tree.read(`bus/pci/devices/${VF}/driver_override`)).toBe('vfio-pci');
    // no bridge, no tap: the (stand-in) netdev is left as it is
    expect(await podLinks(ctx.key)).toEqual([ctx.ifName, 'lo'].sort());

    const vf = {
      kind: 'vmpodVfSetupV1',
      ifname: ctx.ifName,
      pfIfname: ctx.pfName,
      vfIndex: 1,
      address: VF,
      originalDriver: 'iavf',
      originalMac: ctx.mac,
      originalVlan: 0,
      mac: ctx.mac,
      vlan: 0,
    };
    expect(st.interfaces).toEqual([
      {
        index: 0,
        cniName: ctx.ifName,
        type: 'vf',
        vmMac: ctx.mac,
        mtu: 1500,
        tapName: '',
        bridgeName: '',
        bridgeIp: '',
        pciAddress: VF,
        vlanId: 0,
        vf,
      },
    ]);
    const rec = new StateStore(ctx.stateDir).read(ctx.key)!;
    expect(rec.phase).toBe('ready');
    expect(rec.interfaces).toEqual(st.interfaces);
    // the tap made while the plugin ran (for tc-redirect, what a plugin that makes neither a NIC nor a VLAN with IPv4
    // most likely gets) is deleted again: the interface is a VF
    expect(rec.steps.map((s) => s.name)).toEqual([
      'netns',
      'rp-filter',
      'lo-up',
      'tap',
      'cni-add',
      'ipv6-off',
      'drop-prepared',
      'vf-setup',
    ]);
    expect(rec.steps[7]).toEqual({
      name: 'vf-setup',
      target: ctx.ifName,
      do: [
        { op: 'vf-bind', address: VF },
        { op: 'vf-link', pf: ctx.pfName, vf: 1, mac: ctx.mac, vlan: 0 },
      ],
      undo: [
        { op: 'vf-restore-driver', address: VF, driver: 'iavf' },
        { op: 'vf-link', pf: ctx.pfName, vf: 1, mac: ctx.mac, vlan: 0 },
        { op: 'vf-netdev-return', address: VF, name: ctx.ifName },
      ],
    });

    ctx.events.length = 0;
    await pn.release(ctx.key);
    expect(ctx.events).toEqual([
      ...restoreWrites,
      `ip link set ${ctx.pfName} vf 1 mac ${ctx.mac} vlan 0`,
      `ip link set dev ${KERNEL_NAME} netns ${ctx.key} name ${ctx.ifName}`,
      'cni-del',
    ]);
    expect(ctx.tree.driverOf(VF)).toBe('iavf');
    await expectNothingLeft(ctx, fds);
  });

  it('without --enable-sriov a VF is a clear error, and the add is rolled back without touching the VF', async () => {
    const ctx = await setup();
    const pn = ctx.make({ enableSriov: false });
    const err = await pn.add(ctx.key, desc(ctx.key)).then(
      () => undefined,
      (e: unknown) => e as Error & { code?: string; op?: string },
    );
    expect(err?.code).toBe('DEVICE');
    expect(err?.op).toBe('plan');
    expect(err?.message).toBe(
      `add ${ctx.key}: step "plan" failed: interface ${ctx.ifName} is an SR-IOV VF; SR-IOV support is not enabled (tapmanager --enable-sriov, env VIRTLET_SRIOV_SUPPORT=true)`,
    );
    expect(ctx.events).toEqual(['cni-del']);
    expect(ctx.tree.driverOf(VF)).toBe('iavf');
    await expectNothingLeft(ctx, []);
  });

  it("VLAN from sriov-cni's config; the PF's vfinfo gives the MAC and VLAN to restore", async () => {
    const ctx = await setup({ pluginType: 'sriov', vlan: 100 });
    ctx.pfJson = JSON.stringify([
      {
        ifname: ctx.pfName,
        vfinfo_list: [
          { vf: 0, address: '00:00:00:00:00:00' },
          { vf: 1, address: '00:00:00:00:00:00', vlan_list: [{ vlan: 12 }] },
        ],
      },
    ]);
    const pn = ctx.make();
    const st = await pn.add(ctx.key, desc(ctx.key));
    expect(st.csn.Interfaces[0]).toMatchObject({ Type: 1, PCIAddress: VF, VlanID: 100 });
    expect(st.interfaces[0]!.vf).toMatchObject({
      originalMac: '00:00:00:00:00:00',
      originalVlan: 12,
      mac: ctx.mac,
      vlan: 100,
    });
    expect(ctx.events.at(-1)).toBe(`ip link set ${ctx.pfName} vf 1 mac ${ctx.mac} vlan 100`);
    ctx.events.length = 0;
    await pn.release(ctx.key);
    expect(ctx.events).toContain(`ip link set ${ctx.pfName} vf 1 mac 00:00:00:00:00:00 vlan 12`);
    await expectNothingLeft(ctx, st.fds);
  });

  it('a VF that vfio-pci does not take: add fails at vf-setup and is rolled back (driver, PF, netdev, CNI DEL)', async () => {
    const ctx = await setup();
    const pn = ctx.make();
    ctx.sysfs.probe = 'nothing'; // vfio-pci not loaded: the probe binds nothing
    const err = await pn.add(ctx.key, desc(ctx.key)).then(
      () => undefined,
      (e: unknown) => e as Error & { code?: string; op?: string },
    );
    expect(err?.op).toBe('vf-setup');
    expect(err?.message).toMatch(
      new RegExp(`^add ${ctx.key}: step "vf-setup" on ${ctx.ifName} failed: .*is the vfio-pci module loaded`),
    );
    const at = ctx.events.indexOf(`sysfs bus/pci/devices/${VF}/driver_override "\\n"`);
    expect(ctx.events.slice(at)).toEqual([
      `sysfs bus/pci/devices/${VF}/driver_override "\\n"`,
      `sysfs bus/pci/drivers_probe "${VF}"`,
      `ip link set ${ctx.pfName} vf 1 mac ${ctx.mac} vlan 0`,
      `ip link set dev ${KERNEL_NAME} netns ${ctx.key} name ${ctx.ifName}`,
      'cni-del',
    ]);
    expect(ctx.tree.driverOf(VF)).toBe('iavf');
    await expectNothingLeft(ctx, []);
  });

  it('release keeps undoing past a failing step, reports it, keeps the record; a retry finishes', async () => {
    const ctx = await setup();
    const pn = ctx.make();
    const st = await pn.add(ctx.key, desc(ctx.key));
    const restore = `ip link set ${ctx.pfName} vf 1 mac ${ctx.mac} vlan 0`;
    ctx.failing.set(restore, 'RTNETLINK answers: Operation not supported');
    ctx.events.length = 0;
    await expect(pn.release(ctx.key)).rejects.toMatchObject({
      code: 'DEVICE',
      message: expect.stringMatching(
        new RegExp(
          `^release ${ctx.key}: 1 undo step\\(s\\) failed.*restore MAC ${ctx.mac} VLAN 0 on VF 1 of ${ctx.pfName}.*Operation not supported`,
        ),
      ),
    });
    // the steps after the failing one ran all the same
    expect(ctx.events.slice(3)).toEqual([
      restore,
      `ip link set dev ${KERNEL_NAME} netns ${ctx.key} name ${ctx.ifName}`,
      'cni-del',
    ]);
    expect(new StateStore(ctx.stateDir).read(ctx.key)!.phase).toBe('releasing');

    ctx.failing.clear();
    ctx.events.length = 0;
    await pn.release(ctx.key);
    // the driver is back already: only the override is cleared and the probe repeated
    expect(ctx.events.slice(0, 3)).toEqual([
      `sysfs bus/pci/devices/${VF}/driver_override "\\n"`,
      `sysfs bus/pci/drivers_probe "${VF}"`,
      restore,
    ]);
    await expectNothingLeft(ctx, st.fds);
  });

  it('a VF (and its PF) gone before release: nothing to restore, release still completes', async () => {
    const ctx = await setup();
    const pn = ctx.make();
    const st = await pn.add(ctx.key, desc(ctx.key));
    rmSync(ctx.tree.p(`bus/pci/devices/${VF}`), { recursive: true, force: true });
    rmSync(ctx.tree.p(`class/net/${ctx.pfName}`), { recursive: true, force: true });
    const restore = `ip link set ${ctx.pfName} vf 1 mac ${ctx.mac} vlan 0`;
    ctx.failing.set(restore, `Cannot find device "${ctx.pfName}"`);
    ctx.events.length = 0;
    await pn.release(ctx.key);
    expect(ctx.events).toEqual([restore, 'cni-del']);
    await expectNothingLeft(ctx, st.fds);
  });

  it('a restarted daemon reattaches a VF pod (fd: /dev/null) without touching the VF', async () => {
    const ctx = await setup();
    const pn1 = ctx.make();
    const st1 = await pn1.add(ctx.key, desc(ctx.key));
    pn1.closeAll();
    expect(isDevNull(st1.fds[0] ?? -1)).toBe(false);
    ctx.events.length = 0;

    const pn2 = ctx.make();
    expect(await pn2.restore()).toEqual({ restored: [ctx.key], rolledBack: [], netnsMissing: [], quarantined: [] });
    const st2 = await pn2.ensureFds(ctx.key);
    expect(st2.fds).toHaveLength(1);
    expect(isDevNull(st2.fds[0]!)).toBe(true);
    expect(st2.csn).toEqual(st1.csn);
    expect(ctx.events).toEqual([]);
    expect(ctx.tree.driverOf(VF)).toBe('vfio-pci');
    // recover of a VF pod without its record cannot know what release must restore: refused, nothing changed
    const store = new StateStore(ctx.stateDir);
    const rec = store.read(ctx.key)!;
    store.remove(ctx.key);
    const pn3 = ctx.make();
    await expect(
      pn3.recover(ctx.key, { podNetworkDesc: desc(ctx.key), csn: st1.csn, HaveRunningContainers: true }),
    ).rejects.toMatchObject({
      code: 'DEVICE',
      message: `recover ${ctx.key}: interface ${ctx.ifName} is an SR-IOV VF (${VF}); its original driver, MAC and VLAN are in the state record only, and there is none`,
    });
    expect(store.keys()).toEqual([]);
    store.write(rec);
    expect(ctx.events).toEqual([]);

    await pn2.release(ctx.key);
    expect(ctx.events.at(-1)).toBe('cni-del');
    expect(ctx.tree.driverOf(VF)).toBe('iavf');
    await expectNothingLeft(ctx, st2.fds);
  });
});
