// vmwrapper asks tapmanager for what the VM can use and renders it (the stub emulator records the argv and the fds it
// got): -smp 4 gives 4 queues of the pod's tap, `fds=a:b:c:d` and `mq=on,vectors=10`; vhost=on where
// <VMPOD_DEV_ROOT>/dev/vhost-net opens (a fake dev root here: this machine has no vhost_net), vhost=off otherwise, said
// once in the log line; VMPOD_NET_QUEUES=1 is the single-queue argv; a bad VMPOD_NET_QUEUES fails and changes nothing.
import { describe, it, expect, beforeAll, afterAll, vi } from 'vitest';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { startDaemon, stopDaemonAndNet, removeDir, type Daemon } from '../helpers/daemon.js';
import { makeCniConf, type CniTestNet } from '../helpers/cniconf.js';
import { runVmwrapper, stubTaps, STUB_EMULATOR, type WrapperRun } from '../helpers/vmwrapper.js';
import { run } from '../helpers/netns.js';
import { FdClient } from '../../src/client/fdclient.js';
import { base64ToMac } from '../../src/protocol/mac.js';

let net: CniTestNet;
let d: Daemon;
let key: string;
let mac: string;
let dir: string;

vi.setConfig({ testTimeout: 120_000, hookTimeout: 120_000 });

beforeAll(async () => {
  net = await makeCniConf();
  d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir });
  key = `vmpw-${randomBytes(3).toString('hex')}`;
  const csn = new FdClient(d.socket).add(key, { podId: key, podNs: 'default', podName: key, DNS: null });
  mac = base64ToMac(csn.Interfaces[0]!.HardwareAddr);
  dir = mkdtempSync(join(tmpdir(), 'vmpod-vmwmq-'));
  // a dev root with vhost-net, and one without
  mkdirSync(join(dir, 'with/dev'), { recursive: true });
  writeFileSync(join(dir, 'with/dev/vhost-net'), '');
  mkdirSync(join(dir, 'without/dev'), { recursive: true });
});

afterAll(async () => {
  new FdClient(d.socket).release(key);
  await stopDaemonAndNet(d, net);
  removeDir(d.dir);
  rmSync(dir, { recursive: true, force: true });
});

const ARGS = ['-name', 'guest=vm-mq', '-machine', 'pc,accel=tcg', '-smp', '4,sockets=4,cores=1,threads=1'];

function start(env: Record<string, string>): Promise<WrapperRun> {
  return runVmwrapper({
    args: ARGS,
    env: { VIRTLET_EMULATOR: STUB_EMULATOR, VIRTLET_NET_KEY: key, VIRTLET_FD_SERVER_SOCKET_PATH: d.socket, ...env },
  });
}

/** vmwrapper's one JSON log line */
function logLine(r: WrapperRun): Record<string, unknown> {
  return JSON.parse(r.stderr.split('\n').find((l) => l.includes('"msg":"exec emulator"'))!) as Record<string, unknown>;
}

async function numqueues(): Promise<number> {
  const out = JSON.parse(await run(['ip', '-n', key, '-j', '-d', 'link', 'show', 'tap0'])) as {
    linkinfo: { info_data: { numqueues: number } };
  }[];
  return out[0]!.linkinfo.info_data.numqueues;
}

describe('vmwrapper: queues and vhost', () => {
  it('-smp 4: four queues of the tap in fds=, mq=on,vectors=10, vhost=on where /dev/vhost-net opens', async () => {
    const r = await start({ VMPOD_DEV_ROOT: join(dir, 'with') });
    expect(r.code).toBe(0);
    const taps = stubTaps(r.stub!);
    expect(taps.map((t) => t.iff)).toEqual(['tap0', 'tap0', 'tap0', 'tap0']);
    const fds = logLine(r).taps as { fd: number; queueFds: number[] }[];
    expect(fds).toHaveLength(1);
    expect([...fds[0]!.queueFds].sort((a, b) => a - b)).toEqual(taps.map((t) => t.fd));
    expect(r.stub!.argv.slice(ARGS.length + 1)).toEqual([
      '-netdev',
      `tap,id=vmpodnet0,fds=${fds[0]!.queueFds.join(':')},vhost=on`,
      '-device',
      `virtio-net-pci,netdev=vmpodnet0,id=vmpodnic0,mac=${mac},host_mtu=1500,mq=on,vectors=10`,
    ]);
    expect(logLine(r).vhost).toBeUndefined();
    // the stub has exited: its queues went with it, tapmanager's own is left
    expect(await numqueues()).toBe(1);
  });

  it('without /dev/vhost-net: vhost=off, said once in the log line', async () => {
    const r = await start({ VMPOD_DEV_ROOT: join(dir, 'without') });
    expect(r.code).toBe(0);
    expect(r.stub!.argv.join(' ')).toMatch(/-netdev tap,id=vmpodnet0,fds=\d+:\d+:\d+:\d+,vhost=off -device /);
    expect(logLine(r).vhost).toBe(
      `off: cannot open ${join(dir, 'without')}/dev/vhost-net: ENOENT; virtio-net runs in qemu`,
    );
    expect(r.stderr.match(/vhost-net/g)).toHaveLength(1);
  });

  it('VMPOD_NET_QUEUES: 1 is the single-queue argv, 2 gives two queues whatever -smp says', async () => {
    const one = await start({ VMPOD_DEV_ROOT: join(dir, 'without'), VMPOD_NET_QUEUES: '1' });
    const tap = stubTaps(one.stub!);
    expect(tap).toHaveLength(1);
    expect(one.stub!.argv.slice(ARGS.length + 1)).toEqual([
      '-netdev',
      `tap,id=vmpodnet0,fd=${tap[0]!.fd},vhost=off`,
      '-device',
      `virtio-net-pci,netdev=vmpodnet0,id=vmpodnic0,mac=${mac},host_mtu=1500`,
    ]);
    const two = await start({ VMPOD_DEV_ROOT: join(dir, 'without'), VMPOD_NET_QUEUES: '2' });
    expect(stubTaps(two.stub!)).toHaveLength(2);
    expect(two.stub!.argv.at(-1)).toMatch(/,mq=on,vectors=6$/);
    expect(await numqueues()).toBe(1);
  });

  it('a bad VMPOD_NET_QUEUES: exit 1, one line naming it, no emulator, the tap untouched', async () => {
    const r = await start({ VMPOD_NET_QUEUES: 'lots' });
    expect(r.code).toBe(1);
    expect(r.stub).toBeUndefined();
    expect(r.stderr).toBe('vmwrapper: VMPOD_NET_QUEUES="lots": expected "auto" or a number of queues from 1 to 256\n');
    expect(await numqueues()).toBe(1);
  });
});
