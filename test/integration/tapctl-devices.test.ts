// `tapctl devices`: what a VM would get, from an env file, as a table and as JSON; the same records as vmwrapper's.
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { BIN } from '../helpers/daemon.js';
import { makeFakeHostRoot, makeFakeSysfs, type FakeHostRoot, type FakeSysfsTree } from '../helpers/fakesysfs.js';

let tree: FakeSysfsTree | undefined;
let host: FakeHostRoot | undefined;
let dir: string | undefined;
afterEach(() => {
  tree?.cleanup();
  host?.cleanup();
  if (dir) fs.rmSync(dir, { recursive: true, force: true });
  tree = host = dir = undefined;
});

function tapctl(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [BIN.tapctl, ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin' },
  });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d) => (stdout += d));
  child.stderr.on('data', (d) => (stderr += d));
  return new Promise((r) => child.on('exit', (code) => r({ code, stdout, stderr })));
}

function envFile(vars: Record<string, string>, sep = '\n'): string {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmpod-envfile-'));
  const f = path.join(dir, 'env');
  fs.writeFileSync(
    f,
    Object.entries(vars)
      .map(([k, v]) => `${k}=${v}`)
      .join(sep) + sep,
  );
  return f;
}

function node(): Record<string, string> {
  tree = makeFakeSysfs();
  host = makeFakeHostRoot();
  tree.addPci({ address: '0000:3d:02.2', class: 0x0b4000, driver: 'vfio-pci', iommuGroup: '67' });
  tree.addPci({ address: '0000:5f:00.0', driver: 'vfio-pci', iommuGroup: '41' });
  tree.addPci({ address: '0000:5f:00.1', driver: 'mlx5_core', iommuGroup: '41' });
  return { VMPOD_SYSFS_ROOT: tree.root, VMPOD_DEV_ROOT: host.root };
}

describe('tapctl devices', () => {
  it('a table with each function, its group, driver and source, and the qemu arguments', async () => {
    const f = envFile({
      ...node(),
      QAT0: '0000:3d:02.2',
      VMPOD_CRI_DEVICES: '[{"containerPath":"/dev/vfio/67","hostPath":"/dev/vfio/67","permissions":"mrw"}]',
    });
    const r = await tapctl(['devices', '--env-file', f]);
    expect(r.stderr).toBe('');
    expect(r.code).toBe(0);
    expect(r.stdout).toBe(
      [
        'FUNCTION      GROUP  DRIVER    SOURCE',
        '0000:3d:02.2  67     vfio-pci  QAT0',
        '',
        'qemu arguments:',
        '  -device vfio-pci,host=0000:3d:02.2,id=vmpodhostdev0',
        '',
      ].join('\n'),
    );
  });

  it('--json, from a NUL-separated environ, with the refusal and exit 1; --machine renders root ports', async () => {
    const f = envFile({ ...node(), QAT0: '0000:3d:02.2', PCIDEVICE_MELLANOX_COM_CX7: '0000:5f:00.0' }, '\0');
    const r = await tapctl(['devices', '--env-file', f, '--json', '--machine', 'pc-q35-8.2']);
    expect(r.code).toBe(1);
    const j = JSON.parse(r.stdout) as {
      devices: unknown[];
      qemuArgs: string[];
      refused: string[];
      inputErrors: string[];
    };
    expect(j.devices).toEqual([
      { address: '0000:5f:00.0', group: '41', driver: 'vfio-pci', source: 'PCIDEVICE_MELLANOX_COM_CX7' },
      { address: '0000:3d:02.2', group: '67', driver: 'vfio-pci', source: 'QAT0' },
    ]);
    expect(j.qemuArgs).toEqual([
      '-device',
      'pcie-root-port,id=vmpodrp0,bus=pcie.0,chassis=1,port=0x10',
      '-device',
      'vfio-pci,host=0000:5f:00.0,id=vmpodhostdev0,bus=vmpodrp0',
      '-device',
      'pcie-root-port,id=vmpodrp1,bus=pcie.0,chassis=2,port=0x11',
      '-device',
      'vfio-pci,host=0000:3d:02.2,id=vmpodhostdev1,bus=vmpodrp1',
    ]);
    expect(j.refused).toHaveLength(1);
    expect(j.refused[0]).toContain('its other member 0000:5f:00.1 (not allocated to this pod) is bound to mlx5_core');
    expect(j.inputErrors).toEqual([]);
  });

  it('a malformed input is shown as an input error', async () => {
    const f = envFile({ ...node(), QAT0: 'nope' });
    const r = await tapctl(['devices', '--env-file', f]);
    expect(r.code).toBe(1);
    expect(r.stdout).toContain('input errors:\n  - QAT0="nope": "nope" is not a PCI address');
  });
});
