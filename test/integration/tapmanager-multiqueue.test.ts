// Multiqueue taps, as a VM start sees them: a get asking {"queues": N} gets N fds of the pod's tap, each a queue of
// its own (the kernel counts them), in queueFdIndices order; tapmanager keeps none of the extra queues, so they go
// when the VM (here: this process) closes them, and a later get can ask again; a get without a payload is Virtlet's
// and gets one fd (answered by the addon); a bad payload is refused and changes nothing; after a restart, while a
// "VM" still holds its queues, tapmanager opens no queue of its own, a get is refused until that VM is gone, and then
// works.
import { describe, it, expect, beforeAll, afterAll, vi } from 'vitest';
import { readFileSync, readlinkSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { startDaemon, stopDaemonAndNet, removeDir, type Daemon } from '../helpers/daemon.js';
import { makeCniConf, type CniTestNet } from '../helpers/cniconf.js';
import { connect, exchange, readReply, requestBytes, type RawReply } from '../helpers/rawclient.js';
import { run } from '../helpers/netns.js';
import { FdClient } from '../../src/client/fdclient.js';
import { native } from '../../src/native.js';

const desc = (k: string) => ({ podId: k, podNs: 'default', podName: k, DNS: null });
const GET = 2;

let net: CniTestNet;
let d: Daemon;
const added = new Set<string>();

vi.setConfig({ testTimeout: 180_000, hookTimeout: 120_000 });

beforeAll(async () => {
  net = await makeCniConf();
  d = await startDaemon({
    confDir: net.confDir,
    binDirs: net.binDirs,
    cacheDir: net.cacheDir,
    extraArgs: ['--http-listen', '127.0.0.1:0'],
  });
});

afterAll(async () => {
  for (const k of added) new FdClient(d.socket).release(k);
  await stopDaemonAndNet(d, net);
  removeDir(d.dir);
});

const client = () => new FdClient(d.socket, { timeoutMs: 60_000 });

function addPod(): string {
  const k = `vmpq-${randomBytes(3).toString('hex')}`;
  client().add(k, desc(k));
  added.add(k);
  return k;
}

/** What `ip -d link` says of the pod's tap: its tun flags and how many queues are attached and detached. */
async function tapInfo(
  key: string,
): Promise<{ multi_queue: boolean; vnet_hdr: boolean; numqueues: number; numdisabled: number }> {
  const out = JSON.parse(await run(['ip', '-n', key, '-j', '-d', 'link', 'show', 'tap0'])) as {
    linkinfo: { info_data: Record<string, unknown> };
  }[];
  const i = out[0]!.linkinfo.info_data;
  return {
    multi_queue: i.multi_queue === true,
    vnet_hdr: i.vnet_hdr === true,
    numqueues: Number(i.numqueues),
    numdisabled: Number(i.numdisabled),
  };
}

/** The tap an fd of ours is attached to ("iff:" in fdinfo); undefined for a detached fd or no tap. */
function iff(fd: number): string | undefined {
  return /^iff:[ \t]*(\S+)/m.exec(readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8'))?.[1];
}

function closeAll(fds: number[]): void {
  for (const fd of fds) native().close(fd);
}

async function fastGets(): Promise<number> {
  const port = d.lines().find((l) => l.msg === 'HTTP listening: /healthz /readyz /metrics')!.port as number;
  const body = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const ok = body.split('\n').find((l) => l.startsWith('vmpod_requests_total{command="get",result="ok"} '));
  const timed = body.split('\n').find((l) => l.startsWith('vmpod_request_duration_seconds_count{command="get"} '));
  // gets counted minus gets the daemon's handler timed: the ones the addon answered
  return Number(ok?.split(' ').pop() ?? 0) - Number(timed?.split(' ').pop() ?? 0);
}

describe('multiqueue taps', () => {
  it('a get with {"queues": 4} hands out 4 queues of the tap; closing them leaves only tapmanager\'s own; a later get asks again', async () => {
    const k = addPod();
    // made with IFF_MULTI_QUEUE and IFF_VNET_HDR; tapmanager holds one queue
    expect(await tapInfo(k)).toEqual({ multi_queue: true, vnet_hdr: true, numqueues: 1, numdisabled: 0 });
    const tunFlags = (await run(['ip', 'netns', 'exec', k, 'cat', '/sys/class/net/tap0/tun_flags'])).trim();
    expect(Number(tunFlags) & 0x100).toBe(0x100); // IFF_MULTI_QUEUE
    // no root qdisc: not the mq with a child for each of the tap's 256 possible queues the kernel would give it (the
    // ingress qdisc is tc-redirect's, which a veth gets)
    const qdiscs = JSON.parse(await run(['tc', '-n', k, '-j', 'qdisc', 'show', 'dev', 'tap0'])) as { kind: string }[];
    expect(qdiscs.map((q) => q.kind)).toEqual(['noqueue', 'ingress']);

    const before = await fastGets();
    const { infos, fds } = client().get(k, { queues: 4 });
    expect(fds).toHaveLength(4);
    expect(infos).toEqual([expect.objectContaining({ type: 0, fdIndex: 0, queueFdIndices: [0, 1, 2, 3], mtu: 1500 })]);
    expect(fds.map(iff)).toEqual(['tap0', 'tap0', 'tap0', 'tap0']);
    // the first is tapmanager's own queue (shared, as a single-queue get is), the other 3 are new
    expect(await tapInfo(k)).toMatchObject({ numqueues: 4, numdisabled: 0 });
    // a get with a payload went to the daemon, not the addon
    expect(await fastGets()).toBe(before);
    closeAll(fds);
    // tapmanager kept none of the extra queues: the "VM" is gone, so are they
    expect(await tapInfo(k)).toMatchObject({ numqueues: 1, numdisabled: 0 });

    const again = client().get(k, { queues: 2 });
    expect(again.fds).toHaveLength(2);
    expect(await tapInfo(k)).toMatchObject({ numqueues: 2 });
    closeAll(again.fds);
    expect(await tapInfo(k)).toMatchObject({ numqueues: 1 });

    // Virtlet's get (no payload): one fd, the addon answers it, queueFdIndices [0] beside Virtlet's fields
    const one: RawReply = exchange(d.socket, GET, k);
    expect(one).toMatchObject({ command: 0x82, oobSize: 24 });
    expect(one.fds).toHaveLength(1);
    expect(readlinkSync(`/proc/self/fd/${one.fds[0]}`)).toBe('/dev/net/tun');
    expect(JSON.parse(one.data.toString())).toEqual([
      { type: 0, mac: expect.any(String), fdIndex: 0, pciAddress: '', mtu: 1500, queueFdIndices: [0] },
    ]);
    closeAll(one.fds);
    expect(await fastGets()).toBe(before + 1);
    expect(await tapInfo(k)).toMatchObject({ numqueues: 1 });
  });

  it('an add and its release in one write: a get then finds no pod (the get reply the add offers after its reply is not left with the addon)', async () => {
    const k = `vmpq-${randomBytes(3).toString('hex')}`;
    const fd = connect(d.socket);
    try {
      native().writeAll(fd, Buffer.concat([requestBytes(0, k, { podNetworkDesc: desc(k) }), requestBytes(1, k)]));
      expect([readReply(fd)?.command, readReply(fd)?.command]).toEqual([0x80, 0x81]);
    } finally {
      native().close(fd);
    }
    // the addon holds no reply for the released pod (it would answer with the closed pod's taps): the daemon says
    const got = exchange(d.socket, GET, k);
    expect(got.command).toBe(0xff);
    expect(got.data.toString()).toMatch(/no pod network for key/);
    expect(got.fds).toEqual([]);
  });

  it('a bad payload is refused with the reason and changes nothing', async () => {
    const k = addPod();
    for (const bad of [{ queues: 0 }, { queues: 257 }, { queues: 'eight' }]) {
      const r = exchange(d.socket, GET, k, bad);
      expect(r.command).toBe(0xff);
      expect(r.fds).toEqual([]);
      expect(r.data.toString()).toMatch(/^get payload is invalid: queues must be an integer in 1\.\.256/);
    }
    expect(exchange(d.socket, GET, k, Buffer.from('{')).data.toString()).toMatch(/^get payload is not JSON/);
    expect(await tapInfo(k)).toMatchObject({ numqueues: 1, numdisabled: 0 });
    expect(d.alive()).toBe(true);
  });

  it('after a restart, while a VM holds 4 queues, tapmanager opens none (a queue nobody reads would take packets); gets wait for the VM to go', async () => {
    const k = addPod();
    const vm = client().get(k, { queues: 4 });
    expect(await tapInfo(k)).toMatchObject({ numqueues: 4 });
    expect(await d.stop()).toBe(0);
    // tapmanager's own queue was also the VM's first: the VM keeps it
    expect(await tapInfo(k)).toMatchObject({ numqueues: 4, numdisabled: 0 });
    d = await startDaemon({
      confDir: net.confDir,
      binDirs: net.binDirs,
      reuse: d,
      extraArgs: ['--http-listen', '127.0.0.1:0'],
    });
    // restored without fds: the tap still has exactly the VM's queues
    expect(
      client()
        .list()
        .find((p) => (p as { key: string }).key === k),
    ).toBeDefined();
    expect(await tapInfo(k)).toMatchObject({ numqueues: 4, numdisabled: 0 });
    // a get while the VM runs is refused, as for a single-queue tap (EBUSY), rather than attaching a second VM
    expect(() => client().get(k, { queues: 2 })).toThrow(
      /in use \(EBUSY\): the VM holds it already.*tap tap0 in \S+ has 4 queues attached/,
    );
    expect(() => client().get(k)).toThrow(/in use/);
    expect(await tapInfo(k)).toMatchObject({ numqueues: 4 });

    // the VM exits; a new start asks for 2 queues: tapmanager opens its own again (the first) and one more
    closeAll(vm.fds);
    expect(await tapInfo(k)).toMatchObject({ numqueues: 0 });
    const next = client().get(k, { queues: 2 });
    expect(next.infos[0]!.queueFdIndices).toEqual([0, 1]);
    expect(next.fds.map(iff)).toEqual(['tap0', 'tap0']);
    expect(await tapInfo(k)).toMatchObject({ numqueues: 2, numdisabled: 0 });
    closeAll(next.fds);
    expect(await tapInfo(k)).toMatchObject({ numqueues: 1 });
  });
});
