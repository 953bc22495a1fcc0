// Drop-in for Virtlet: the daemon driven exactly as Virtlet's runtime and vmwrapper drive it (docs/protocol.md),
// NOT through our own client: a new connection per request; the header written, then the JSON payload; the reply's
// 77-byte header read with plain reads, then ONE recvmsg with a data buffer of exactly dataSize and a control
// buffer of exactly oobSize (CMSG_SPACE(4 * nfds)); the key echoed on add, release and recover; errors as
// command 0xFF with a zero key and the text as payload ("server returned error: <text>").
import { describe, it, expect, beforeAll, afterAll, vi } from 'vitest';
import { readlinkSync, rmSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';
import { startDaemon, removeDir, firstPodDone, fdsSettled, type Daemon } from '../helpers/daemon.js';
import { makeCniConf, type CniTestNet } from '../helpers/cniconf.js';
import { exchange, type RawReply } from '../helpers/rawclient.js';
import { native } from '../../src/native.js';

const ADD = 0;
const RELEASE = 1;
const GET = 2;
const RECOVER = 3;

/** What Virtlet's FDClient.request returns, or the error text it makes. */
function virtletRequest(socket: string, command: number, key: string, payload?: object): RawReply {
  const r = exchange(socket, command, key, payload);
  if (r.command === 0xff) throw new Error(`server returned error: ${r.data.toString('utf8')}`);
  if (r.command !== (command | 0x80)) throw new Error(`unexpected command ${r.command.toString(16)}`);
  // AddFDs checks the key; release and recover echo it too
  if (command !== GET && r.key !== key) throw new Error('fd key mismatch in the server response');
  return r;
}

/** The PodNetworkDesc Virtlet's runtime sends (upper-case DNS, as Go marshals it). */
function podDesc(key: string) {
  return {
    podId: key,
    podNs: 'default',
    podName: 'cirros-vm',
    DNS: { nameservers: ['10.96.0.10'], search: ['default.svc.cluster.local'], options: ['ndots:5'] },
  };
}

let net: CniTestNet;
let d: Daemon;

// the machine may be shared and slow: generous bounds, never timing assertions
vi.setConfig({ testTimeout: 300_000, hookTimeout: 120_000 });

beforeAll(async () => {
  net = await makeCniConf();
  d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir });
});

afterAll(async () => {
  expect(await d.stop()).toBe(0);
  await net.cleanup();
  removeDir(d.dir);
});

describe('Virtlet drop-in', () => {
  it('add -> get -> release, as the runtime and vmwrapper do it', async () => {
    const key = `vmpt-${randomBytes(4).toString('hex')}`;
    await firstPodDone(d);
    // at rest (the spare pod netns the daemon makes once idle is one of them)
    const fdsBefore = await fdsSettled(d);
    // AddFDs: the reply is the ContainerSideNetwork JSON, no fds, the key echoed
    const add = virtletRequest(d.socket, ADD, key, { podNetworkDesc: podDesc(key) });
    expect(add.oobSize).toBe(0);
    expect(add.fds).toEqual([]);
    const csn = JSON.parse(add.data.toString('utf8')) as {
      Result: {
        interfaces: { name: string; mac: string; sandbox: string }[];
        ips: { version: string; address: string; gateway?: string }[];
      };
      NsPath: string;
      Interfaces: {
        Type: number;
        Name: string;
        HardwareAddr: string;
        PCIAddress: string;
        MTU: number;
        VlanID: number;
      }[];
    };
    expect(csn.NsPath).toBe(`/var/run/netns/${key}`);
    expect(csn.Interfaces).toHaveLength(1);
    const nif = csn.Interfaces[0]!;
    expect(nif).toMatchObject({ Type: 0, PCIAddress: '', VlanID: 0, MTU: 1500 });
    // Go's net.HardwareAddr: base64 of the 6 bytes
    expect(Buffer.from(nif.HardwareAddr, 'base64')).toHaveLength(6);
    expect(csn.Result.ips[0]).toMatchObject({ version: '4', gateway: net.gateway });

    // GetFDs: header with oobSize = CMSG_SPACE(4) = 24 on 64-bit Linux, one recvmsg gets the JSON and 1 fd
    const get = virtletRequest(d.socket, GET, key);
    expect(get.oobSize).toBe(24);
    expect(get.fds).toHaveLength(1);
    expect(readlinkSync(`/proc/self/fd/${get.fds[0]}`)).toBe('/dev/net/tun');
    const infos = JSON.parse(get.data.toString('utf8')) as {
      type: number;
      mac: string;
      fdIndex: number;
      pciAddress: string;
    }[];
    expect(infos).toEqual([expect.objectContaining({ type: 0, mac: nif.HardwareAddr, fdIndex: 0, pciAddress: '' })]);
    // the tap is multi-queue now (a get of ours may ask for more queues); Virtlet's get still gets its one fd (a dup
    // of tapmanager's own: one queue), and the fields it does not know (queueFdIndices, mtu) are ones Go ignores
    const link = await execa('ip', ['-n', key, '-j', '-d', 'link', 'show', 'tap0'], { timeout: 10_000 });
    expect((JSON.parse(link.stdout) as { linkinfo: { info_data: object } }[])[0]!.linkinfo.info_data).toMatchObject({
      multi_queue: true,
      numqueues: 1,
    });
    native().close(get.fds[0]!);

    // ReleaseFDs: an empty reply with the key
    const rel = virtletRequest(d.socket, RELEASE, key);
    expect(rel).toMatchObject({ dataSize: 0, oobSize: 0, key });
    // the daemon closes each connection when it sees our close, and makes its spare netns again: let it
    expect(await fdsSettled(d)).toBe(fdsBefore);
    expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
  });

  it('recover with the ContainerSideNetwork of an earlier add, after tapmanager lost its state', async () => {
    const key = `vmpt-${randomBytes(4).toString('hex')}`;
    const add = virtletRequest(d.socket, ADD, key, { podNetworkDesc: podDesc(key) });
    const csn = JSON.parse(add.data.toString('utf8')) as { Interfaces: { HardwareAddr: string }[] };
    // the node's tapmanager restarts with an empty state dir; the runtime recovers the running pod from what it kept
    expect(await d.stop()).toBe(0);
    rmSync(d.stateDir, { recursive: true, force: true });
    d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, reuse: d });
    const rec = virtletRequest(d.socket, RECOVER, key, {
      podNetworkDesc: podDesc(key),
      csn,
      HaveRunningContainers: true,
    });
    expect(rec).toMatchObject({ dataSize: 0, oobSize: 0, key });
    // vmwrapper's get works on the recovered pod: the same MAC
    const get = virtletRequest(d.socket, GET, key);
    expect(get.fds).toHaveLength(1);
    native().close(get.fds[0]!);
    expect((JSON.parse(get.data.toString('utf8')) as { mac: string }[])[0]!.mac).toBe(csn.Interfaces[0]!.HardwareAddr);
    virtletRequest(d.socket, RELEASE, key);
    expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
    const ns = await execa('ip', ['netns', 'list'], { timeout: 10_000 });
    expect(ns.stdout.split('\n').some((l) => l.split(' ')[0] === key)).toBe(false);
  });

  it('errors come as command 0xFF with a zero key and the text, which the client reports as "server returned error"', () => {
    const key = `vmpt-${randomBytes(4).toString('hex')}`;
    const raw = exchange(d.socket, RELEASE, key);
    expect(raw.command).toBe(0xff);
    expect(raw.key).toBe('');
    expect(raw.oobSize).toBe(0);
    expect(raw.dataSize).toBe(raw.data.length);
    expect(() => virtletRequest(d.socket, RELEASE, key)).toThrow(
      `server returned error: no pod network for key ${key}`,
    );
    expect(() => virtletRequest(d.socket, GET, key)).toThrow(/^server returned error: /);
    expect(d.alive()).toBe(true);
  });
});
