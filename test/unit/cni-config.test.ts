import { mkdir, mkdtemp, rename, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import {
  buildEnv,
  buildOneConfig,
  formatCniArgs,
  confListLoader,
  loadConfList,
  parseConfList,
  runtimeConfigFor,
  validateCniArgs,
  validateContainerId,
  validateIfName,
} from '../../src/cni/config.js';
import { CniError } from '../../src/cni/errors.js';
import { isVmpodError } from '../../src/errors.js';
import { thrownError as thrown } from '../helpers/errors.js';

const conflist = {
  cniVersion: '1.0.0',
  name: 'podnet',
  plugins: [
    { type: 'bridge', bridge: 'cni0', ipam: { type: 'host-local', subnet: '10.1.0.0/24' } },
    { type: 'tuning', capabilities: { mac: true }, sysctl: { 'net.core.somaxconn': '500' } },
    { type: 'portmap', capabilities: { portMappings: true, bandwidth: false } },
  ],
};

describe('parseConfList', () => {
  it('reads a conflist and keeps its bytes', () => {
    const bytes = Buffer.from(JSON.stringify(conflist));
    const l = parseConfList(bytes, '/etc/cni/net.d/10-pod.conflist');
    expect(l.name).toBe('podnet');
    expect(l.cniVersion).toBe('1.0.0');
    expect(l.plugins.map((p) => p.type)).toEqual(['bridge', 'tuning', 'portmap']);
    expect(l.bytes).toBe(bytes);
    expect(l.file).toBe('/etc/cni/net.d/10-pod.conflist');
    expect(l.disableCheck).toBeUndefined();
  });

  it('turns a .conf into a one-plugin list (libcni ConfListFromConf)', () => {
    const conf = { cniVersion: '0.3.1', name: 'old', type: 'bridge', bridge: 'cni0' };
    const l = parseConfList(Buffer.from(JSON.stringify(conf)), 'x.conf');
    expect(l).toMatchObject({ name: 'old', cniVersion: '0.3.1', plugins: [conf] });
    expect(JSON.parse(l.bytes.toString())).toEqual({ cniVersion: '0.3.1', name: 'old', plugins: [conf] });
  });

  it('reads a .json holding a list as a list', () => {
    expect(parseConfList(Buffer.from(JSON.stringify(conflist)), 'x.json').plugins).toHaveLength(3);
  });

  it('picks the highest supported of cniVersions (CNI 1.1)', () => {
    const l = parseConfList(
      Buffer.from(
        JSON.stringify({ ...conflist, cniVersion: undefined, cniVersions: ['0.4.0', '1.1.0', '1.0.0', '7.0.0'] }),
      ),
      'a.conflist',
    );
    expect(l.cniVersion).toBe('1.1.0');
    expect(l.cniVersions).toEqual(['0.4.0', '1.1.0', '1.0.0', '7.0.0']);
  });

  it('reads disableCheck as a bool or the strings libcni accepts', () => {
    expect(
      parseConfList(Buffer.from(JSON.stringify({ ...conflist, disableCheck: true })), 'a.conflist').disableCheck,
    ).toBe(true);
    expect(
      parseConfList(Buffer.from(JSON.stringify({ ...conflist, disableCheck: 'false' })), 'a.conflist').disableCheck,
    ).toBe(false);
  });

  it('names the file on bad JSON', () => {
    const e = thrown(() => parseConfList(Buffer.from('{"name": '), '/etc/cni/net.d/99-bad.conflist'));
    expect(isVmpodError(e) && e.code).toBe('CONFIG');
    expect(e.message).toMatch(/^CNI config \/etc\/cni\/net.d\/99-bad.conflist: not valid JSON/);
  });

  it('reports every missing field at once', () => {
    const e = thrown(() =>
      parseConfList(
        Buffer.from(JSON.stringify({ plugins: [{ bridge: 'x' }, 'y', { type: '../evil' }] })),
        '/c/a.conflist',
      ),
    );
    expect(e.message).toContain('CNI config /c/a.conflist:');
    expect(e.message).toContain('no "name"');
    expect(e.message).toContain('no "cniVersion"');
    expect(e.message).toContain('plugins[0] has no "type"');
    expect(e.message).toContain('plugins[1] is not an object');
    expect(e.message).toContain('plugins[2] type "../evil" is not a plain file name');
  });

  it.each([
    [{ ...conflist, plugins: [] }, '"plugins" is empty'],
    [{ ...conflist, plugins: undefined }, '"plugins" is missing or not an array'],
    [{ ...conflist, cniVersion: '0.9.9' }, '"cniVersion" "0.9.9" is not one of'],
    [{ ...conflist, name: 'a/b' }, '"name" "a/b" must match'],
    [{ ...conflist, disableCheck: 'yes' }, '"disableCheck" "yes" is not a boolean'],
    [
      { ...conflist, plugins: [{ type: 'x', capabilities: { mac: 'yes' } }] },
      '"capabilities" is not an object of booleans',
    ],
  ])('rejects %#', (json, msg) => {
    expect(thrown(() => parseConfList(Buffer.from(JSON.stringify(json)), 'a.conflist')).message).toContain(msg);
  });

  it('rejects a .conf without type', () => {
    expect(
      thrown(() => parseConfList(Buffer.from(JSON.stringify({ cniVersion: '1.0.0', name: 'n' })), 'a.conf')).message,
    ).toContain('the plugin has no "type"');
  });
});

describe('loadConfList', () => {
  let dir = '';
  afterEach(async () => {
    if (dir !== '') await rm(dir, { recursive: true, force: true });
    dir = '';
  });

  it('takes the first .conf/.conflist/.json file in lexical order, skipping other names and directories', async () => {
    dir = await mkdtemp(join(tmpdir(), 'vmpc-conf-'));
    await mkdir(join(dir, '00-dir.conflist'));
    await writeFile(join(dir, '05-readme.txt'), 'x');
    await writeFile(join(dir, '20-b.conf'), JSON.stringify({ cniVersion: '0.4.0', name: 'b', type: 'bridge' }));
    await writeFile(join(dir, '10-a.conflist'), JSON.stringify(conflist));
    const l = await loadConfList(dir);
    expect(l.file).toBe(join(dir, '10-a.conflist'));
    expect(l.name).toBe('podnet');
  });

  it('says so when there is no file, naming the dir', async () => {
    dir = await mkdtemp(join(tmpdir(), 'vmpc-conf-'));
    await expect(loadConfList(dir)).rejects.toThrow(`no CNI network config in ${dir}`);
    await expect(loadConfList(join(dir, 'nope'))).rejects.toThrow(/read CNI config dir .*nope: ENOENT/);
  });

  it('names the file when it is broken', async () => {
    dir = await mkdtemp(join(tmpdir(), 'vmpc-conf-'));
    await writeFile(join(dir, '10-a.conflist'), '{');
    await expect(loadConfList(dir)).rejects.toThrow(`CNI config ${join(dir, '10-a.conflist')}: not valid JSON`);
  });
});

describe('confListLoader', () => {
  let dir = '';
  afterEach(async () => {
    if (dir !== '') await rm(dir, { recursive: true, force: true });
    dir = '';
  });
  const named = (name: string): string => JSON.stringify({ ...conflist, name });

  it('keeps the parsed network while nothing changed, and sees every kind of change', async () => {
    dir = await mkdtemp(join(tmpdir(), 'vmpc-conf-'));
    await writeFile(join(dir, '10-a.conflist'), named('first'));
    const load = confListLoader(dir);
    const a = await load();
    expect(a.name).toBe('first');
    expect(await load()).toBe(a); // the same object: not read again
    // the file rewritten in place, same size
    await writeFile(join(dir, '10-a.conflist'), named('other'));
    expect((await load()).name).toBe('other');
    // a file that sorts first appears
    await writeFile(join(dir, '05-b.conflist'), named('earlier'));
    expect((await load()).name).toBe('earlier');
    // kubelet's configMap way: the files are links through ..data, which is swapped for a new dir
    await rm(join(dir, '05-b.conflist'));
    await rm(join(dir, '10-a.conflist'));
    await mkdir(join(dir, '..v1'));
    await writeFile(join(dir, '..v1', '10-a.conflist'), named('v1'));
    await symlink('..v1', join(dir, '..data'));
    await symlink(join('..data', '10-a.conflist'), join(dir, '10-a.conflist'));
    expect((await load()).name).toBe('v1');
    await mkdir(join(dir, '..v2'));
    await writeFile(join(dir, '..v2', '10-a.conflist'), named('v2'));
    await symlink('..v2', join(dir, '..tmp'));
    await rename(join(dir, '..tmp'), join(dir, '..data'));
    expect((await load()).name).toBe('v2');
    // and a broken config is an error every time, until it is fixed
    await writeFile(join(dir, '..v2', '10-a.conflist'), '{');
    await expect(load()).rejects.toThrow(/not valid JSON/);
    await expect(load()).rejects.toThrow(/not valid JSON/);
    await writeFile(join(dir, '..v2', '10-a.conflist'), named('fixed'));
    expect((await load()).name).toBe('fixed');
  });
});

describe('buildOneConfig', () => {
  const list = { name: 'podnet', cniVersion: '1.0.0' };

  it("injects name and cniVersion over the plugin's own, and prevResult", () => {
    const prev = { cniVersion: '1.0.0', ips: [{ address: '10.1.0.5/24' }] };
    const c = buildOneConfig(list, { type: 'tuning', name: 'other', cniVersion: '0.3.1', mtu: 1400 }, prev);
    expect(c).toEqual({ type: 'tuning', name: 'podnet', cniVersion: '1.0.0', mtu: 1400, prevResult: prev });
  });

  it('has no prevResult for the first plugin', () => {
    expect(buildOneConfig(list, { type: 'bridge' }, undefined)).not.toHaveProperty('prevResult');
  });

  it('passes only declared (true) capabilities that the runtime supplies', () => {
    const caps = {
      mac: '02:00:00:00:00:01',
      portMappings: [{ hostPort: 80, containerPort: 8080, protocol: 'tcp' }],
      bandwidth: { ingressRate: 1 },
      ips: ['10.1.0.9/24'],
    };
    const plugin = { type: 'x', capabilities: { mac: true, portMappings: true, bandwidth: false, deviceID: true } };
    expect(buildOneConfig(list, plugin, undefined, caps).runtimeConfig).toEqual({
      mac: caps.mac,
      portMappings: caps.portMappings,
    });
    expect(buildOneConfig(list, { type: 'bridge' }, undefined, caps)).not.toHaveProperty('runtimeConfig');
    expect(runtimeConfigFor({ type: 'x', capabilities: { deviceID: true } }, caps)).toBeUndefined();
    expect(runtimeConfigFor(plugin, undefined)).toBeUndefined();
  });

  it('does not modify the plugin conf', () => {
    const plugin = { type: 'x', capabilities: { mac: true } };
    buildOneConfig(list, plugin, { a: 1 }, { mac: 'm' });
    expect(plugin).toEqual({ type: 'x', capabilities: { mac: true } });
  });
});

describe('environment', () => {
  const rt = {
    containerId: 'abc123',
    netns: '/var/run/netns/vm-1',
    ifName: 'virtlet-eth0',
    args: [
      ['IgnoreUnknown', '1'],
      ['K8S_POD_NAMESPACE', 'default'],
      ['K8S_POD_NAME', 'vm-1'],
      ['K8S_POD_INFRA_CONTAINER_ID', 'abc123'],
    ] as [string, string][],
  };

  it('formats CNI_ARGS as K=V;K=V', () => {
    expect(formatCniArgs(rt.args)).toBe(
      'IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=vm-1;K8S_POD_INFRA_CONTAINER_ID=abc123',
    );
    expect(formatCniArgs([])).toBe('');
  });

  it('is exactly the CNI variables plus PATH', () => {
    expect(buildEnv('ADD', rt, ['/opt/cni/bin', '/usr/lib/cni'], '/usr/bin:/bin')).toEqual({
      CNI_COMMAND: 'ADD',
      CNI_CONTAINERID: 'abc123',
      CNI_NETNS: '/var/run/netns/vm-1',
      CNI_IFNAME: 'virtlet-eth0',
      CNI_ARGS: 'IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=vm-1;K8S_POD_INFRA_CONTAINER_ID=abc123',
      CNI_PATH: '/opt/cni/bin:/usr/lib/cni',
      PATH: '/usr/bin:/bin',
    });
  });
});

describe('validation (libcni ValidateContainerID / ValidateInterfaceName)', () => {
  it.each(['a', 'abc-123_x.y', '0', 'A'.repeat(200)])('accepts container id %s', (id) => {
    expect(() => validateContainerId(id)).not.toThrow();
  });

  it.each(['', '-abc', '.x', 'a/b', 'a b', 'a;b', 'ä'])('rejects container id %j with CNI code 4', (id) => {
    const e = thrown(() => validateContainerId(id));
    expect(e).toBeInstanceOf(CniError);
    expect((e as CniError).cniError.code).toBe(4);
  });

  it.each(['eth0', 'virtlet-eth0', 'a'.repeat(15), 'x.y'])('accepts ifName %s', (n) => {
    expect(() => validateIfName(n)).not.toThrow();
  });

  it.each([
    ['', 'empty'],
    ['a'.repeat(16), 'too long'],
    ['.', '. or ..'],
    ['..', '. or ..'],
    ['a/b', '/ or :'],
    ['a:b', '/ or :'],
    ['a b', 'whitespace'],
    ['a\tb', 'whitespace'],
  ])('rejects ifName %j (%s)', (n, why) => {
    const e = thrown(() => validateIfName(n));
    expect((e as CniError).cniError.code).toBe(4);
    expect(e.message).toContain(why);
  });

  it('counts bytes, not characters, against the 15-byte limit', () => {
    expect(() => validateIfName('ééééééé1')).not.toThrow(); // 7 x 2 + 1 = 15 bytes
    expect(() => validateIfName('ééééééé12')).toThrow(/too long: "ééééééé12" has 16 bytes/);
  });

  it('rejects CNI_ARGS that cannot be written as K=V;K=V', () => {
    expect(() =>
      validateCniArgs([
        ['A', '1'],
        ['B', 'x=y'],
      ]),
    ).not.toThrow();
    const e = thrown(() =>
      validateCniArgs([
        ['A;B', '1'],
        ['C', 'x;y'],
        ['', 'z'],
      ]),
    );
    expect(e.message).toContain('key "A;B"');
    expect(e.message).toContain('value "x;y" of C');
    expect(e.message).toContain('key ""');
  });
});
