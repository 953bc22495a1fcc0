import { describe, it, expect } from 'vitest';
import { readFileSync } from 'node:fs';
import { parseConfig, usage, FLAGS } from '../../src/tapmanager/config.js';

describe('tapmanager config', () => {
  it('has the documented defaults', () => {
    const r = parseConfig([], {});
    expect(r).toEqual({
      ok: true,
      config: {
        socket: '/var/lib/virtlet/tapfdserver.sock',
        cniConfDir: '/etc/cni/net.d',
        cniBinDirs: ['/opt/cni/bin'],
        cniCacheDir: '/var/lib/cni',
        stateDir: '/var/lib/vmpod-node',
        logLevel: 'info',
        cniTimeoutMs: 60000,
        enableSriov: false,
        defaultDns: [],
        sysfsRoot: '/sys',
        requestTimeoutMs: 10000,
        maxConnections: 256,
        stopTimeoutMs: 80000,
        spareNetns: 1,
        binding: 'auto',
        cniStatusIntervalMs: 10000,
        cniGcIntervalMs: 3600000,
        cniGcPlugins: false,
        checkIntervalMs: 300000,
        help: false,
        version: false,
      },
    });
  });

  it('takes env vars, and flags win over them', () => {
    const env = {
      VIRTLET_FD_SERVER_SOCKET_PATH: '/run/a.sock',
      VIRTLET_CNI_PLUGIN_DIR: '/a:/b',
      VIRTLET_SRIOV_SUPPORT: 'true',
    };
    const r = parseConfig(
      ['--socket', '/run/b.sock', '--cni-conf-dir=/etc/x', '--enable-sriov', '--socket-group', 'kvm'],
      env,
    );
    expect(r.ok && r.config).toMatchObject({
      socket: '/run/b.sock',
      cniConfDir: '/etc/x',
      cniBinDirs: ['/a', '/b'],
      enableSriov: true,
      socketGroup: 'kvm',
    });
  });

  it('--enable-sriov=false turns off VIRTLET_SRIOV_SUPPORT=true; a bad value is refused', () => {
    const env = { VIRTLET_SRIOV_SUPPORT: 'true' };
    expect(parseConfig([], env)).toMatchObject({ ok: true, config: { enableSriov: true } });
    for (const off of ['false', '0', 'no', 'off'])
      expect(parseConfig([`--enable-sriov=${off}`], env)).toMatchObject({ ok: true, config: { enableSriov: false } });
    expect(parseConfig(['--enable-sriov=true'], {})).toMatchObject({ ok: true, config: { enableSriov: true } });
    expect(parseConfig(['--enable-sriov=maybe'], env)).toEqual({
      ok: false,
      errors: ['--enable-sriov / VIRTLET_SRIOV_SUPPORT "maybe" is not a boolean'],
    });
    // a value given to a plain switch is still refused
    expect(parseConfig(['--help=no'], {})).toEqual({ ok: false, errors: ['--help takes no value'] });
  });

  it('--version is a switch: the config says so', () => {
    expect(parseConfig(['--version'], {})).toMatchObject({ ok: true, config: { version: true } });
  });

  it('the CNI STATUS, GC and check intervals, and --cni-gc plugins', () => {
    expect(
      parseConfig(['--cni-gc', 'plugins', '--cni-gc-interval', '0', '--check-interval=0'], {
        VMPOD_CNI_STATUS_INTERVAL_MS: '500',
      }),
    ).toMatchObject({
      ok: true,
      config: { cniGcPlugins: true, cniGcIntervalMs: 0, checkIntervalMs: 0, cniStatusIntervalMs: 500 },
    });
    expect(
      parseConfig([], { VMPOD_CNI_GC: 'plugins', VMPOD_CNI_GC_INTERVAL_MS: '60000', VMPOD_CHECK_INTERVAL_MS: '1000' }),
    ).toMatchObject({
      ok: true,
      config: { cniGcPlugins: true, cniGcIntervalMs: 60000, checkIntervalMs: 1000 },
    });
    expect(parseConfig(['--cni-gc', 'all', '--cni-status-interval', '0', '--check-interval', '-1'], {})).toEqual({
      ok: false,
      errors: [
        '--cni-status-interval "0" is not a positive integer (ms)',
        '--check-interval "-1" is not a non-negative integer (ms; 0: never)',
        '--cni-gc / VMPOD_CNI_GC "all" is not "plugins" (or empty)',
      ],
    });
  });

  it('--spare-netns / VMPOD_SPARE_NETNS: 0 to 16', () => {
    expect(parseConfig(['--spare-netns', '0'], {})).toMatchObject({ ok: true, config: { spareNetns: 0 } });
    expect(parseConfig([], { VMPOD_SPARE_NETNS: '4' })).toMatchObject({ ok: true, config: { spareNetns: 4 } });
    for (const bad of ['-1', '17', '1.5', 'two']) {
      expect(parseConfig(['--spare-netns', bad], {})).toEqual({
        ok: false,
        errors: [`--spare-netns ${JSON.stringify(bad)} is not an integer from 0 to 16`],
      });
    }
  });

  it('--default-dns / VMPOD_DEFAULT_DNS: IPv4 servers, comma-separated; anything else is refused', () => {
    const r = parseConfig(['--default-dns', '10.0.0.53, 10.0.0.54'], {});
    expect(r.ok && r.config.defaultDns).toEqual(['10.0.0.53', '10.0.0.54']);
    const e = parseConfig([], { VMPOD_DEFAULT_DNS: '10.0.0.53,fd00::53' });
    expect(e).toEqual({ ok: false, errors: ['--default-dns "fd00::53" is not an IPv4 address'] });
  });

  it('reports every problem at once, quoting the values', () => {
    const r = parseConfig(
      [
        '--log-level',
        'loud',
        '--cni-timeout',
        '-1',
        '--max-connections',
        '0',
        '--state-dir',
        'rel',
        '--bogus',
        '--socket',
      ],
      { VIRTLET_SRIOV_SUPPORT: 'maybe' },
    );
    expect(r.ok).toBe(false);
    const errors = r.ok ? [] : r.errors;
    expect(errors).toEqual(
      expect.arrayContaining([
        'unknown argument "--bogus"',
        '--socket needs a value',
        expect.stringContaining('--log-level "loud"'),
        expect.stringContaining('--cni-timeout "-1"'),
        '--max-connections "0" is not a positive integer',
        expect.stringContaining('--state-dir "rel" must be an absolute path'),
        expect.stringContaining('VIRTLET_SRIOV_SUPPORT "maybe"'),
      ]),
    );
  });

  it('documents every flag and env var in --help and in the README', () => {
    const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');
    for (const spec of Object.values(FLAGS)) {
      expect(usage()).toContain(spec.flag);
      expect(readme).toContain(`\`${spec.flag}\``);
      expect(readme).toContain(`\`${spec.env}\``);
    }
  });
});
