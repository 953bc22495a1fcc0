// Runs the built vfio-device-plugin (bin/vfio-device-plugin.js, as the package installs it) on fake trees, and
// reads its JSON log lines; and the fake node the device-plugin tests share.
import { spawn, type ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { REPO } from './daemon.js';
import { waitFor } from './fakedpkubelet.js';
import { FakeHostRoot, makeFakeSysfs, type FakePci, type FakeSysfsTree } from './fakesysfs.js';

export const DP_BIN = path.join(REPO, 'bin/vfio-device-plugin.js');

export interface LogLine {
  level: number;
  msg: string;
  [k: string]: unknown;
}

export class RunningPlugin {
  stderr = '';
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;

  constructor(readonly child: ChildProcess) {
    child.stderr!.on('data', (d) => (this.stderr += d));
    child.stdout!.resume();
    this.exited = new Promise((r) => child.on('exit', (code, signal) => r({ code, signal })));
  }

  /** The JSON log lines so far. */
  get lines(): LogLine[] {
    return this.stderr
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as LogLine);
  }

  linesMatching(re: RegExp): LogLine[] {
    return this.lines.filter((l) => re.test(l.msg));
  }

  waitLog(re: RegExp, n = 1): Promise<LogLine[]> {
    return waitFor(`${n} log line(s) matching ${re}`, () => {
      const m = this.linesMatching(re);
      return m.length >= n ? m : undefined;
    });
  }

  /** SIGTERM, then the exit. */
  async stop(): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
    if (this.child.exitCode === null && this.child.signalCode === null) this.child.kill('SIGTERM');
    return this.exited;
  }
}

export function startPlugin(o: { args?: string[]; env: Record<string, string> }): RunningPlugin {
  const child = spawn(process.execPath, [DP_BIN, ...(o.args ?? [])], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', VMPOD_LOG_LEVEL: 'debug', ...o.env },
  });
  return new RunningPlugin(child);
}

/** numa_node of a fake function (-1: none), as sysfs prints it. */
export function setNuma(tree: FakeSysfsTree, address: string, node: number): void {
  fs.writeFileSync(tree.p(`bus/pci/devices/${address}/numa_node`), `${node}\n`);
}

/** A function gone from sysfs (hot-unplug, VFs removed): its dir, its group link and the PF's virtfn link. */
export function removePci(
  tree: FakeSysfsTree,
  address: string,
  group?: string,
  pf?: { address: string; vfIndex: number },
): void {
  fs.rmSync(tree.p(`bus/pci/devices/${address}`), { recursive: true, force: true });
  if (group !== undefined) fs.rmSync(tree.p(`kernel/iommu_groups/${group}/devices/${address}`), { force: true });
  if (pf !== undefined) fs.rmSync(tree.p(`bus/pci/devices/${pf.address}/virtfn${pf.vfIndex}`), { force: true });
}

/** A temp file with `text` (the resources config), removed with the dir by the caller. */
export function writeConfig(dir: string, name: string, text: string): string {
  const f = path.join(dir, name);
  fs.writeFileSync(f, text);
  return f;
}

export interface DpNode {
  tree: FakeSysfsTree;
  host: FakeHostRoot;
  /** scratch dir: configs, the CDI dir */
  dir: string;
  cleanup(): void;
}

/**
 * The node of the device-plugin tests (QAT-like VFs of vendor 8086 device 4941; a two-function card 15b3:101e):
 * - 0000:3d:02.1 (group 61, numa 0), 0000:3d:02.2 (group 62, numa 0), 0000:3d:02.3 (group 63, numa 1),
 *   all on vfio-pci; 0000:3d:02.4 (group 64, numa 1) on qat_4xxx;
 * - 0000:60:00.0 and 0000:60:00.1 in group 42 (numa 1) on vfio-pci, with a bridge on pcieport in the group;
 * - 0000:70:00.0 in group 70 on vfio-pci, sharing it with 0000:70:00.1 on the host's NIC driver (ixgbe): not viable.
 */
export function makeDpNode(): DpNode {
  const tree = makeFakeSysfs();
  type Fn = FakePci & { numa: number };
  const qat = (address: string, group: string, numa: number, driver = 'vfio-pci', vfioDev?: string): Fn => ({
    address,
    class: 0x0b4000,
    vendor: '0x8086',
    device: '0x4941',
    driver,
    iommuGroup: group,
    ...(vfioDev !== undefined ? { vfioDev } : {}),
    numa,
  });
  const fns: Fn[] = [
    qat('0000:3d:02.1', '61', 0, 'vfio-pci', 'vfio0'),
    qat('0000:3d:02.2', '62', 0),
    qat('0000:3d:02.3', '63', 1),
    qat('0000:3d:02.4', '64', 1, 'qat_4xxx'),
    { address: '0000:60:00.0', vendor: '0x15b3', device: '0x101e', driver: 'vfio-pci', iommuGroup: '42', numa: 1 },
    { address: '0000:60:00.1', vendor: '0x15b3', device: '0x101e', driver: 'vfio-pci', iommuGroup: '42', numa: 1 },
    {
      address: '0000:5f:00.0',
      class: 0x060400,
      vendor: '0x8086',
      device: '0x347a',
      driver: 'pcieport',
      iommuGroup: '42',
      numa: 1,
    },
    { address: '0000:70:00.0', vendor: '0x15b3', device: '0x101e', driver: 'vfio-pci', iommuGroup: '70', numa: 0 },
    { address: '0000:70:00.1', vendor: '0x8086', device: '0x10fb', driver: 'ixgbe', iommuGroup: '70', numa: 0 },
  ];
  for (const f of fns) {
    tree.addPci(f);
    setNuma(tree, f.address, f.numa);
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmpod-dp-'));
  const host = new FakeHostRoot(path.join(dir, 'host'));
  return {
    tree,
    host,
    dir,
    cleanup: () => {
      tree.cleanup();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}
