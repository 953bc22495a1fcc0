// The CNI client against the real plugins in /usr/lib/cni (bridge + host-local + tuning), in a throwaway
// netns with its own bridge and a /24 that nothing on the host uses; plus fake plugins (bash scripts) that
// fail, print garbage or hang.
import { randomBytes } from 'node:crypto';
import { chmod, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as delay } from 'node:timers/promises';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cacheFilePath } from '../../src/cni/cache.js';
import { CniClient } from '../../src/cni/client.js';
import { parseConfList, type NetworkConfigList, type RuntimeConf } from '../../src/cni/config.js';
import { CniPluginError } from '../../src/cni/errors.js';
import { spawnPluginExec } from '../../src/cni/exec.js';

const SYSTEM_BIN = '/usr/lib/cni';
const rand = randomBytes(3).toString('hex');
const NETNS = `vmpc-${rand}`;
const NETNS_PATH = `/var/run/netns/${NETNS}`;
const BRIDGE = `vmpcbr${rand}`; // 12 bytes
const NET_NAME = `vmpcnet-${rand}`;
const MAC = `02:65:02:${rand.slice(0, 2)}:${rand.slice(2, 4)}:${rand.slice(4, 6)}`;

let tmp = '';
let fakeBin = '';
let subnet = '';
let list: NetworkConfigList;
let client: CniClient;

async function ip(...args: string[]): Promise<string> {
  return (await execa('ip', args, { timeout: 10_000 })).stdout;
}

const ipToInt = (s: string): number => s.split('.').reduce((a, o) => a * 256 + Number(o), 0);

/** true when prefix a and prefix b overlap (IPv4 CIDRs) */
function overlaps(a: string, b: string): boolean {
  const [an, al] = a.split('/');
  const [bn, bl] = b.split('/');
  const len = Math.min(Number(al ?? 32), Number(bl ?? 32));
  const mask = len === 0 ? 0 : (0xffffffff << (32 - len)) >>> 0;
  return (ipToInt(an ?? '') & mask) >>> 0 === (ipToInt(bn ?? '') & mask) >>> 0;
}

/** A /24 in 10.250.0.0/16 that no address or route on the host touches. */
async function freeSubnet(): Promise<string> {
  const addrs = (
    JSON.parse(await ip('-j', '-4', 'addr')) as { addr_info: { local: string; prefixlen: number }[] }[]
  ).flatMap((l) => l.addr_info.map((a) => `${a.local}/${a.prefixlen}`));
  const routes = (JSON.parse(await ip('-j', '-4', 'route', 'show', 'table', 'all')) as { dst: string }[])
    .map((r) => (r.dst === 'default' ? '' : r.dst.includes('/') ? r.dst : `${r.dst}/32`))
    .filter((d) => d !== '' && !d.startsWith('0.0.0.0/0'));
  for (let i = 0; i < 50; i++) {
    const cand = `10.250.${1 + Math.floor(Math.random() * 254)}.0/24`;
    if (![...addrs, ...routes].some((p) => overlaps(p, cand))) return cand;
  }
  throw new Error('no free /24 in 10.250.0.0/16');
}

async function writeScript(name: string, body: string): Promise<void> {
  const p = join(fakeBin, name);
  await writeFile(p, `#!/bin/bash\n${body}\n`);
  await chmod(p, 0o755);
}

function rtFor(containerId: string): RuntimeConf {
  return {
    containerId,
    netns: NETNS_PATH,
    ifName: 'eth0',
    args: [
      ['IgnoreUnknown', '1'],
      ['K8S_POD_NAMESPACE', 'default'],
      ['K8S_POD_NAME', `vm-${containerId}`],
      ['K8S_POD_INFRA_CONTAINER_ID', containerId],
    ],
    capabilityArgs: { mac: MAC, portMappings: [{ hostPort: 8080, containerPort: 80, protocol: 'tcp' }] },
  };
}

/** A list of the fake network with these plugins, in this order. */
function fakeList(...types: string[]): NetworkConfigList {
  return parseConfList(
    Buffer.from(
      JSON.stringify({ cniVersion: '1.0.0', name: `fake-${rand}`, plugins: types.map((type) => ({ type })) }),
    ),
    `${tmp}/fake.conflist`,
  );
}

/** The addresses host-local holds for our network (its files are named by address). */
async function allocations(): Promise<string[]> {
  const dir = join(tmp, 'ipam', NET_NAME);
  const files = await readdir(dir).catch(() => [] as string[]);
  return files.filter((f) => /^\d+\.\d+\.\d+\.\d+$/.test(f));
}

async function eth0(): Promise<{ address: string; mtu: number; mac: string } | undefined> {
  const out = await execa('ip', ['-n', NETNS, '-j', 'addr', 'show', 'dev', 'eth0'], { reject: false, timeout: 10_000 });
  if (out.exitCode !== 0) return undefined;
  const [l] = JSON.parse(out.stdout) as {
    mtu: number;
    address: string;
    addr_info: { family: string; local: string; prefixlen: number }[];
  }[];
  const a = l?.addr_info.find((x) => x.family === 'inet');
  return l === undefined
    ? undefined
    : { address: a === undefined ? '' : `${a.local}/${a.prefixlen}`, mtu: l.mtu, mac: l.address };
}

/** A pid is gone when /proc has no entry for it or it is a zombie (waiting for a reaper that is not us). */
async function processGone(pid: number): Promise<boolean> {
  for (let i = 0; i < 100; i++) {
    const st = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => undefined);
    if (st === undefined || /^\d+ \(.*\) Z/.test(st)) return true;
    await delay(50);
  }
  return false;
}

beforeAll(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'vmpc-cni-'));
  fakeBin = join(tmp, 'bin');
  await execa('mkdir', ['-p', fakeBin]);
  subnet = await freeSubnet();
  await ip('netns', 'add', NETNS);
  list = parseConfList(
    Buffer.from(
      JSON.stringify({
        cniVersion: '1.0.0',
        name: NET_NAME,
        plugins: [
          {
            type: 'bridge',
            bridge: BRIDGE,
            isGateway: true,
            ipMasq: false,
            ipam: {
              type: 'host-local',
              ranges: [[{ subnet }]],
              routes: [{ dst: '0.0.0.0/0' }],
              dataDir: join(tmp, 'ipam'),
            },
          },
          { type: 'tuning', mtu: 1400, capabilities: { mac: true }, dataDir: join(tmp, 'tuning') },
        ],
      }),
    ),
    join(tmp, '10-test.conflist'),
  );
  client = new CniClient({ binDirs: [fakeBin, SYSTEM_BIN], cacheDir: join(tmp, 'cache'), timeoutMs: 30_000 });
});

afterAll(async () => {
  await execa('ip', ['netns', 'del', NETNS], { reject: false });
  await execa('ip', ['link', 'del', BRIDGE], { reject: false });
  await rm(tmp, { recursive: true, force: true });
  // nothing of ours is left
  expect((await ip('netns', 'list')).split('\n').some((l) => l.split(' ')[0] === NETNS)).toBe(false);
  expect((await execa('ip', ['link', 'show', BRIDGE], { reject: false })).exitCode).not.toBe(0);
  expect(await stat(tmp).catch(() => undefined)).toBeUndefined();
});

describe('real plugins: bridge + host-local + tuning', () => {
  it('VERSION', async () => {
    const v = await client.version('bridge');
    expect(v.supportedVersions).toContain('1.0.0');
  });

  it('ADD gives an IP on a veth in the netns, chains into tuning, caches 0600; CHECK passes; DEL frees everything; DEL twice is fine', async () => {
    const rt = rtFor(`c${rand}a`);
    const r = await client.add(list, rt);
    const ipCfg = r.ips[0];
    expect(ipCfg?.address).toMatch(new RegExp(`^${subnet.replace(/\.0\/24$/, '').replace(/\./g, '\\.')}\\.\\d+/24$`));
    expect(ipCfg?.gateway).toBe(subnet.replace(/\.0\/24$/, '.1'));
    const sandboxIf = r.interfaces[ipCfg?.interface ?? -1];
    expect(sandboxIf).toMatchObject({ name: 'eth0', sandbox: NETNS_PATH });

    const link = await eth0();
    expect(link?.address).toBe(ipCfg?.address);
    // tuning ran as the second plugin: its mtu, and the mac that reached it only through runtimeConfig
    expect(link?.mtu).toBe(1400);
    expect(link?.mac).toBe(MAC);

    const cache = cacheFilePath(join(tmp, 'cache'), NET_NAME, rt.containerId, 'eth0');
    expect((await stat(cache)).mode & 0o777).toBe(0o600);
    expect(JSON.parse(await readFile(cache, 'utf8'))).toMatchObject({
      kind: 'cniCacheV1',
      containerId: rt.containerId,
      networkName: NET_NAME,
      ifName: 'eth0',
    });
    expect(await client.cachedResult(list, rt)).toEqual(r);
    expect(await allocations()).toEqual([ipCfg?.address.split('/')[0]]);

    await client.check(list, rt);

    await client.del(list, rt);
    expect(await allocations()).toEqual([]);
    expect(await stat(cache).catch(() => undefined)).toBeUndefined();
    expect(await eth0()).toBeUndefined();
    const onBridge = await ip('-j', 'link', 'show', 'master', BRIDGE);
    expect(JSON.parse(onBridge === '' ? '[]' : onBridge)).toEqual([]);

    await client.del(list, rt);
  });

  it('DEL with a corrupt cache still releases the address', async () => {
    const rt = rtFor(`c${rand}b`);
    await client.add(list, rt);
    expect(await allocations()).toHaveLength(1);
    await writeFile(
      cacheFilePath(join(tmp, 'cache'), NET_NAME, rt.containerId, 'eth0'),
      '{"kind":"cniCacheV1", garbage',
    );
    await client.del(list, rt);
    expect(await allocations()).toEqual([]);
    expect(await eth0()).toBeUndefined();
    expect(await readdir(join(tmp, 'cache', 'results'))).toEqual([]);
  });
});

describe('misbehaving plugins', () => {
  it('a CNI error JSON on stdout becomes the error text', async () => {
    await writeScript(
      'vmpcfail',
      `cat >/dev/null\necho '{"cniVersion":"1.0.0","code":7,"msg":"bad thing","details":"in detail"}'\necho 'some log' >&2\nexit 1`,
    );
    const e = await client.add(fakeList('vmpcfail'), rtFor('f1')).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(CniPluginError);
    expect((e as CniPluginError).message).toBe('plugin vmpcfail ADD failed: [code 7] bad thing: in detail');
    expect(e).toMatchObject({
      exitCode: 1,
      timedOut: false,
      stderr: 'some log\\n',
      cniError: { code: 7, msg: 'bad thing', details: 'in detail' },
    });
  });

  it('garbage on stdout with exit 0 is not a result', async () => {
    await writeScript('vmpcgarbage', 'cat >/dev/null\necho "hello, world"');
    await expect(client.add(fakeList('vmpcgarbage'), rtFor('f2'))).rejects.toThrow(
      'plugin vmpcgarbage ADD returned a result that is not JSON: hello, world\\n',
    );
  });

  it('the plugin sees exactly the CNI environment and the conf on stdin', async () => {
    const out = join(tmp, 'seen');
    await writeScript(
      'vmpcecho',
      `cat > ${out}.stdin\nenv > ${out}.env\necho '{"cniVersion":"1.0.0","ips":[{"address":"10.9.9.9/32"}]}'`,
    );
    const r = await client.add(fakeList('vmpcecho'), rtFor('f3'));
    expect(r.ips).toEqual([{ address: '10.9.9.9/32' }]);
    const env = (await readFile(`${out}.env`, 'utf8'))
      .split('\n')
      .filter((l) => l !== '' && !/^(PWD|SHLVL|_)=/.test(l))
      .sort();
    expect(env).toEqual(
      [
        'CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=vm-f3;K8S_POD_INFRA_CONTAINER_ID=f3',
        'CNI_COMMAND=ADD',
        'CNI_CONTAINERID=f3',
        'CNI_IFNAME=eth0',
        `CNI_NETNS=${NETNS_PATH}`,
        `CNI_PATH=${fakeBin}:${SYSTEM_BIN}`,
        `PATH=${process.env.PATH}`,
      ].sort(),
    );
    expect(JSON.parse(await readFile(`${out}.stdin`, 'utf8'))).toEqual({
      type: 'vmpcecho',
      name: `fake-${rand}`,
      cniVersion: '1.0.0',
    });
    await client.del(fakeList('vmpcecho'), rtFor('f3'));
  });

  it('the plugin is reaped once its run is over: no zombie of it stays behind', async () => {
    const out = join(tmp, 'reaped');
    await writeScript(
      'vmpcreap',
      `cat >/dev/null\necho $$ > ${out}.pid\necho '{"cniVersion":"1.0.0","ips":[{"address":"10.9.9.7/32"}]}'`,
    );
    await client.add(fakeList('vmpcreap'), rtFor('f8'));
    const pid = Number((await readFile(`${out}.pid`, 'utf8')).trim());
    // its status was read at its exit; the reap itself follows a few milliseconds later (native/spawn.c)
    let gone = false;
    for (let i = 0; i < 100 && !gone; i++) {
      gone = (await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => undefined)) === undefined;
      if (!gone) await delay(10);
    }
    expect(gone).toBe(true);
    await client.del(fakeList('vmpcreap'), rtFor('f8'));
  });

  it('the plugin leads its own session, with SIGPIPE at its default, no signal blocked and only stdio open', async () => {
    const out = join(tmp, 'proc');
    // read by bash's builtins where they can be: a child of bash would show bash's masks around its fork
    await writeScript(
      'vmpcproc',
      `cat >/dev/null\nps -o pid=,sid=,pgid= -p $$ > ${out}.ids\nwhile read -r k v; do case $k in SigBlk:|SigIgn:) echo "$k $v";; esac; done < /proc/$$/status > ${out}.sig\nls /proc/$$/fd > ${out}.fds\necho '{"cniVersion":"1.0.0","ips":[{"address":"10.9.9.8/32"}]}'`,
    );
    await client.add(fakeList('vmpcproc'), rtFor('f7'));
    const [pid, sid, pgid] = (await readFile(`${out}.ids`, 'utf8')).trim().split(/\s+/).map(Number);
    expect(sid).toBe(pid);
    expect(pgid).toBe(pid);
    const sig = Object.fromEntries(
      (await readFile(`${out}.sig`, 'utf8'))
        .trim()
        .split('\n')
        .map((l) => l.split(/:\s+/)),
    );
    expect(BigInt(`0x${sig.SigBlk}`)).toBe(0n);
    // SIGPIPE is bit 12 (signal 13): node ignores it, the plugin must not inherit that
    expect(BigInt(`0x${sig.SigIgn}`) & (1n << 12n)).toBe(0n);
    // beyond stdio and bash's script fd (255): only what this process itself inherited without close-on-exec
    const flags = (fd: number): number | undefined => {
      try {
        return parseInt(/flags:\s+(\d+)/.exec(readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8'))?.[1] ?? '0', 8);
      } catch {
        return undefined; // the listing's own fd, closed by now
      }
    };
    const inherited = readdirSync('/proc/self/fd')
      .map(Number)
      .filter((fd) => fd > 2 && ((flags(fd) ?? 0o2000000) & 0o2000000) === 0);
    const seen = (await readFile(`${out}.fds`, 'utf8')).trim().split('\n').map(Number);
    expect(seen.sort((a, b) => a - b)).toEqual([...new Set([0, 1, 2, 255, ...inherited])].sort((a, b) => a - b));
    await client.del(fakeList('vmpcproc'), rtFor('f7'));
  });

  it("a plugin that floods its output is killed and the error says so; one that cannot be exec'd says why", async () => {
    await writeScript('vmpcflood', 'cat >/dev/null\nexec yes');
    const small = new CniClient({
      binDirs: [fakeBin],
      cacheDir: join(tmp, 'cache'),
      exec: spawnPluginExec({ maxBufferBytes: 4096, killGraceMs: 300 }),
    });
    const e = await small.add(fakeList('vmpcflood'), rtFor('f8')).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(CniPluginError);
    expect((e as Error).message).toBe(
      'plugin vmpcflood ADD failed: its output exceeded the size limit of 4096 bytes (killed)',
    );
    await writeFile(join(fakeBin, 'vmpcgarbage'), Buffer.from([0x7f, 0x45, 0x4c, 0x46, 0, 0, 0, 0]));
    await chmod(join(fakeBin, 'vmpcgarbage'), 0o755);
    const g = await client.add(fakeList('vmpcgarbage'), rtFor('f9')).catch((x: unknown) => x);
    expect((g as Error).message).toBe(
      `plugin vmpcgarbage ADD could not be run: spawn ${join(fakeBin, 'vmpcgarbage')}: ENOEXEC (Exec format error)`,
    );
  });

  it('a plugin that hangs (and ignores SIGTERM) is killed with SIGKILL after the timeout, its children too', async () => {
    const pids = join(tmp, 'hang');
    await writeScript(
      'vmpchang',
      `echo $$ > ${pids}.leader\ntrap '' TERM\nsleep 1000 &\necho $! > ${pids}.child\nwait`,
    );
    const fast = new CniClient({
      binDirs: [fakeBin],
      cacheDir: join(tmp, 'cache'),
      timeoutMs: 500,
      exec: spawnPluginExec({ killGraceMs: 300 }),
    });
    const e = await fast.add(fakeList('vmpchang'), rtFor('f4')).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(CniPluginError);
    expect(e).toMatchObject({ timedOut: true, signal: 'SIGKILL', plugin: 'vmpchang', verb: 'ADD' });
    expect((e as Error).message).toBe('plugin vmpchang ADD timed out after 500 ms (killed with SIGKILL)');
    const leader = Number(await readFile(`${pids}.leader`, 'utf8'));
    const child = Number(await readFile(`${pids}.child`, 'utf8'));
    expect(await processGone(leader)).toBe(true);
    expect(await processGone(child)).toBe(true);
  });

  it('an abort kills a running plugin', async () => {
    const pids = join(tmp, 'abort');
    await writeScript('vmpcslow', `echo $$ > ${pids}.leader\nexec sleep 1000`);
    const ac = new AbortController();
    const p = client.add(fakeList('vmpcslow'), rtFor('f5'), ac.signal).catch((x: unknown) => x);
    for (let i = 0; i < 200 && (await stat(`${pids}.leader`).catch(() => undefined)) === undefined; i++)
      await delay(25);
    ac.abort();
    const e = await p;
    expect((e as Error).message).toBe('plugin vmpcslow ADD aborted (killed with SIGTERM)');
    expect(await processGone(Number(await readFile(`${pids}.leader`, 'utf8')))).toBe(true);
  });

  it('with a hold, the first plugin runs before its config comes and reads it once the hold lets go', async () => {
    const out = join(tmp, 'held');
    await writeScript(
      'vmpcheld',
      `echo $$ > ${out}.pid\ncat > ${out}.stdin\necho '{"cniVersion":"1.0.0","ips":[{"address":"10.9.9.5/32"}]}'`,
    );
    let go!: () => void;
    const until = new Promise<void>((r) => (go = r));
    let execd = false;
    const adding = client.addDeferred(fakeList('vmpcheld'), rtFor('f9'), undefined, {
      until,
      onExec: () => (execd = true),
    });
    // the plugin is up and waiting on its stdin: nothing of the config has come yet
    for (let i = 0; i < 200 && (await stat(`${out}.pid`).catch(() => undefined)) === undefined; i++) await delay(10);
    await delay(100);
    expect(await readFile(`${out}.stdin`, 'utf8')).toBe('');
    expect(execd, 'onExec called').toBe(true);
    go();
    const { result, settled } = await adding;
    await settled();
    expect(result.ips).toEqual([{ address: '10.9.9.5/32' }]);
    expect(JSON.parse(await readFile(`${out}.stdin`, 'utf8'))).toMatchObject({ type: 'vmpcheld', cniVersion: '1.0.0' });
    await client.del(fakeList('vmpcheld'), rtFor('f9'));
  });

  it('a plugin whose hold rejects is killed before it has its config, and the ADD fails with that reason', async () => {
    const out = join(tmp, 'withheld');
    await writeScript('vmpcwithheld', `echo $$ > ${out}.pid\ncat > ${out}.stdin\ntouch ${out}.ran\necho '{}'`);
    let fail!: (e: Error) => void;
    const until = new Promise<void>((_, rej) => (fail = rej));
    const adding = client.addDeferred(fakeList('vmpcwithheld'), rtFor('f10'), undefined, { until });
    for (let i = 0; i < 200 && (await stat(`${out}.pid`).catch(() => undefined)) === undefined; i++) await delay(10);
    const why = new Error('the record could not be written');
    fail(why);
    await expect(adding).rejects.toBe(why);
    expect(await processGone(Number(await readFile(`${out}.pid`, 'utf8')))).toBe(true);
    expect(await stat(`${out}.ran`).catch(() => undefined)).toBeUndefined();
    expect(await readFile(`${out}.stdin`, 'utf8')).toBe('');
    // nothing was cached for it
    expect(await stat(cacheFilePath(join(tmp, 'cache'), `fake-${rand}`, 'f10', 'eth0')).catch(() => undefined)).toBe(
      undefined,
    );
  });

  it('a DEL whose hold rejects: no plugin of the chain gets its config, the first one killed without it', async () => {
    const out = join(tmp, 'deheld');
    for (const n of ['vmpcdel1', 'vmpcdel2'])
      await writeScript(n, `echo $$ > ${out}.${n}.pid\ncat > ${out}.${n}.stdin\ntouch ${out}.${n}.ran`);
    const list = fakeList('vmpcdel1', 'vmpcdel2');
    let fail!: (e: Error) => void;
    const until = new Promise<void>((_, rej) => (fail = rej));
    let execd = false;
    const deleting = client.del(list, rtFor('f11'), undefined, { until, onExec: () => (execd = true) });
    // DEL runs the list in reverse: vmpcdel2 first
    for (let i = 0; i < 200 && (await stat(`${out}.vmpcdel2.pid`).catch(() => undefined)) === undefined; i++)
      await delay(10);
    expect(execd).toBe(true);
    fail(new Error('the record could not be written'));
    await expect(deleting).rejects.toThrow('2 plugins failed');
    expect(await processGone(Number(await readFile(`${out}.vmpcdel2.pid`, 'utf8')))).toBe(true);
    for (const n of ['vmpcdel1', 'vmpcdel2']) {
      expect(await stat(`${out}.${n}.ran`).catch(() => undefined), `${n} ran`).toBeUndefined();
      expect(await readFile(`${out}.${n}.stdin`, 'utf8').catch(() => ''), `${n}'s config`).toBe('');
    }
  });

  it("a held DEL whose first plugin is missing: the next one is exec'd (onExec), waits for the hold, then runs", async () => {
    const out = join(tmp, 'delnext');
    await writeScript('vmpcdel3', `echo $$ > ${out}.pid\ncat > ${out}.stdin`);
    const list = fakeList('vmpcdel3', 'vmpc-gone');
    let go!: () => void;
    const until = new Promise<void>((r) => (go = r));
    let execd!: () => void;
    const exec = new Promise<void>((r) => (execd = r));
    const deleting = client.del(list, rtFor('f12'), undefined, { until, onExec: execd });
    await exec;
    await delay(50);
    expect(await readFile(`${out}.stdin`, 'utf8'), 'its config before the hold lets go').toBe('');
    go();
    await expect(deleting).rejects.toThrow('CNI plugin "vmpc-gone" not found');
    expect(JSON.parse(await readFile(`${out}.stdin`, 'utf8'))).toMatchObject({ type: 'vmpcdel3' });
  });

  it('a missing plugin names the dirs searched', async () => {
    await expect(client.add(fakeList('vmpc-nope'), rtFor('f6'))).rejects.toThrow(
      `CNI plugin "vmpc-nope" not found in ${fakeBin}, ${SYSTEM_BIN}`,
    );
  });
});
