import { mkdtemp, readFile, rm, stat, writeFile, mkdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { cacheFilePath } from '../../src/cni/cache.js';
import { CniClient } from '../../src/cni/client.js';
import { parseConfList, type NetworkConfigList, type RuntimeConf } from '../../src/cni/config.js';
import { CniError, CniPluginError } from '../../src/cni/errors.js';
import { RecordingExec } from '../fixtures/cni/fake-exec.js';

const BIN = ['/opt/cni/bin', '/usr/lib/cni'];

function list(version = '1.0.0', extra: Record<string, unknown> = {}): NetworkConfigList {
  return parseConfList(
    Buffer.from(
      JSON.stringify({
        cniVersion: version,
        name: 'podnet',
        ...extra,
        plugins: [
          { type: 'bridge', bridge: 'cni0', ipam: { type: 'host-local', subnet: '10.1.0.0/24' } },
          { type: 'tuning', capabilities: { mac: true } },
          { type: 'portmap', capabilities: { portMappings: true } },
        ],
      }),
    ),
    '/etc/cni/net.d/10-podnet.conflist',
  );
}

const rt: RuntimeConf = {
  containerId: 'c0ffee',
  netns: '/var/run/netns/vm-1',
  ifName: 'eth0',
  args: [
    ['IgnoreUnknown', '1'],
    ['K8S_POD_NAMESPACE', 'default'],
    ['K8S_POD_NAME', 'vm-1'],
    ['K8S_POD_INFRA_CONTAINER_ID', 'c0ffee'],
  ],
  capabilityArgs: {
    mac: '02:00:00:00:00:01',
    portMappings: [{ hostPort: 80, containerPort: 8080, protocol: 'tcp' }],
    bandwidth: { ingressRate: 1 },
  },
};

const bridgeResult = {
  cniVersion: '1.0.0',
  interfaces: [
    { name: 'cni0', mac: '0a:00:00:00:00:01' },
    { name: 'veth1', mac: '0a:00:00:00:00:02' },
    { name: 'eth0', mac: '0a:00:00:00:00:03', sandbox: '/var/run/netns/vm-1' },
  ],
  ips: [{ interface: 2, address: '10.1.0.5/24', gateway: '10.1.0.1' }],
  routes: [{ dst: '0.0.0.0/0', gw: '10.1.0.1' }],
  dns: { nameservers: ['10.1.0.1'] },
};
// tuning set the MAC the runtime asked for, and passes the rest through
const tuningResult = {
  ...bridgeResult,
  interfaces: [
    bridgeResult.interfaces[0],
    bridgeResult.interfaces[1],
    { ...bridgeResult.interfaces[2], mac: '02:00:00:00:00:01' },
  ],
};

let cacheDir = '';
let exec: RecordingExec;
let client: CniClient;

function happyExec(): RecordingExec {
  return new RecordingExec()
    .reply('bridge:ADD', { stdout: JSON.stringify(bridgeResult) })
    .reply('tuning:ADD', { stdout: JSON.stringify(tuningResult) })
    .reply('portmap:ADD', (c) => ({ stdout: JSON.stringify(c.conf.prevResult) }));
}

async function thrown(p: Promise<unknown>): Promise<Error> {
  try {
    await p;
  } catch (e) {
    return e as Error;
  }
  throw new Error('did not reject');
}

beforeEach(async () => {
  cacheDir = await mkdtemp(join(tmpdir(), 'vmpc-cache-'));
  exec = happyExec();
  client = new CniClient({ binDirs: BIN, cacheDir, exec, timeoutMs: 1234 });
});
afterEach(async () => {
  await rm(cacheDir, { recursive: true, force: true });
});

const cachePath = () => cacheFilePath(cacheDir, 'podnet', 'c0ffee', 'eth0');

describe('ADD', () => {
  it('addDeferred returns the result at once; settled() waits for the cache file and fails as add does when it cannot be written', async () => {
    const d = await client.addDeferred(list(), rt);
    expect(d.result).toEqual(tuningResult);
    await d.settled();
    expect(JSON.parse(await readFile(cachePath(), 'utf8')).result).toEqual(tuningResult);
    // a cache dir that cannot be made: the plugins ran, the ADD still fails (the caller runs DEL)
    await writeFile(join(cacheDir, 'file'), 'x');
    const broken = new CniClient({
      binDirs: BIN,
      cacheDir: join(cacheDir, 'file', 'sub'),
      exec: happyExec(),
      timeoutMs: 1234,
    });
    const e = await broken.addDeferred(list(), rt);
    expect((await thrown(e.settled())).message).toMatch(/^ADD network podnet: cache the result in .*file\/sub\//);
    expect((await thrown(broken.add(list(), rt))).message).toMatch(/^ADD network podnet: cache the result in /);
  });

  it('runs the plugins in order, chaining prevResult, and returns the last result normalised', async () => {
    const r = await client.add(list(), rt);
    expect(exec.calls.map((c) => `${c.plugin}:${c.verb}`)).toEqual(['bridge:ADD', 'tuning:ADD', 'portmap:ADD']);
    const [b, t, p] = exec.calls;
    expect(b?.conf).not.toHaveProperty('prevResult');
    expect(t?.conf.prevResult).toEqual(bridgeResult);
    expect(p?.conf.prevResult).toEqual(tuningResult);
    expect(r).toEqual(tuningResult);
  });

  it('injects name, cniVersion and only the declared capabilities', async () => {
    await client.add(list(), rt);
    const [b, t, p] = exec.calls;
    for (const c of exec.calls) expect(c.conf).toMatchObject({ name: 'podnet', cniVersion: '1.0.0' });
    expect(b?.conf).not.toHaveProperty('runtimeConfig');
    expect(t?.conf.runtimeConfig).toEqual({ mac: '02:00:00:00:00:01' });
    expect(p?.conf.runtimeConfig).toEqual({ portMappings: [{ hostPort: 80, containerPort: 8080, protocol: 'tcp' }] });
  });

  it('gives each plugin the CNI environment, its timeout, and looks plugins up in binDirs', async () => {
    await client.add(list(), rt);
    const env = exec.calls[0]?.env ?? {};
    expect(Object.keys(env).sort()).toEqual([
      'CNI_ARGS',
      'CNI_COMMAND',
      'CNI_CONTAINERID',
      'CNI_IFNAME',
      'CNI_NETNS',
      'CNI_PATH',
      'PATH',
    ]);
    expect(env).toMatchObject({
      CNI_COMMAND: 'ADD',
      CNI_CONTAINERID: 'c0ffee',
      CNI_NETNS: '/var/run/netns/vm-1',
      CNI_IFNAME: 'eth0',
      CNI_ARGS: 'IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=vm-1;K8S_POD_INFRA_CONTAINER_ID=c0ffee',
      CNI_PATH: '/opt/cni/bin:/usr/lib/cni',
    });
    expect(exec.calls.every((c) => c.timeoutMs === 1234)).toBe(true);
    expect(exec.lookups).toEqual(['bridge', 'tuning', 'portmap']);
  });

  it('converts prevResult to the list version (0.3.1 list, plugins answering 0.3.1)', async () => {
    const v031 = {
      ...bridgeResult,
      cniVersion: '0.3.1',
      ips: [{ version: '4', interface: 2, address: '10.1.0.5/24', gateway: '10.1.0.1' }],
    };
    exec = new RecordingExec().reply('bridge:ADD', { stdout: JSON.stringify(v031) });
    exec
      .reply('tuning:ADD', (c) => ({ stdout: JSON.stringify(c.conf.prevResult) }))
      .reply('portmap:ADD', (c) => ({ stdout: JSON.stringify(c.conf.prevResult) }));
    client = new CniClient({ binDirs: BIN, cacheDir, exec });
    const r = await client.add(list('0.3.1'), rt);
    expect(exec.calls[1]?.conf.prevResult).toEqual(v031);
    expect(r.ips).toEqual([{ interface: 2, address: '10.1.0.5/24', gateway: '10.1.0.1' }]);
    expect(r.cniVersion).toBe('0.3.1');
  });

  it('normalises a 0.2.0 result (ip4 -> ips, ip4.routes -> routes)', async () => {
    const v020 = {
      cniVersion: '0.2.0',
      ip4: { ip: '10.1.0.5/24', gateway: '10.1.0.1', routes: [{ dst: '0.0.0.0/0' }] },
      dns: {},
    };
    exec = new RecordingExec().reply('bridge:ADD', { stdout: JSON.stringify(v020) });
    client = new CniClient({ binDirs: BIN, cacheDir, exec });
    const one = parseConfList(
      Buffer.from(JSON.stringify({ cniVersion: '0.2.0', name: 'podnet', type: 'bridge' })),
      'x.conf',
    );
    expect(await client.add(one, rt)).toEqual({
      cniVersion: '0.2.0',
      interfaces: [],
      ips: [{ address: '10.1.0.5/24', gateway: '10.1.0.1' }],
      routes: [{ dst: '0.0.0.0/0' }],
      dns: {},
    });
  });

  it("caches the result atomically in libcni's format, mode 0600", async () => {
    const l = list();
    await client.add(l, rt);
    const st = await stat(cachePath());
    expect(st.mode & 0o777).toBe(0o600);
    const rec = JSON.parse(await readFile(cachePath(), 'utf8'));
    expect(rec).toEqual({
      kind: 'cniCacheV1',
      containerId: 'c0ffee',
      config: l.bytes.toString('base64'),
      ifName: 'eth0',
      networkName: 'podnet',
      netns: '/var/run/netns/vm-1',
      cniArgs: rt.args,
      capabilityArgs: rt.capabilityArgs,
      result: tuningResult,
    });
    expect(await client.cachedResult(l, rt)).toEqual(tuningResult);
  });

  it('says which plugin failed halfway and surfaces its CNI error; nothing is cached', async () => {
    exec.reply('tuning:ADD', {
      exitCode: 1,
      stdout: JSON.stringify({ cniVersion: '1.0.0', code: 7, msg: 'invalid sysctl', details: 'net.core.nope' }),
    });
    const e = await thrown(client.add(list(), rt));
    expect(e).toBeInstanceOf(CniPluginError);
    expect(e.message).toBe('plugin tuning ADD failed: [code 7] invalid sysctl: net.core.nope');
    expect((e as CniPluginError).cniError).toEqual({
      cniVersion: '1.0.0',
      code: 7,
      msg: 'invalid sysctl',
      details: 'net.core.nope',
    });
    expect((e as CniPluginError).exitCode).toBe(1);
    expect(exec.calls.map((c) => c.plugin)).toEqual(['bridge', 'tuning']);
    await expect(stat(cachePath())).rejects.toThrow(/ENOENT/);
  });

  it('takes the error JSON from stderr when stdout has none, and escapes stderr', async () => {
    exec.reply('bridge:ADD', { exitCode: 2, stderr: '{"code":11,"msg":"try again"}' });
    expect((await thrown(client.add(list(), rt))).message).toBe('plugin bridge ADD failed: [code 11] try again');
    exec.reply('bridge:ADD', { exitCode: 2, stderr: 'panic: boom\n\x1b[31mINFO fake log line' });
    const e = (await thrown(client.add(list(), rt))) as CniPluginError;
    expect(e.message).toBe('plugin bridge ADD failed: exit code 2: panic: boom\\n\\x1b[31mINFO fake log line');
    expect(e.stderr).not.toMatch(/[\n\x1b]/);
  });

  it('rejects a result that is not JSON', async () => {
    exec.reply('bridge:ADD', { stdout: 'I am not JSON\n' });
    const e = await thrown(client.add(list(), rt));
    expect(e.message).toBe('plugin bridge ADD returned a result that is not JSON: I am not JSON\\n');
    expect(exec.calls).toHaveLength(1);
  });

  it('rejects a result of an unknown version with a CNI version error', async () => {
    exec.reply('bridge:ADD', { stdout: JSON.stringify({ ...bridgeResult, cniVersion: '3.0.0' }) });
    const e = await thrown(client.add(list(), rt));
    expect(e.message).toMatch(
      /^plugin bridge ADD returned an unusable result: \[code 1\] incompatible CNI versions: result version "3.0.0"/,
    );
    expect((e.cause as CniError).cniError.code).toBe(1);
  });

  it('validates the attachment before running anything', async () => {
    for (const bad of [
      { containerId: '' },
      { containerId: 'a/b' },
      { ifName: 'a-very-long-ifname' },
      { ifName: 'a:b' },
      { netns: '' },
      { args: [['A', 'x;y']] as [string, string][] },
    ]) {
      await expect(client.add(list(), { ...rt, ...bad })).rejects.toBeInstanceOf(CniError);
    }
    expect(exec.calls).toHaveLength(0);
    expect(exec.lookups).toHaveLength(0);
  });

  it('fails before running anything when a plugin is missing', async () => {
    exec.missing.add('portmap');
    await expect(client.add(list(), rt)).rejects.toThrow(
      'CNI plugin "portmap" not found in /opt/cni/bin, /usr/lib/cni',
    );
    expect(exec.calls).toHaveLength(0);
  });

  it('stops at an aborted signal before the next plugin', async () => {
    const ac = new AbortController();
    exec.reply('bridge:ADD', () => {
      ac.abort(new Error('request cancelled'));
      return { stdout: JSON.stringify(bridgeResult) };
    });
    await expect(client.add(list(), rt, ac.signal)).rejects.toThrow('ADD network podnet aborted before plugin tuning');
    expect(exec.calls).toHaveLength(1);
  });
});

describe('DEL', () => {
  it('runs the plugins in reverse with the cached result as prevResult, then removes the cache', async () => {
    await client.add(list(), rt);
    exec.calls.length = 0;
    await client.del(list(), rt);
    expect(exec.calls.map((c) => `${c.plugin}:${c.verb}`)).toEqual(['portmap:DEL', 'tuning:DEL', 'bridge:DEL']);
    for (const c of exec.calls) {
      expect(c.conf.prevResult).toEqual(tuningResult);
      expect(c.env.CNI_COMMAND).toBe('DEL');
    }
    expect(exec.calls[0]?.conf.runtimeConfig).toEqual({ portMappings: rt.capabilityArgs?.portMappings });
    await expect(stat(cachePath())).rejects.toThrow(/ENOENT/);
  });

  it('succeeds twice, the second time without prevResult', async () => {
    await client.add(list(), rt);
    await client.del(list(), rt);
    exec.calls.length = 0;
    await client.del(list(), rt);
    expect(exec.calls).toHaveLength(3);
    expect(exec.calls.some((c) => 'prevResult' in c.conf)).toBe(false);
  });

  it.each([
    ['not JSON', '{"kind":'],
    ['wrong kind', JSON.stringify({ kind: 'other', result: {} })],
    [
      'another attachment',
      JSON.stringify({
        kind: 'cniCacheV1',
        containerId: 'other',
        ifName: 'eth0',
        networkName: 'podnet',
        result: bridgeResult,
      }),
    ],
    [
      'a result of an unknown version',
      JSON.stringify({
        kind: 'cniCacheV1',
        containerId: 'c0ffee',
        ifName: 'eth0',
        networkName: 'podnet',
        result: { cniVersion: '5.0.0' },
      }),
    ],
  ])('treats a corrupt cache (%s) as no prevResult and removes it', async (_why, text) => {
    await mkdir(join(cacheDir, 'results'), { recursive: true });
    await writeFile(cachePath(), text);
    await client.del(list(), rt);
    expect(exec.calls).toHaveLength(3);
    expect(exec.calls.some((c) => 'prevResult' in c.conf)).toBe(false);
    await expect(stat(cachePath())).rejects.toThrow(/ENOENT/);
    expect(await client.cachedResult(list(), rt)).toBeUndefined();
  });

  it('reads a legacy cache file (a bare result)', async () => {
    await mkdir(join(cacheDir, 'results'), { recursive: true });
    await writeFile(cachePath(), JSON.stringify(bridgeResult));
    await client.del(list(), rt);
    expect(exec.calls[0]?.conf.prevResult).toEqual(bridgeResult);
  });

  it('sends no prevResult to a list before 0.4.0 (libcni)', async () => {
    exec.reply('bridge:ADD', {
      stdout: JSON.stringify({ ...bridgeResult, cniVersion: '0.3.1', ips: [{ version: '4', address: '10.1.0.5/24' }] }),
    });
    exec.reply('tuning:ADD', (c) => ({ stdout: JSON.stringify(c.conf.prevResult) }));
    await client.add(list('0.3.1'), rt);
    exec.calls.length = 0;
    await client.del(list('0.3.1'), rt);
    expect(exec.calls.some((c) => 'prevResult' in c.conf)).toBe(false);
    await expect(stat(cachePath())).rejects.toThrow(/ENOENT/);
  });

  it('goes on past a failing plugin, reports all failures and keeps the cache for the retry', async () => {
    await client.add(list(), rt);
    exec.calls.length = 0;
    exec.reply('portmap:DEL', { exitCode: 1, stdout: JSON.stringify({ code: 5, msg: 'iptables locked' }) });
    const e = await thrown(client.del(list(), rt));
    expect(e).toBeInstanceOf(CniPluginError);
    expect(e.message).toBe('plugin portmap DEL failed: [code 5] iptables locked');
    expect(exec.calls.map((c) => c.plugin)).toEqual(['portmap', 'tuning', 'bridge']);
    expect(await client.cachedResult(list(), rt)).toEqual(tuningResult);

    exec.reply('bridge:DEL', { exitCode: 1, stderr: 'netns gone' });
    const e2 = await thrown(client.del(list(), rt));
    expect(e2.message).toBe(
      'DEL network podnet: 2 plugins failed: plugin portmap DEL failed: [code 5] iptables locked; plugin bridge DEL failed: exit code 1: netns gone',
    );
    expect(e2.cause).toBeInstanceOf(AggregateError);

    exec.replies.delete('portmap:DEL');
    exec.replies.delete('bridge:DEL');
    await client.del(list(), rt);
    expect(await client.cachedResult(list(), rt)).toBeUndefined();
  });

  it('allows an empty netns (the namespace may be gone)', async () => {
    await client.del(list(), { ...rt, netns: '' });
    expect(exec.calls[0]?.env.CNI_NETNS).toBe('');
  });

  it('validates before running anything', async () => {
    await expect(client.del(list(), { ...rt, ifName: '..' })).rejects.toThrow(/interface name is \. or \.\./);
    expect(exec.calls).toHaveLength(0);
  });
});

describe('CHECK', () => {
  it('runs the plugins in order with the cached result', async () => {
    await client.add(list(), rt);
    exec.calls.length = 0;
    await client.check(list(), rt);
    expect(exec.calls.map((c) => `${c.plugin}:${c.verb}`)).toEqual(['bridge:CHECK', 'tuning:CHECK', 'portmap:CHECK']);
    for (const c of exec.calls) expect(c.conf.prevResult).toEqual(tuningResult);
  });

  it('is skipped when the list disables it', async () => {
    await client.check(list('1.0.0', { disableCheck: true }), rt);
    expect(exec.calls).toHaveLength(0);
  });

  it('is refused before 0.4.0, and without a cached result', async () => {
    await expect(client.check(list('0.3.1'), rt)).rejects.toThrow(
      '[code 1] configuration version "0.3.1" does not support the CHECK command',
    );
    await expect(client.check(list(), rt)).rejects.toThrow(
      'CHECK network podnet for c0ffee/eth0: no usable cached ADD result',
    );
    expect(exec.calls).toHaveLength(0);
  });

  it('surfaces a failing CHECK', async () => {
    await client.add(list(), rt);
    exec.reply('bridge:CHECK', { exitCode: 1, stdout: JSON.stringify({ code: 100, msg: 'bridge cni0 has no IP' }) });
    await expect(client.check(list(), rt)).rejects.toThrow(
      'plugin bridge CHECK failed: [code 100] bridge cni0 has no IP',
    );
  });
});

describe('VERSION and options', () => {
  it('asks the plugin with CNI_COMMAND=VERSION', async () => {
    exec.reply('bridge:VERSION', { stdout: '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}' });
    expect(await client.version('bridge')).toEqual({ cniVersion: '1.0.0', supportedVersions: ['0.4.0', '1.0.0'] });
    expect(exec.calls[0]?.conf).toEqual({ cniVersion: '1.1.0' });
    expect(exec.calls[0]?.env).toMatchObject({
      CNI_COMMAND: 'VERSION',
      CNI_CONTAINERID: '',
      CNI_PATH: '/opt/cni/bin:/usr/lib/cni',
    });
    exec.reply('bridge:VERSION', { stdout: '{}' });
    await expect(client.version('bridge')).rejects.toThrow(
      'plugin bridge VERSION: the answer has no cniVersion and supportedVersions: {}',
    );
  });

  it('checks its options', () => {
    expect(() => new CniClient({ binDirs: [], cacheDir: '/x' })).toThrow('binDirs is empty');
    expect(() => new CniClient({ binDirs: ['rel/dir'], cacheDir: 'rel', timeoutMs: 0 })).toThrow(
      'CNI client options: bin dir "rel/dir" is not an absolute path without \':\'; cacheDir "rel" is not an absolute path; timeoutMs 0 is not a positive integer',
    );
  });
});
