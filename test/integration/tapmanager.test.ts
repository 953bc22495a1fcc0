// tapmanager as an operator runs it: a child process on a temporary socket, Debian's CNI plugins, the real kernel.
// Every pod key and CNI network is unique to this file; every test checks that nothing of its own is left.
import { describe, it, expect, beforeAll, afterAll } from 'vitest';
import {
  readFileSync,
  readdirSync,
  mkdtempSync,
  writeFileSync,
  chmodSync,
  mkdirSync,
  openSync,
  closeSync,
  rmSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';
import {
  startDaemon,
  stopDaemonAndNet,
  removeDir,
  firstPodDone,
  fdsSettled,
  BIN,
  type Daemon,
} from '../helpers/daemon.js';
import { makeCniConf, type CniTestNet, SYSTEM_CNI_BIN } from '../helpers/cniconf.js';
import { runVmwrapper, stubTaps, ambientFds, STUB_EMULATOR } from '../helpers/vmwrapper.js';
import { processesNaming } from '../helpers/baseline.js';
import { FdClient } from '../../src/client/fdclient.js';
import { native } from '../../src/native.js';
import { encodeHeader } from '../../src/protocol/header.js';
import { base64ToMac } from '../../src/protocol/mac.js';
import { vhostUsable } from '../../src/vmwrapper/queues.js';

const rand = () => randomBytes(3).toString('hex');
const desc = (key: string, podName = 'vm-a') => ({ podId: key, podNs: 'default', podName, DNS: null });

interface IpLink {
  ifname: string;
  address: string;
  master?: string;
  mtu: number;
  operstate: string;
  flags: string[];
  addr_info: { family: string; local: string; prefixlen: number }[];
}

async function links(ns: string): Promise<Map<string, IpLink>> {
  const r = await execa('ip', ['-n', ns, '-j', 'addr', 'show'], { timeout: 10_000 });
  return new Map((JSON.parse(r.stdout) as IpLink[]).map((l) => [l.ifname, l]));
}

async function netnsExists(name: string): Promise<boolean> {
  const r = await execa('ip', ['netns', 'list'], { timeout: 10_000 });
  return r.stdout.split('\n').some((l) => l.split(' ')[0] === name);
}

/**
 * Raw connection for malformed input: write bytes, read one reply (header + dataSize bytes); with untilEof, read on
 * until the server closes the connection (and fail if it does not).
 */
function rawExchange(socket: string, bytes: Buffer, opts: { timeoutMs?: number; untilEof?: boolean } = {}): Buffer {
  const n = native();
  const fd = n.connectUnix(socket);
  try {
    n.setTimeouts(fd, opts.timeoutMs ?? 10_000);
    if (bytes.length > 0) n.writeAll(fd, bytes);
    let buf = Buffer.alloc(0);
    for (;;) {
      if (!opts.untilEof && buf.length >= 77 && buf.length >= 77 + buf.readUInt32BE(5)) return buf;
      const r = n.recvMsg(fd, 65536, 0);
      if (r.data.length === 0) return buf;
      buf = Buffer.concat([buf, r.data]);
    }
  } finally {
    n.close(fd);
  }
}

function errorText(reply: Buffer): string {
  expect(reply.length).toBeGreaterThanOrEqual(77);
  expect(reply.readUInt32BE(0)).toBe(0x42424242);
  expect(reply[4]).toBe(0xff);
  expect(reply.subarray(13, 77).equals(Buffer.alloc(64))).toBe(true);
  const size = reply.readUInt32BE(5);
  return reply.subarray(77, 77 + size).toString('utf8');
}

describe('tapmanager with bridge + host-local', () => {
  let net: CniTestNet;
  let d: Daemon;
  let client: FdClient;

  beforeAll(async () => {
    net = await makeCniConf();
    d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir, logLevel: 'debug' });
    client = new FdClient(d.socket, { timeoutMs: 60_000 });
  });

  afterAll(async () => {
    const code = await d?.stop();
    expect(code).toBe(0);
    await net?.cleanup();
    removeDir(d.dir);
  });

  it('serves the socket with mode 0660', async () => {
    const st = (await import('node:fs')).statSync(d.socket);
    expect(st.isSocket()).toBe(true);
    expect(st.mode & 0o777).toBe(0o660);
  });

  it('add builds the pod network, get hands over the tap, release leaves nothing', async () => {
    const key = `vmpt-${rand()}`;
    await firstPodDone(d);
    const fdsBefore = await fdsSettled(d);
    const csn = client.add(key, desc(key));

    // the reply: Virtlet's ContainerSideNetwork
    expect(csn.NsPath).toBe(`/var/run/netns/${key}`);
    expect(csn.Interfaces).toHaveLength(1);
    const nif = csn.Interfaces[0]!;
    expect(nif).toMatchObject({ Type: 0, Name: 'virtlet-eth0', PCIAddress: '', VlanID: 0, MTU: 1500 });
    const vmMac = base64ToMac(nif.HardwareAddr);
    const ip = csn.Result!.ips![0]!;
    expect(ip.version).toBe('4');
    expect(ip.address.startsWith(net.subnet.replace(/\.0\/24$/, '.'))).toBe(true);
    expect(ip.gateway).toBe(net.gateway);

    // the kernel: netns, tap, the veth stripped and sharing its MAC with the VM (a veth: tc-redirect, no bridge)
    expect(await netnsExists(key)).toBe(true);
    const l = await links(key);
    expect([...l.keys()].sort()).toEqual(['lo', 'tap0', 'virtlet-eth0']);
    const veth = l.get('virtlet-eth0')!;
    expect(veth.master).toBeUndefined();
    expect(veth.address).toBe(vmMac);
    expect(veth.addr_info.filter((a) => a.family === 'inet')).toEqual([]);
    expect(
      l
        .get('tap0')!
        .addr_info.filter((a) => a.family === 'inet')
        .map((a) => `${a.local}/${a.prefixlen}`),
    ).toEqual(['169.254.254.2/24']);
    expect(l.get('lo')!.flags).toContain('UP');

    // get: one fd, and it is this pod's tap
    const { infos, fds } = client.get(key);
    expect(infos).toEqual([
      { type: 0, mac: nif.HardwareAddr, fdIndex: 0, pciAddress: '', mtu: 1500, queueFdIndices: [0] },
    ]);
    expect(fds).toHaveLength(1);
    expect(readFileSync(`/proc/self/fdinfo/${fds[0]}`, 'utf8')).toMatch(/^iff:\ttap0$/m);
    native().close(fds[0]!);

    // list knows it
    const listed = client.list() as { key: string; interfaces: { ip?: string; mac: string }[] }[];
    const mine = listed.find((p) => p.key === key)!;
    expect(mine.interfaces[0]).toMatchObject({ ip: ip.address, mac: vmMac, binding: 'tc-redirect', bridge: '' });

    // release: nothing left
    client.release(key);
    expect(await netnsExists(key)).toBe(false);
    expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
    expect(readdirSync(d.stateDir).filter((f) => f.includes(key))).toEqual([]);
    expect(await fdsSettled(d)).toBe(fdsBefore);
    expect((client.list() as { key: string }[]).some((p) => p.key === key)).toBe(false);

    // every request line carries key, op and duration
    const lines = d.lines().filter((x) => x.key === key && typeof x.durationMs === 'number');
    expect(lines.map((x) => [x.op, x.command])).toEqual(
      expect.arrayContaining([
        ['add', 0],
        ['get', 2],
        ['release', 1],
      ]),
    );
  });

  it('serves several requests on one connection, in order', () => {
    const key = `vmpt-${rand()}`;
    const hdr = (command: number) => encodeHeader({ command, dataSize: 0, oobSize: 0, key });
    // get and release of an unknown key, then list: three replies on one connection
    const n = native();
    const fd = n.connectUnix(d.socket);
    try {
      n.setTimeouts(fd, 10_000);
      n.writeAll(fd, Buffer.concat([hdr(2), hdr(1), encodeHeader({ command: 4, dataSize: 0, oobSize: 0, key: '' })]));
      const replies: number[] = [];
      let buf = Buffer.alloc(0);
      while (replies.length < 3) {
        const r = n.recvMsg(fd, 65536, 0);
        if (r.data.length === 0) break;
        buf = Buffer.concat([buf, r.data]);
        while (buf.length >= 77 && buf.length >= 77 + buf.readUInt32BE(5)) {
          replies.push(buf[4]!);
          buf = buf.subarray(77 + buf.readUInt32BE(5));
        }
      }
      expect(replies).toEqual([0xff, 0xff, 0x84]);
    } finally {
      n.close(fd);
    }
  });

  it('answers malformed frames with a clear error, closes the connection, and stays up', () => {
    const bad = Buffer.alloc(77, 0x20);
    bad.writeUInt32BE(0x41414141, 0);
    // each is answered with an error reply, then the connection is closed (untilEof fails on a hang)
    const eof = { untilEof: true };
    expect(errorText(rawExchange(d.socket, bad, eof))).toMatch(/magic/);

    const huge = encodeHeader({ command: 0, dataSize: 2 * 1024 * 1024, oobSize: 0, key: 'x' });
    expect(errorText(rawExchange(d.socket, huge, eof))).toMatch(/2097152|payload|size/i);

    const unknown = encodeHeader({ command: 0, dataSize: 0, oobSize: 0, key: 'x' });
    unknown[4] = 9;
    expect(errorText(rawExchange(d.socket, unknown, eof))).toMatch(/command/i);

    const oob = encodeHeader({ command: 2, dataSize: 0, oobSize: 24, key: 'x' });
    expect(errorText(rawExchange(d.socket, oob, eof))).toMatch(/oob/i);

    // the daemon is alive and serving
    expect(Array.isArray(client.list())).toBe(true);
  });

  it('times out a truncated header with an error reply', () => {
    const t = rawExchange(d.socket, encodeHeader({ command: 2, dataSize: 0, oobSize: 0, key: 'x' }).subarray(0, 30), {
      timeoutMs: 20_000,
      untilEof: true,
    });
    expect(errorText(t)).toMatch(/incomplete request: got 30 bytes/);
    expect(Array.isArray(client.list())).toBe(true);
  });

  it('refuses unsafe and unknown keys before creating anything', async () => {
    for (const key of ['../etc', 'a b', 'a/b', '..', 'x;rm']) {
      const payload = Buffer.from(JSON.stringify({ podNetworkDesc: desc('p') }));
      const hdr = encodeHeader({ command: 0, dataSize: payload.length, oobSize: 0, key: 'placeholder' });
      Buffer.from(key.padEnd(64, ' '), 'latin1').copy(hdr, 13);
      const text = errorText(rawExchange(d.socket, Buffer.concat([hdr, payload])));
      expect(text).toContain(JSON.stringify(key));
    }
    expect(readdirSync('/var/run/netns').filter((n) => n.includes('etc') || n === 'a' || n.startsWith('x;'))).toEqual(
      [],
    );
    const unknown = `vmpt-${rand()}`;
    expect(() => client.get(unknown)).toThrow(new RegExp(`server returned error: .*${unknown}`));
    expect(() => client.release(unknown)).toThrow(new RegExp(`server returned error: .*${unknown}`));
    // a payload that is not a GetFDPayload: refused, nothing created
    const badKey = `vmpt-${rand()}`;
    for (const payload of ['{"podNetworkDesc": 5}', 'not json', '{"podNetworkDesc":{"podId":1}}']) {
      const data = Buffer.from(payload);
      const text = errorText(
        rawExchange(
          d.socket,
          Buffer.concat([encodeHeader({ command: 0, dataSize: data.length, oobSize: 0, key: badKey }), data]),
        ),
      );
      expect(text).toMatch(/podNetworkDesc|JSON/);
    }
    expect(await netnsExists(badKey)).toBe(false);
  });

  it('sets up different pods at once, each with its own address', async () => {
    const keys = [`vmpt-${rand()}`, `vmpt-${rand()}`];
    const outs = await Promise.all(
      keys.map((k) =>
        execa(
          process.execPath,
          [BIN.tapctl, '--socket', d.socket, 'add', k, '--pod-name', 'vm', '--pod-namespace', 'default'],
          { timeout: 60_000 },
        ),
      ),
    );
    const ips = outs.map(
      (o) => (JSON.parse(o.stdout) as { Result: { ips: { address: string }[] } }).Result.ips[0]!.address,
    );
    expect(new Set(ips).size).toBe(2);
    for (const k of keys)
      await execa(process.execPath, [BIN.tapctl, '--socket', d.socket, 'release', k], { timeout: 60_000 });
    for (const k of keys) expect(await netnsExists(k)).toBe(false);
    expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
  });

  it('vmwrapper gets the tap and execs the emulator with it, keeping libvirt fds and nothing else', async () => {
    const key = `vmpt-${rand()}`;
    const csn = client.add(key, desc(key));
    const mac = base64ToMac(csn.Interfaces[0]!.HardwareAddr);
    const dir = mkdtempSync(join(tmpdir(), 'vmpod-vmw-'));
    const mon = join(dir, 'monitor');
    writeFileSync(mon, '');
    const monFd = openSync(mon, 'r');
    try {
      const args = [
        '-name',
        'guest=vm-a',
        '-chardev',
        'socket,id=charmonitor,fd=7,server=on,wait=off',
        '-machine',
        'pc,accel=tcg',
      ];
      const r = await runVmwrapper({
        args,
        env: { VIRTLET_EMULATOR: STUB_EMULATOR, VIRTLET_NET_KEY: key, VIRTLET_FD_SERVER_SOCKET_PATH: d.socket },
        passFds: { 7: monFd },
      });
      expect(r.stderr).toMatch(/"msg":"exec emulator"/);
      expect(r.code).toBe(0);
      const stub = r.stub!;
      expect(stub.pid).toBe(r.pid);
      const taps = stubTaps(stub);
      expect(taps.map((t) => t.iff)).toEqual(['tap0']);
      const tapFd = taps[0]!.fd;
      expect(stub.argv).toEqual([
        STUB_EMULATOR,
        ...args,
        // vhost where /dev/vhost-net opens (test/integration/vmwrapper-multiqueue.test.ts tests both)
        '-netdev',
        `tap,id=vmpodnet0,fd=${tapFd},vhost=${vhostUsable('/').on ? 'on' : 'off'}`,
        '-device',
        `virtio-net-pci,netdev=vmpodnet0,id=vmpodnic0,mac=${mac},host_mtu=1500`,
      ]);
      expect(stub.fds['7']?.target).toBe(mon);
      const expected = ['0', '1', '2', '7', String(tapFd), ...ambientFds()];
      expect(Object.keys(stub.fds).filter((f) => !expected.includes(f))).toEqual([]);
    } finally {
      closeSync(monFd);
      rmSync(dir, { recursive: true, force: true });
      client.release(key);
    }
    expect(await netnsExists(key)).toBe(false);
  });

  it('vmwrapper fails with one line naming the key when tapmanager does not know it', async () => {
    const key = `vmpt-${rand()}`;
    const r = await runVmwrapper({
      args: ['-S'],
      env: { VIRTLET_EMULATOR: STUB_EMULATOR, VIRTLET_NET_KEY: key, VIRTLET_FD_SERVER_SOCKET_PATH: d.socket },
    });
    expect(r.code).toBe(1);
    expect(r.stub).toBeUndefined();
    const lines = r.stderr
      .trim()
      .split('\n')
      .filter((l) => !l.startsWith('{'));
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(new RegExp(`^vmwrapper: .*${key}`));
  });

  it('tapctl: add prints the network, get --exec hands the fds to a command, exit codes', async () => {
    const key = `vmpt-${rand()}`;
    const tapctl = (...a: string[]) =>
      execa(process.execPath, [BIN.tapctl, '--socket', d.socket, ...a], { reject: false, timeout: 60_000 });
    const add = await tapctl('add', key, '--pod-name', 'vm-b', '--pod-namespace', 'ns1');
    expect(add.exitCode).toBe(0);
    expect(JSON.parse(add.stdout).NsPath).toBe(`/var/run/netns/${key}`);
    const ex = await tapctl('get', key, '--exec', '--', '/bin/sh', '-c', 'cat /proc/self/fdinfo/{fd0}');
    expect(ex.exitCode).toBe(0);
    expect(ex.stdout).toMatch(/^iff:\ttap0$/m);
    const get = await tapctl('get', key);
    expect(JSON.parse(get.stdout)[0]).toMatchObject({ type: 0, fdIndex: 0 });
    expect((await tapctl('frobnicate')).exitCode).toBe(2);
    expect((await tapctl('add', key)).exitCode).toBe(2); // --pod-name missing
    const rel = await tapctl('release', key);
    expect(rel.exitCode).toBe(0);
    const again = await tapctl('release', key);
    expect(again.exitCode).toBe(1);
    expect(again.stderr).toMatch(/^tapctl: server returned error: .*/);
  });
});

describe('tapmanager with failing CNI plugins', () => {
  it('a plugin that exits with a CNI error: the error names the step and the plugin, and nothing is left', async () => {
    const net = await makeCniConf({ failingPlugin: true });
    const d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir });
    try {
      const key = `vmpt-${rand()}`;
      const client = new FdClient(d.socket);
      expect(() => client.add(key, desc(key))).toThrow(
        /server returned error: .*cni-add.*code 100.*fake failure for the test/,
      );
      expect(await netnsExists(key)).toBe(false);
      expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
      expect(readdirSync(d.stateDir).filter((f) => f.includes(key))).toEqual([]);
      expect(Array.isArray(client.list())).toBe(true);
    } finally {
      await stopDaemonAndNet(d, net);
    }
  });

  it('a plugin that hangs is killed after --cni-timeout, and nothing is left', async () => {
    const net = await makeCniConf();
    const marker = `vmpod-hang-${rand()}`;
    const binDir = join(net.root, 'hangbin');
    mkdirSync(binDir);
    writeFileSync(
      join(binDir, marker),
      `#!/bin/sh\ncase "$CNI_COMMAND" in ADD) exec /bin/sleep 3600 ;; *) exit 0 ;; esac\n`,
    );
    chmodSync(join(binDir, marker), 0o755);
    const conf = JSON.parse(readFileSync(join(net.confDir, '10-test.conflist'), 'utf8')) as { plugins: unknown[] };
    conf.plugins.push({ type: marker });
    writeFileSync(join(net.confDir, '10-test.conflist'), JSON.stringify(conf));
    const d = await startDaemon({
      confDir: net.confDir,
      binDirs: [binDir, SYSTEM_CNI_BIN],
      cacheDir: net.cacheDir,
      extraArgs: ['--cni-timeout', '1500'],
    });
    try {
      const key = `vmpt-${rand()}`;
      const client = new FdClient(d.socket);
      expect(() => client.add(key, desc(key))).toThrow(/server returned error: .*timed out after 1500 ms/);
      expect(await netnsExists(key)).toBe(false);
      expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
      const sleepers = processesNaming(marker);
      expect(sleepers).toEqual([]);
      expect(Array.isArray(client.list())).toBe(true);
    } finally {
      await stopDaemonAndNet(d, net);
    }
  });
});

describe('tapmanager restart', () => {
  it('SIGTERM leaves the pod network in place; the next start hands out the same tap again', async () => {
    const net = await makeCniConf();
    let d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir });
    const key = `vmpt-${rand()}`;
    try {
      const csn = new FdClient(d.socket).add(key, desc(key));
      // a running VM holds its own copy of the tap fd across the restart
      const { fds: vmFds } = new FdClient(d.socket).get(key);
      expect(await d.stop()).toBe(0);
      expect(await netnsExists(key)).toBe(true);
      expect((await links(key)).get('tap0')!.flags).toContain('UP');
      d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, reuse: d });
      // the VM still holds its tap: the pod is known again, and get says the tap is taken rather than stealing it
      expect((new FdClient(d.socket).list() as { key: string }[]).map((p) => p.key)).toContain(key);
      expect(() => new FdClient(d.socket).get(key)).toThrow(/in use|EBUSY/);
      // the VM stops; the next start of the VM gets the same tap again
      for (const fd of vmFds) native().close(fd);
      const { infos, fds } = new FdClient(d.socket).get(key);
      expect(infos[0]!.mac).toBe(csn.Interfaces[0]!.HardwareAddr);
      expect(readFileSync(`/proc/self/fdinfo/${fds[0]}`, 'utf8')).toMatch(/^iff:\ttap0$/m);
      for (const fd of fds) native().close(fd);
      new FdClient(d.socket).release(key);
      expect(await netnsExists(key)).toBe(false);
      expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
    } finally {
      await stopDaemonAndNet(d, net, { ifAlive: true, podKey: key });
    }
  });
});

describe('tapmanager recover', () => {
  it('re-attaches a pod network from its ContainerSideNetwork after the state dir was lost (tapctl recover)', async () => {
    const net = await makeCniConf();
    let d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir });
    const key = `vmpt-${rand()}`;
    const csnFile = join(d.dir, 'csn.json');
    try {
      const csn = new FdClient(d.socket).add(key, desc(key));
      writeFileSync(csnFile, JSON.stringify(csn));
      expect(await d.stop()).toBe(0);
      rmSync(d.stateDir, { recursive: true, force: true }); // the node lost tapmanager's state, not the netns
      d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, reuse: d });
      expect(() => new FdClient(d.socket).get(key)).toThrow(new RegExp(key));
      const rec = await execa(
        process.execPath,
        [
          BIN.tapctl,
          '--socket',
          d.socket,
          'recover',
          key,
          '--csn',
          csnFile,
          '--pod-name',
          'vm-a',
          '--pod-namespace',
          'default',
        ],
        { reject: false },
      );
      expect(rec.stderr).toBe('');
      expect(rec.exitCode).toBe(0);
      const { infos, fds } = new FdClient(d.socket).get(key);
      expect(infos[0]!.mac).toBe(csn.Interfaces[0]!.HardwareAddr);
      expect(readFileSync(`/proc/self/fdinfo/${fds[0]}`, 'utf8')).toMatch(/^iff:\ttap0$/m);
      for (const fd of fds) native().close(fd);
      new FdClient(d.socket).release(key);
      expect(await netnsExists(key)).toBe(false);
      expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
    } finally {
      await stopDaemonAndNet(d, net, { ifAlive: true, podKey: key });
    }
  });
});
