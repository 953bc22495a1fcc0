// Hostile or broken socket peers against the real daemon: a reply that owns its fds, a peer that never reads,
// drip-fed bytes, pipelining without end, too many connections, no fds left, garbage after a good request.
// Each asserts what a user notices: the reply arrives (or the clear error), the others are served, the daemon stays.
import { describe, it, expect, beforeAll, afterAll, vi } from 'vitest';
import { readFileSync, readdirSync, readlinkSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';
import { startDaemon, removeDir, firstPodDone, fdsSettled, type Daemon } from '../helpers/daemon.js';
import { makeCniConf, type CniTestNet } from '../helpers/cniconf.js';
import { connect, exchange, readFull, readReply, readUntilEof, requestBytes, HEADER } from '../helpers/rawclient.js';
import { native } from '../../src/native.js';

const rand = () => randomBytes(3).toString('hex');
const desc = (k: string) => ({ podNetworkDesc: { podId: k, podNs: 'default', podName: k, DNS: null } });
const ADD = 0;
const RELEASE = 1;
const GET = 2;
const RECOVER = 3;
const LIST = 4;
const REQUEST_TIMEOUT_MS = 3000;
const MAX_CONNECTIONS = 12;

/** A recover whose decoding fails on every one of 30000 interfaces: its error reply is capped at 1 MiB. */
const HUGE_ERROR_REQUEST = requestBytes(RECOVER, 'vmpt-huge', {
  podNetworkDesc: { podId: 'x', podNs: 'x', podName: 'x' },
  csn: { NsPath: '/var/run/netns/vmpt-huge', Interfaces: new Array<number>(30000).fill(1) },
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let net: CniTestNet;
let d: Daemon;

// the machine may be shared and slow: generous bounds, never timing assertions
vi.setConfig({ testTimeout: 300_000, hookTimeout: 120_000 });

beforeAll(async () => {
  net = await makeCniConf();
  d = await startDaemon({
    confDir: net.confDir,
    binDirs: net.binDirs,
    cacheDir: net.cacheDir,
    extraArgs: ['--request-timeout', String(REQUEST_TIMEOUT_MS), '--max-connections', String(MAX_CONNECTIONS)],
  });
});

afterAll(async () => {
  expect(await d.stop()).toBe(0);
  await net.cleanup();
  removeDir(d.dir);
});

function addPod(): string {
  const k = `vmpt-${rand()}`;
  expect(exchange(d.socket, ADD, k, desc(k)).command).toBe(0x80);
  return k;
}

/** The RLIMIT_NOFILE that leaves exactly n fd numbers free in the process. */
function limitLeaving(pid: number, n: number): number {
  const used = new Set(readdirSync(`/proc/${pid}/fd`).map(Number));
  let free = 0;
  let limit = 0;
  for (; free < n; limit++) if (!used.has(limit)) free++;
  return limit;
}

/** Waits (at most 12 s) for a condition on the daemon; the caller asserts it afterwards. */
async function settled(what: () => boolean): Promise<void> {
  for (let i = 0; i < 480 && !what(); i++) await sleep(25);
}

describe('replies own their fds', () => {
  it('a get reply waiting for a slow reader keeps its fds while a release queued behind it closes the pod', async () => {
    await firstPodDone(d);
    const fdsBefore = await fdsSettled(d);
    const key = addPod();
    // one connection: a request whose 1 MiB error reply fills the socket, then a get; nothing is read yet
    const slowReader = connect(d.socket);
    native().writeAll(slowReader, Buffer.concat([HUGE_ERROR_REQUEST, requestBytes(GET, key)]));
    await sleep(500); // the get has run; its reply waits behind the error, holding its fds
    // the release right behind the get, on another connection, is answered meanwhile
    expect(exchange(d.socket, RELEASE, key).command).toBe(0x81);
    // now read: the error, then the get reply with a live tun fd (not a closed or reused number)
    const errHeader = readFull(slowReader, HEADER);
    expect(errHeader[4]).toBe(0xff);
    expect(readFull(slowReader, errHeader.readUInt32BE(5)).toString()).toMatch(/Interfaces\[0\]/);
    const get = readReply(slowReader)!;
    expect(get.command).toBe(0x82);
    expect(get.fds).toHaveLength(1);
    expect(readlinkSync(`/proc/self/fd/${get.fds[0]}`)).toBe('/dev/net/tun');
    native().close(get.fds[0]!);
    native().close(slowReader);
    // the pod's own fds went with the release, the reply's copies once sent
    expect(await fdsSettled(d)).toBe(fdsBefore);
    expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
  });
});

describe('a slow reader stalls nobody', () => {
  it('a client that never reads: others are served meanwhile, and it is dropped after the stall bound', async () => {
    const fdsBefore = await fdsSettled(d);
    const stuck = connect(d.socket);
    native().writeAll(stuck, HUGE_ERROR_REQUEST);
    await sleep(300);
    // another client goes through a whole pod life while the stuck one holds its reply
    const t0 = Date.now();
    const key = addPod();
    const g = exchange(d.socket, GET, key);
    expect(g.fds).toHaveLength(1);
    native().close(g.fds[0]!);
    expect(exchange(d.socket, RELEASE, key).command).toBe(0x81);
    const othersMs = Date.now() - t0;
    // the stuck client is dropped: reading now gives less than its reply, then EOF
    await settled(() => d.lines().some((l) => l.msg === 'dropping a connection whose peer does not read its reply'));
    expect(d.lines().some((l) => l.msg === 'dropping a connection whose peer does not read its reply')).toBe(true);
    const h = readFull(stuck, HEADER);
    expect(h.length).toBe(HEADER);
    const body = readFull(stuck, h.readUInt32BE(5));
    expect(body.length).toBeLessThan(h.readUInt32BE(5));
    native().close(stuck);
    expect(await fdsSettled(d)).toBe(fdsBefore);
    console.log(`slow reader: another client's add/get/release took ${othersMs} ms meanwhile`);
  });
});

describe('every connection ends', () => {
  it('a client drip-feeding a header is cut off at the deadline counted from its first byte', async () => {
    const fd = connect(d.socket, 20_000);
    const bytes = requestBytes(LIST, '');
    const t0 = Date.now();
    let sent = 0;
    let reply: ReturnType<typeof readReply> = null;
    // one byte every 200 ms: the header alone would take 15 s, the deadline is 3 s
    for (; sent < bytes.length; sent++) {
      try {
        native().writeAll(fd, bytes.subarray(sent, sent + 1));
      } catch {
        break; // EPIPE: the daemon closed it
      }
      await sleep(200);
      if (Date.now() - t0 > REQUEST_TIMEOUT_MS + 2000) break;
    }
    reply = readReply(fd);
    native().close(fd);
    expect(sent).toBeLessThan(bytes.length);
    expect(reply?.command).toBe(0xff);
    expect(reply?.data.toString()).toMatch(
      new RegExp(`no complete request within ${REQUEST_TIMEOUT_MS} ms of its first byte`),
    );
  });

  it('more than 16 pipelined requests: the first 16 are answered, then an error, then the close', () => {
    const fd = connect(d.socket);
    native().writeAll(fd, Buffer.concat(Array.from({ length: 20 }, () => requestBytes(LIST, ''))));
    const replies = readUntilEof(fd);
    native().close(fd);
    expect(replies.map((r) => r.command)).toEqual([...new Array<number>(16).fill(0x84), 0xff]);
    expect(replies[16]!.data.toString()).toMatch(/more than 16 requests pipelined on one connection/);
  });

  it('a valid request followed by garbage in the same write gets its reply, then the error', () => {
    const fd = connect(d.socket);
    native().writeAll(fd, Buffer.concat([requestBytes(LIST, ''), Buffer.from('GET / HTTP/1.1\r\n\r\n')]));
    const replies = readUntilEof(fd);
    native().close(fd);
    expect(replies.map((r) => r.command)).toEqual([0x84, 0xff]);
    expect(replies[1]!.data.toString()).toMatch(/bad magic/);
  });

  it('beyond --max-connections a newcomer gets an error and is closed; once one goes, new ones are served', async () => {
    const held: number[] = [];
    // accepted in order: the newcomer comes after the ones held (which the idle timeout would close in 3 s)
    for (let i = 0; i < MAX_CONNECTIONS; i++) held.push(connect(d.socket));
    const extra = connect(d.socket);
    const r = readReply(extra);
    native().close(extra);
    expect(r?.command).toBe(0xff);
    expect(r?.data.toString()).toMatch(new RegExp(`too many connections: ${MAX_CONNECTIONS} are being served`));
    native().close(held.pop()!);
    await sleep(200);
    expect(exchange(d.socket, LIST, '').command).toBe(0x84);
    for (const fd of held) native().close(fd);
  });

  it('out of fds (EMFILE): a newcomer is closed, not left to spin the daemon; it serves again once fds are free', async () => {
    await settled(() => d.fdCount() < 40);
    // the daemon closes the connections earlier tests left as it notices them: wait until its fds stop changing
    for (let prev = -1, i = 0; i < 60 && d.fdCount() !== prev; i++) {
      prev = d.fdCount();
      await sleep(250);
    }
    // the limit bounds fd numbers, not their count: closed fds leave gaps below the highest, which a newcomer fills
    const limit = limitLeaving(d.pid, 3);
    // the soft limit only: lowering the hard limit could not be undone without CAP_SYS_RESOURCE
    const soft = (
      await execa('prlimit', ['--pid', String(d.pid), '--nofile', '--raw', '--noheadings', '--output=SOFT'])
    ).stdout.trim();
    await execa('prlimit', ['--pid', String(d.pid), `--nofile=${limit}:`]);
    const held: number[] = [];
    try {
      // more connections than fds left: the first few are taken, the rest are accepted and closed at once
      for (let i = 0; i < 6; i++) held.push(connect(d.socket));
      await settled(() =>
        d.lines().some((l) => l.msg === 'out of file descriptors: a new connection was closed unserved'),
      );
      expect(d.lines().some((l) => l.msg === 'out of file descriptors: a new connection was closed unserved')).toBe(
        true,
      );
      const cpu0 = cpuTicks(d.pid);
      await sleep(1000);
      const cpuMs = (cpuTicks(d.pid) - cpu0) * 10;
      console.log(`EMFILE: the daemon used ${cpuMs} ms of CPU in the next second`);
    } finally {
      for (const fd of held) native().close(fd);
      await execa('prlimit', ['--pid', String(d.pid), `--nofile=${soft}:`]);
    }
    await sleep(200);
    expect(d.alive()).toBe(true);
    expect(exchange(d.socket, LIST, '').command).toBe(0x84);
  });
});

/** utime + stime of a process, in clock ticks (USER_HZ, 100 on Linux). */
function cpuTicks(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return Number(f[11]) + Number(f[12]);
}
