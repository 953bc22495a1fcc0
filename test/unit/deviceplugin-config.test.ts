// vfio-device-plugin's flags and resources file: defaults, env, every problem named with its entry; README's table
// says what the option table says.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { parseResources } from '../../src/deviceplugin/config.js';
import { DP_ENV_ONLY, DP_FLAGS, dpUsage, parseOptions } from '../../src/deviceplugin/options.js';

describe('parseOptions', () => {
  it('defaults, env, and flags over env', () => {
    const r = parseOptions(['--config', '/etc/dp.yaml'], {});
    expect(r).toEqual({
      ok: true,
      options: {
        config: '/etc/dp.yaml',
        kubeletDir: '/var/lib/kubelet/device-plugins',
        cdiDir: '/var/run/cdi',
        logLevel: 'info',
        sysfsRoot: '/sys',
        devRoot: '/',
        help: false,
        version: false,
      },
    });
    const e = parseOptions(['--kubelet-dir=/k2'], {
      VMPOD_DP_CONFIG: '/c.json',
      VMPOD_DP_KUBELET_DIR: '/k',
      VMPOD_HTTP_LISTEN: '127.0.0.1:9732',
      VMPOD_SYSFS_ROOT: '/fake/sys',
      VMPOD_DEV_ROOT: '/fake',
    });
    expect(e.ok && e.options).toMatchObject({
      config: '/c.json',
      kubeletDir: '/k2',
      httpListen: { host: '127.0.0.1', port: 9732 },
      sysfsRoot: '/fake/sys',
      devRoot: '/fake',
    });
  });

  it("--probe PATH needs the listener's address, not the config", () => {
    const r = parseOptions(['--probe', '/readyz'], { VMPOD_HTTP_LISTEN: '0.0.0.0:9732' });
    expect(r.ok && [r.options.probe, r.options.httpListen]).toEqual(['/readyz', { host: '0.0.0.0', port: 9732 }]);
    expect(parseOptions(['--probe', 'readyz'], {})).toEqual({
      ok: false,
      errors: [
        '--probe "readyz" is not an HTTP path (/healthz, /readyz)',
        '--probe needs --http-listen (or VMPOD_HTTP_LISTEN): the address the plugin listens on',
      ],
    });
  });

  it('an empty --cdi-dir or VMPOD_DP_CDI_DIR turns CDI off', () => {
    for (const r of [
      parseOptions(['--config', '/c', '--cdi-dir', ''], {}),
      parseOptions(['--config', '/c'], { VMPOD_DP_CDI_DIR: '' }),
    ]) {
      expect(r.ok).toBe(true);
      expect(r.ok && 'cdiDir' in r.options).toBe(false);
    }
  });

  it('names every usage problem at once', () => {
    expect(
      parseOptions(['--kubelet-dir', 'rel', '--http-listen', 'nope', '--log-level', 'loud', '--bogus'], {}),
    ).toEqual({
      ok: false,
      errors: [
        'unknown argument "--bogus"',
        '--log-level "loud" is not one of fatal, error, warn, info, debug, trace, silent',
        '--config (or VMPOD_DP_CONFIG) is required: the file naming the resources to advertise',
        '--kubelet-dir "rel" must be an absolute path',
        '--http-listen / VMPOD_HTTP_LISTEN "nope" is not ADDR:PORT (e.g. 127.0.0.1:9732 or [::1]:9732)',
      ],
    });
  });

  it("README's table lists every flag with its env and default, and every env-only variable; --help too", () => {
    const readme = readFileSync('README.md', 'utf8');
    const rest = readme.split('### vfio-device-plugin')[1] ?? '';
    const lines = rest.split('\n');
    const start = lines.findIndex((l) => l.startsWith('|'));
    const rows: string[][] = [];
    for (const l of lines.slice(start + 2)) {
      if (!l.startsWith('|')) break;
      rows.push(
        l
          .split('|')
          .slice(1, -1)
          .map((c) => c.trim().replace(/`/g, '')),
      );
    }
    const specs = Object.values(DP_FLAGS) as { flag: string; env: string; def: string }[];
    expect(
      rows
        .filter((r) => r[0] !== '')
        .map((r) => r[0].split(' ')[0])
        .sort(),
    ).toEqual([...specs.map((s) => s.flag), '--help', '--probe', '--version'].sort());
    for (const f of ['--help', '--probe', '--version']) expect(dpUsage()).toContain(f);
    for (const s of specs) {
      const row = rows.find((r) => r[0] === s.flag)!;
      expect(row[1], s.flag).toBe(s.env);
      expect(row[2], s.flag).toBe(s.def === '' ? (s.flag === '--config' ? 'required' : 'off') : s.def);
      expect(dpUsage()).toContain(s.flag);
    }
    expect(
      rows
        .filter((r) => r[0] === '')
        .map((r) => r[1])
        .sort(),
    ).toEqual(Object.keys(DP_ENV_ONLY).sort());
    for (const k of Object.keys(DP_ENV_ONLY)) expect(dpUsage()).toContain(k);
  });
});

describe('parseResources', () => {
  const ok = (doc: unknown, cdi = true) => {
    const r = parseResources(doc, { cdi });
    expect(r.problems).toEqual([]);
    return r.resources;
  };

  it('a list, or an object whose resources is the list; IDs and addresses normalised; unit function by default', () => {
    const list = [
      {
        resourceName: 'vendor.example/qat',
        vendors: ['8086', '0x8086'],
        devices: ['4941', '0X4941'],
        drivers: ['vfio-pci'],
        pciAddresses: ['3D:02.1'],
      },
    ];
    const want = [
      {
        resourceName: 'vendor.example/qat',
        vendors: ['8086', '8086'],
        devices: ['4941', '4941'],
        drivers: ['vfio-pci'],
        pciAddresses: ['0000:3d:02.1'],
        unit: 'function',
      },
    ];
    expect(ok(list)).toEqual(want);
    expect(ok({ resources: list })).toEqual(want);
    expect(ok([{ resourceName: 'gpu.example/a100', vendors: ['10de'], unit: 'group' }])[0]!.unit).toBe('group');
  });

  it('every problem, each naming the entry', () => {
    const r = parseResources(
      [
        { resourceName: 'vendor.example/qat', vendors: ['8086x'], devices: '4941', unit: 'card' },
        { resourceName: 'vendor.example/qat', pciAddresses: ['0000:3d:02.9'] },
        { resourceName: 'no-slash', drivers: ['vfio pci'] },
        { vendors: ['8086'] },
        { resourceName: 'vendor.example/all' },
        'x',
      ],
      { cdi: true },
    );
    expect(r.problems).toEqual([
      'resources[0] (vendor.example/qat): vendors: "8086x" is not a PCI vendor ID (4 hex digits, e.g. "8086")',
      'resources[0] (vendor.example/qat): devices is not a list',
      'resources[0] (vendor.example/qat): unit "card" is not "function" or "group"',
      'resources[1] (vendor.example/qat): resourceName "vendor.example/qat" is named twice',
      'resources[1] (vendor.example/qat): pciAddresses: "0000:3d:02.9" is not a PCI address (0000:3b:02.1 or 3b:02.1)',
      'resources[2] (no-slash): resourceName "no-slash" is not vendor-domain/name (a DNS subdomain, "/", then at most 63 of A-Za-z0-9-_.)',
      'resources[2] (no-slash): drivers: "vfio pci" is not a driver name',
      'resources[3]: resourceName is missing (vendor-domain/name, e.g. vendor.example/qat)',
      'resources[4] (vendor.example/all): has no selector: give vendors, devices, drivers or pciAddresses (without one it would take every PCI function of the node)',
      'resources[5]: is not an object',
    ]);
  });

  it('with CDI on, the resource name must be a CDI kind (a class that starts with a letter)', () => {
    const doc = [{ resourceName: 'vendor.example/1gpu', vendors: ['10de'] }];
    expect(parseResources(doc, { cdi: true }).problems).toEqual([
      'resources[0] (vendor.example/1gpu): resourceName "vendor.example/1gpu" is not a CDI kind (vendor and class must start with a letter): rename it, or turn CDI off (--cdi-dir "")',
    ]);
    expect(ok(doc, false)).toHaveLength(1);
  });

  it('not a list, or an empty one', () => {
    expect(parseResources({ resource: [] }, { cdi: false }).problems).toEqual([
      'is not a list of resources (nor an object whose "resources" is one)',
    ]);
    expect(parseResources([], { cdi: false }).problems).toEqual(['names no resource']);
  });
});
