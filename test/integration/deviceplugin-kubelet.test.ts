// vfio-device-plugin as kubelet sees it: the built program on fake sysfs and /dev trees, a fake kubelet (Registration
// server + DevicePlugin client on the API's .proto) in a temp device-plugins dir. Every rule of the plugin, through
// its sockets and its logs. Waits are generous (the machine running the tests may be busy); no timing is asserted:
// the 2 s bound of a list update is the 1 s tick (test/unit/deviceplugin-rules.test.ts).
import { spawn, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import * as grpc from '@grpc/grpc-js';
import { cdiRequests, loadCdiRegistry, validateSpec } from '../../src/devices/index.js';
import { startFakeDpKubelet, waitFor, type FakeDpKubelet } from '../helpers/fakedpkubelet.js';
import {
  DP_BIN,
  makeDpNode,
  removePci,
  setNuma,
  startPlugin,
  writeConfig,
  type DpNode,
  type RunningPlugin,
} from '../helpers/dpplugin.js';

const QAT = 'vendor.example/qat';
const CX7 = 'vendor.example/cx7';
const CONFIG = `# two resources: QAT VFs one per function, the ConnectX cards one per IOMMU group
- resourceName: ${QAT}
  vendors: ["8086"]
  devices: ["4941"]
- resourceName: ${CX7}
  devices: ["101e"]
  unit: group
`;

let node: DpNode | undefined;
let kubelet: FakeDpKubelet | undefined;
let plugin: RunningPlugin | undefined;
afterEach(async () => {
  if (plugin) {
    const r = await plugin.stop();
    expect(r.code, plugin.stderr).toBe(0);
  }
  plugin = undefined;
  kubelet?.close();
  kubelet = undefined;
  node?.cleanup();
  node = undefined;
});

async function setup(
  o: { config?: string; configName?: string; args?: string[]; startKubelet?: boolean; devRoot?: string } = {},
) {
  node = makeDpNode();
  kubelet = await startFakeDpKubelet({ start: o.startKubelet !== false });
  const cfg = writeConfig(node.dir, o.configName ?? 'dp.yaml', o.config ?? CONFIG);
  const cdiDir = path.join(node.dir, 'cdi');
  plugin = startPlugin({
    args: ['--config', cfg, '--kubelet-dir', kubelet.dir, '--cdi-dir', cdiDir, ...(o.args ?? [])],
    env: { VMPOD_SYSFS_ROOT: node.tree.root, VMPOD_DEV_ROOT: o.devRoot ?? node.host.root },
  });
  return { node, kubelet, plugin, cdiDir };
}

const ids = (l: { ID: string }[]) => l.map((d) => d.ID);
const healthOf = (l: { ID: string; health: string }[], id: string) => l.find((d) => d.ID === id)?.health;

describe('registration and the device lists', { timeout: 180_000 }, () => {
  it('registers each resource on its own socket, v1beta1, with GetPreferredAllocation offered', async () => {
    const { kubelet: k } = await setup();
    const [qat] = await k.registered(QAT);
    const [cx7] = await k.registered(CX7);
    expect(qat).toEqual({
      version: 'v1beta1',
      endpoint: 'vmpod-vfio_vendor.example_qat.sock',
      resource_name: QAT,
      options: { pre_start_required: false, get_preferred_allocation_available: true },
    });
    expect(cx7!.endpoint).toBe('vmpod-vfio_vendor.example_cx7.sock');
    expect(fs.existsSync(path.join(k.dir, qat!.endpoint))).toBe(true);
    const c = await k.plugin(QAT);
    expect(await c.options()).toEqual({ pre_start_required: false, get_preferred_allocation_available: true });
    expect(await c.preStart(['0000:3d:02.1'])).toEqual({});
  });

  it('IDs per unit, NUMA topology, health with group viability; a no-IOMMU group is never offered', async () => {
    // 0000:3d:02.5 on vfio-pci in vfio's no-IOMMU group 81
    const n = makeDpNodeWith((t) => {
      t.addPci({
        address: '0000:3d:02.5',
        class: 0x0b4000,
        vendor: '0x8086',
        device: '0x4941',
        driver: 'vfio-pci',
        iommuGroup: '81',
      }).markNoiommu('81');
      setNuma(t, '0000:3d:02.5', 0);
    });
    const { kubelet: k, plugin: p } = await setupOn(n);
    const qat = await (await k.plugin(QAT)).nextList((l) => l.length > 0);
    expect(qat).toEqual([
      { ID: '0000:3d:02.1', health: 'Healthy', topology: { nodes: [{ ID: 0 }] } },
      { ID: '0000:3d:02.2', health: 'Healthy', topology: { nodes: [{ ID: 0 }] } },
      { ID: '0000:3d:02.3', health: 'Healthy', topology: { nodes: [{ ID: 1 }] } },
      { ID: '0000:3d:02.4', health: 'Unhealthy', topology: { nodes: [{ ID: 1 }] } },
    ]);
    // group 42: two functions and a bridge on pcieport (exempt); group 70: a member on the host's ixgbe
    const cx7 = await (await k.plugin(CX7)).nextList((l) => l.length > 0);
    expect(cx7).toEqual([
      { ID: 'iommu-group-42', health: 'Healthy', topology: { nodes: [{ ID: 1 }] } },
      { ID: 'iommu-group-70', health: 'Unhealthy', topology: { nodes: [{ ID: 0 }] } },
    ]);
    const [notOffered] = await p.waitLog(/^not offered: 0000:3d:02\.5/);
    expect(notOffered!.msg).toMatch(/no-IOMMU group 81/);
  });

  it('a function without a NUMA node (-1) has no topology', async () => {
    const { kubelet: k, node: n } = await setup();
    setNuma(n.tree, '0000:3d:02.2', -1);
    const l = await (await k.plugin(QAT)).nextList((x) => x.find((d) => d.ID === '0000:3d:02.2')?.topology === null);
    expect(l.find((d) => d.ID === '0000:3d:02.1')!.topology).toEqual({ nodes: [{ ID: 0 }] });
  });

  it('sends the whole list again after a rebind, a removal, and VFs created', async () => {
    const { kubelet: k, node: n } = await setup();
    const c = await k.plugin(QAT);
    await c.nextList((l) => l.length === 4);
    n.tree.setDriver('0000:3d:02.2', 'qat_4xxx'); // rebind away from vfio
    expect(healthOf(await c.nextList((l) => healthOf(l, '0000:3d:02.2') === 'Unhealthy'), '0000:3d:02.1')).toBe(
      'Healthy',
    );
    removePci(n.tree, '0000:3d:02.3', '63'); // removed
    expect(ids(await c.nextList((l) => !ids(l).includes('0000:3d:02.3')))).toEqual([
      '0000:3d:02.1',
      '0000:3d:02.2',
      '0000:3d:02.4',
    ]);
    // a VF created on its PF (sriov_numvfs), bound to vfio-pci
    n.tree.addPci({
      address: '0000:3d:00.0',
      class: 0x0b4000,
      vendor: '0x8086',
      device: '0x4940',
      driver: 'qat_4xxx',
      iommuGroup: '60',
    });
    n.tree.addPci({
      address: '0000:3d:02.6',
      class: 0x0b4000,
      vendor: '0x8086',
      device: '0x4941',
      driver: 'vfio-pci',
      iommuGroup: '66',
      physfn: '0000:3d:00.0',
      vfIndex: 5,
    });
    const l = await c.nextList((x) => ids(x).includes('0000:3d:02.6'));
    expect(healthOf(l, '0000:3d:02.6')).toBe('Healthy');
    // a group member leaving the host driver makes the group viable
    const g = await k.plugin(CX7);
    n.tree.setDriver('0000:70:00.1', undefined);
    expect(healthOf(await g.nextList((x) => healthOf(x, 'iommu-group-70') === 'Healthy'), 'iommu-group-42')).toBe(
      'Healthy',
    );
  });
});

describe('reasons: logged once per change, exported as a metric', { timeout: 180_000 }, () => {
  it('one line per change with the member, its driver and what to do; /metrics says the same', async () => {
    const { kubelet: k, node: n, plugin: p } = await setup({ args: ['--http-listen', '127.0.0.1:0'] });
    const [listening] = await p.waitLog(/^HTTP listening/);
    const url = `http://127.0.0.1:${listening!['port']}`;
    const c = await k.plugin(QAT);
    await c.nextList((l) => l.length === 4);
    const bad = /^device 0000:3d:02\.4 is unhealthy/;
    // several ticks pass: a change elsewhere is seen, the unchanged reason is not logged again
    n.tree.setDriver('0000:3d:02.2', undefined);
    await c.nextList((l) => healthOf(l, '0000:3d:02.2') === 'Unhealthy');
    n.tree.setDriver('0000:3d:02.2', 'vfio-pci');
    await c.nextList((l) => healthOf(l, '0000:3d:02.2') === 'Healthy');
    const lines = p.linesMatching(bad);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({
      resource: QAT,
      device: '0000:3d:02.4',
      reason: 'not-vfio',
      member: '0000:3d:02.4',
      driver: 'qat_4xxx',
    });
    expect(lines[0]!.msg).toMatch(
      /bound to qat_4xxx, not to a vfio driver: bind it to vfio-pci \(echo vfio-pci > .*driver_override/,
    );
    const metrics = await (await fetch(`${url}/metrics`)).text();
    expect(metrics).toContain(
      `vmpod_dp_device_unhealthy{resource="${QAT}",device="0000:3d:02.4",reason="not-vfio",member="0000:3d:02.4",driver="qat_4xxx"} 1`,
    );
    expect(metrics).toContain(
      `vmpod_dp_device_unhealthy{resource="${CX7}",device="iommu-group-70",reason="group-not-viable",member="0000:70:00.1",driver="ixgbe"} 1`,
    );
    expect(metrics).toContain(`vmpod_dp_devices{resource="${QAT}",health="Healthy"} 3`);
    expect(metrics).toContain('vmpod_dp_registered 1');
    // prom-client's process metrics under their standard names, as tapmanager's
    expect(metrics).toMatch(/^process_cpu_seconds_total /m);
    expect(metrics).not.toContain('vmpod_dp_process_');
    expect(await (await fetch(`${url}/healthz`)).text()).toBe('ok\n');
    // the DaemonSet's exec probes
    for (const path of ['/healthz', '/readyz'])
      expect(
        spawnSync(process.execPath, [DP_BIN, '--probe', path, '--http-listen', `127.0.0.1:${listening!['port']}`], {
          encoding: 'utf8',
        }).status,
        path,
      ).toBe(0);
    // the fix: one "healthy again" line, and the metric's series is gone
    n.tree.setDriver('0000:3d:02.4', 'vfio-pci');
    await c.nextList((l) => healthOf(l, '0000:3d:02.4') === 'Healthy');
    await p.waitLog(/^device 0000:3d:02\.4 is healthy again/);
    expect(await (await fetch(`${url}/metrics`)).text()).not.toContain('device="0000:3d:02.4"');
    expect(p.linesMatching(bad)).toHaveLength(1);
  });
});

describe('GetPreferredAllocation', { timeout: 180_000 }, () => {
  it('keeps a group together, takes the fewest groups, one NUMA node, always the must-include ones', async () => {
    const n = makeDpNodeWith((t) => {
      // a second two-function card, numa 0, in group 43, selected by function
      for (const a of ['0000:61:00.0', '0000:61:00.1']) {
        t.addPci({ address: a, vendor: '0x15b3', device: '0x101e', driver: 'vfio-pci', iommuGroup: '43' });
        setNuma(t, a, 0);
      }
    });
    const cfg = `[{"resourceName": "vendor.example/cx7fn", "devices": ["101e"], "pciAddresses": ["60:00.0", "60:00.1", "61:00.0", "61:00.1"]}]`;
    const { kubelet: k } = await setupOn(n, { config: cfg, configName: 'dp.json' });
    const c = await k.plugin('vendor.example/cx7fn');
    await c.nextList((l) => l.length === 4);
    const all = ['0000:60:00.0', '0000:60:00.1', '0000:61:00.0', '0000:61:00.1'];
    // one whole group, never a function of each; of two that fit, the one on the lowest NUMA node
    expect(await c.preferred([{ available: all, size: 2 }])).toEqual([['0000:61:00.0', '0000:61:00.1']]);
    expect(await c.preferred([{ available: all.slice(0, 3), size: 2 }])).toEqual([['0000:60:00.0', '0000:60:00.1']]);
    expect(await c.preferred([{ available: all, mustInclude: ['0000:61:00.1'], size: 2 }])).toEqual([
      ['0000:61:00.1', '0000:61:00.0'],
    ]);
    expect(
      await c.preferred([
        { available: all, mustInclude: ['0000:61:00.1'], size: 3 },
        { available: all, size: 1 },
      ]),
    ).toEqual([['0000:61:00.1', '0000:61:00.0', '0000:60:00.0'], ['0000:61:00.0']]);
  });
});

describe('Allocate', { timeout: 180_000 }, () => {
  it('answers device nodes, PCIDEVICE_<RESOURCE> and CDI names; the CDI spec gives exactly those functions', async () => {
    const { kubelet: k, cdiDir } = await setup();
    const c = await k.plugin(QAT);
    await c.nextList((l) => l.length === 4);
    const [one, two] = await c.allocate([['0000:3d:02.2', '0000:3d:02.1'], ['0000:3d:02.3']]);
    expect(one).toEqual({
      envs: { PCIDEVICE_VENDOR_EXAMPLE_QAT: '0000:3d:02.1,0000:3d:02.2' },
      mounts: [],
      devices: ['/dev/vfio/vfio', '/dev/vfio/61', '/dev/vfio/62'].map((p) => ({
        container_path: p,
        host_path: p,
        permissions: 'rw',
      })),
      annotations: {},
      cdi_devices: [{ name: `${QAT}=0000:3d:02.2` }, { name: `${QAT}=0000:3d:02.1` }],
    });
    expect(two!.envs).toEqual({ PCIDEVICE_VENDOR_EXAMPLE_QAT: '0000:3d:02.3' });
    const g = await k.plugin(CX7);
    await g.nextList((l) => l.length === 2);
    const [grp] = await g.allocate([['iommu-group-42']]);
    expect(grp!.envs).toEqual({ PCIDEVICE_VENDOR_EXAMPLE_CX7: '0000:60:00.0,0000:60:00.1' });
    expect(grp!.devices.map((d) => d.host_path)).toEqual(['/dev/vfio/vfio', '/dev/vfio/42']);
    // the spec files: valid CDI, and a VM given only the CDI names gets exactly the allocated functions
    const files = fs.readdirSync(cdiDir).sort();
    expect(files).toEqual(['vmpod-vfio_vendor.example_cx7.json', 'vmpod-vfio_vendor.example_qat.json']);
    for (const f of files) expect(validateSpec(JSON.parse(fs.readFileSync(path.join(cdiDir, f), 'utf8')))).toEqual([]);
    const reg = loadCdiRegistry([cdiDir], () => undefined);
    const problems: string[] = [];
    const reqs = cdiRequests(
      one!.cdi_devices.map((d) => d.name),
      reg,
      problems,
    );
    expect(problems).toEqual([]);
    expect(reqs.map((r) => (r.kind === 'group' ? [r.group, r.only] : r))).toEqual([
      ['62', ['0000:3d:02.2']],
      ['61', ['0000:3d:02.1']],
    ]);
  });

  it("with iommufd: /dev/iommu and the function's /dev/vfio/devices/vfioN as well", async () => {
    const n = makeDpNodeWith(() => undefined);
    fs.writeFileSync(path.join(n.host.root, 'dev/iommu'), '');
    fs.mkdirSync(path.join(n.host.root, 'dev/vfio/devices'), { recursive: true });
    fs.writeFileSync(path.join(n.host.root, 'dev/vfio/devices/vfio0'), '');
    const { kubelet: k, cdiDir } = await setupOn(n);
    const c = await k.plugin(QAT);
    await c.nextList((l) => l.length === 4);
    const [r] = await c.allocate([['0000:3d:02.1']]);
    expect(r!.devices.map((d) => d.host_path)).toEqual([
      '/dev/vfio/vfio',
      '/dev/vfio/61',
      '/dev/iommu',
      '/dev/vfio/devices/vfio0',
    ]);
    const spec = JSON.parse(fs.readFileSync(path.join(cdiDir, 'vmpod-vfio_vendor.example_qat.json'), 'utf8'));
    expect(spec.devices[0].containerEdits.deviceNodes.map((d: { path: string }) => d.path)).toEqual([
      '/dev/vfio/61',
      '/dev/vfio/devices/vfio0',
    ]);
    expect(spec.containerEdits.deviceNodes.map((d: { path: string }) => d.path)).toEqual([
      '/dev/vfio/vfio',
      '/dev/iommu',
    ]);
  });

  it('refuses an unknown device and an unhealthy one, naming the device and the reason', async () => {
    const { kubelet: k } = await setup();
    const c = await k.plugin(QAT);
    await c.nextList((l) => l.length === 4);
    const sent = c.lists.length;
    await expect(c.allocate([['0000:3d:07.0']])).rejects.toMatchObject({
      code: grpc.status.NOT_FOUND,
      details: expect.stringMatching(/device 0000:3d:07\.0 of vendor\.example\/qat is unknown/),
    });
    await expect(c.allocate([['0000:3d:02.1', '0000:3d:02.4']])).rejects.toMatchObject({
      code: grpc.status.FAILED_PRECONDITION,
      details: expect.stringMatching(
        /^device 0000:3d:02\.4 of vendor\.example\/qat is unhealthy: 0000:3d:02\.4 is bound to qat_4xxx/,
      ),
    });
    // and a ListAndWatch update with each failure, as the API asks
    await waitFor('the lists sent again', () => (c.lists.length >= sent + 2 ? true : undefined));
    const g = await k.plugin(CX7);
    await expect(g.allocate([['iommu-group-70']])).rejects.toMatchObject({
      details: expect.stringMatching(/IOMMU group 70 is not viable: its member 0000:70:00\.1 is bound to ixgbe/),
    });
  });

  it('refuses a device whose group a VM of another pod holds open, naming that VM', async () => {
    const { kubelet: k, node: n } = await setup();
    n.host.addProcess(
      4242,
      'qemu-system-x86',
      ['qemu-system-x86_64', '-name', 'guest=vm-of-deleted-pod'],
      ['/dev/vfio/42'],
    );
    const g = await k.plugin(CX7);
    await g.nextList((l) => l.length === 2);
    await expect(g.allocate([['iommu-group-42']])).rejects.toMatchObject({
      code: grpc.status.FAILED_PRECONDITION,
      details: expect.stringMatching(
        /^device iommu-group-42 of vendor\.example\/cx7: its IOMMU group 42 \(\/dev\/vfio\/42\) is held open by pid 4242 \(qemu-system-x86, VM "vm-of-deleted-pod"\)/,
      ),
    });
  });

  it('finds a real process holding the group node open, as vmwrapper does (/proc/<pid>/fd)', async () => {
    // a dev root whose proc is the real /proc: the holder is a real process with the fake node open
    const n = makeDpNodeWith(() => undefined);
    const root = path.join(n.dir, 'realproc');
    fs.mkdirSync(path.join(root, 'dev/vfio'), { recursive: true });
    fs.symlinkSync('/proc', path.join(root, 'proc'));
    const nodeFile = path.join(root, 'dev/vfio/61');
    fs.writeFileSync(nodeFile, '');
    const fd = fs.openSync(nodeFile, 'r');
    const holder = spawn('sleep', ['600'], { stdio: [fd, 'ignore', 'ignore'] });
    fs.closeSync(fd);
    try {
      const { kubelet: k } = await setupOn(n, { devRoot: root });
      const c = await k.plugin(QAT);
      await c.nextList((l) => l.length === 4);
      await expect(c.allocate([['0000:3d:02.1']])).rejects.toMatchObject({
        details: expect.stringContaining(`is held open by pid ${holder.pid} (sleep)`),
      });
      expect((await c.allocate([['0000:3d:02.2']]))[0]!.envs).toEqual({ PCIDEVICE_VENDOR_EXAMPLE_QAT: '0000:3d:02.2' });
    } finally {
      holder.kill('SIGKILL');
      await new Promise((r) => holder.once('exit', r));
    }
  });
});

describe('kubelet and the plugin die', { timeout: 180_000 }, () => {
  it('kubelet restarts (every socket removed, kubelet.sock made again): sockets made again, registered again', async () => {
    const { kubelet: k, plugin: p } = await setup();
    await k.registered(QAT);
    await k.registered(CX7);
    await k.restart();
    const regs = await k.registered(QAT, 2);
    await k.registered(CX7, 2);
    expect(fs.existsSync(path.join(k.dir, regs[1]!.endpoint))).toBe(true);
    expect(ids(await (await k.plugin(QAT)).nextList((l) => l.length === 4))).toContain('0000:3d:02.1');
    expect(p.linesMatching(/kubelet restarted|our socket was removed/).length).toBeGreaterThan(0);
  });

  it('kubelet.sock made again while our socket stays: registered again', async () => {
    const { kubelet: k } = await setup();
    await k.registered(QAT);
    await k.registered(CX7);
    k.stop();
    await k.start();
    await k.registered(QAT, 2);
    await k.registered(CX7, 2);
  });

  it('our socket removed: made again and registered again', async () => {
    const { kubelet: k } = await setup();
    const [r] = await k.registered(QAT);
    fs.rmSync(path.join(k.dir, r!.endpoint));
    await k.registered(QAT, 2);
    expect(fs.existsSync(path.join(k.dir, r!.endpoint))).toBe(true);
    expect(await (await k.plugin(QAT)).nextList((l) => l.length === 4)).toHaveLength(4);
  });

  it('started before kubelet: retries with backoff, logs the failure once, registers when kubelet comes', async () => {
    const { kubelet: k, plugin: p } = await setup({ startKubelet: false });
    await p.waitLog(/^registration failed again/, 4);
    expect(p.linesMatching(/^registration failed: /).filter((l) => l['resource'] === QAT)).toHaveLength(1);
    await k.start();
    await k.registered(QAT);
    await k.registered(CX7);
    await p.waitLog(/^registered with kubelet/, 2);
  });

  it("kubelet refuses the registration: exit 1 naming the resource and kubelet's reason", async () => {
    const n = makeDpNodeWith(() => undefined);
    kubelet = await startFakeDpKubelet();
    kubelet.refuse = { code: grpc.status.UNKNOWN, details: `resource ${QAT} is already registered` };
    const cfg = writeConfig(n.dir, 'dp.yaml', CONFIG);
    const p = startPlugin({
      args: ['--config', cfg, '--kubelet-dir', kubelet.dir, '--cdi-dir', ''],
      env: { VMPOD_SYSFS_ROOT: n.tree.root, VMPOD_DEV_ROOT: n.host.root },
    });
    const r = await p.exited;
    expect(r.code).toBe(1);
    expect(p.stderr.trim().split('\n').pop()).toBe(
      `vfio-device-plugin: kubelet refused the registration of ${QAT}: resource ${QAT} is already registered`,
    );
    expect(fs.readdirSync(kubelet.dir).filter((f) => f !== 'kubelet.sock')).toEqual([]);
  });

  it('a second plugin on the same sockets does not start, and takes nothing from the first', async () => {
    const { kubelet: k, node: n } = await setup();
    const [first] = await k.registered(QAT);
    await k.registered(CX7);
    const socketId = fs.statSync(path.join(k.dir, first!.endpoint)).ino;
    const second = startPlugin({
      args: ['--config', path.join(n.dir, 'dp.yaml'), '--kubelet-dir', k.dir, '--cdi-dir', ''],
      env: { VMPOD_SYSFS_ROOT: n.tree.root, VMPOD_DEV_ROOT: n.host.root },
    });
    expect((await second.exited).code).toBe(1);
    expect(second.stderr.trim().split('\n').pop()).toBe(
      `vfio-device-plugin: another process serves on ${path.join(k.dir, first!.endpoint)} (another vfio-device-plugin with a resource of the same name?): stop it, or rename the resource`,
    );
    expect(fs.statSync(path.join(k.dir, first!.endpoint)).ino).toBe(socketId);
    expect(k.registrations.filter((r) => r.resource_name === QAT)).toHaveLength(1);
    expect(await (await k.plugin(QAT)).allocate([['0000:3d:02.1']])).toHaveLength(1);
  });

  it('SIGTERM: sockets removed, exit 0', async () => {
    const { kubelet: k, plugin: p } = await setup();
    await k.registered(QAT);
    await k.registered(CX7);
    const r = await p.stop();
    plugin = undefined;
    expect(r).toEqual({ code: 0, signal: null });
    expect(fs.readdirSync(k.dir)).toEqual(['kubelet.sock']);
  });
});

describe('the config', { timeout: 180_000 }, () => {
  it('a bad one is refused at start: one line per problem, naming the entry', async () => {
    const n = makeDpNodeWith(() => undefined);
    kubelet = await startFakeDpKubelet();
    const cfg = writeConfig(
      n.dir,
      'dp.yaml',
      `- resourceName: ${QAT}\n  vendors: ["8086"]\n  unit: gpu\n- resourceName: vendor.example/x\n  devices: ["10fb"]\n  driver: vfio-pci\n`,
    );
    const p = startPlugin({
      args: ['--config', cfg, '--kubelet-dir', kubelet.dir],
      env: { VMPOD_SYSFS_ROOT: n.tree.root, VMPOD_DEV_ROOT: n.host.root },
    });
    const r = await p.exited;
    expect(r.code).toBe(1);
    expect(p.stderr.trim().split('\n')).toEqual([
      `vfio-device-plugin: config ${cfg}: resources[0] (${QAT}): unit "gpu" is not "function" or "group"`,
      `vfio-device-plugin: config ${cfg}: resources[1] (vendor.example/x): unknown field "driver" (known: resourceName, vendors, devices, drivers, pciAddresses, unit)`,
    ]);
    expect(fs.readdirSync(kubelet.dir)).toEqual(['kubelet.sock']);
    expect(kubelet.registrations).toEqual([]);
  });

  it('a CDI dir that cannot be written: logged once per resource, the plugin serves on', async () => {
    const n = makeDpNodeWith(() => undefined);
    fs.writeFileSync(path.join(n.dir, 'file'), '');
    const { kubelet: k, plugin: p } = await setupOn(n, { args: ['--cdi-dir', path.join(n.dir, 'file', 'cdi')] });
    const c = await k.plugin(QAT);
    await c.nextList((l) => l.length === 4);
    // ticks pass: a change is seen
    n.tree.setDriver('0000:3d:02.2', undefined);
    await c.nextList((l) => healthOf(l, '0000:3d:02.2') === 'Unhealthy');
    const failed = p.linesMatching(/^CDI spec not written/);
    expect(failed.map((l) => l['resource']).sort()).toEqual([CX7, QAT]);
  });

  it('CDI off (--cdi-dir ""): no cdi_devices, no spec file', async () => {
    const { kubelet: k, cdiDir } = await setup({ args: ['--cdi-dir', ''] });
    const c = await k.plugin(QAT);
    await c.nextList((l) => l.length === 4);
    const [r] = await c.allocate([['0000:3d:02.1']]);
    expect(r!.cdi_devices).toEqual([]);
    expect(fs.existsSync(cdiDir)).toBe(false);
  });
});

/** The shared node plus changes, kept for afterEach. */
function makeDpNodeWith(change: (t: DpNode['tree']) => void): DpNode {
  node = makeDpNode();
  change(node.tree);
  return node;
}

async function setupOn(n: DpNode, o: { config?: string; configName?: string; devRoot?: string; args?: string[] } = {}) {
  kubelet = await startFakeDpKubelet();
  const cfg = writeConfig(n.dir, o.configName ?? 'dp.yaml', o.config ?? CONFIG);
  const cdiDir = path.join(n.dir, 'cdi');
  plugin = startPlugin({
    args: ['--config', cfg, '--kubelet-dir', kubelet.dir, '--cdi-dir', cdiDir, ...(o.args ?? [])],
    env: { VMPOD_SYSFS_ROOT: n.tree.root, VMPOD_DEV_ROOT: o.devRoot ?? n.host.root },
  });
  return { node: n, kubelet, plugin, cdiDir };
}
