// The get the addon answers by itself (tapmanager at its default log level, info): what a VM start sees is the
// daemon's own reply, byte for byte, with the tap; a connection moves to the daemon for anything else and goes on
// working; a released pod is never answered with its old taps; the addon's connections end; nothing is left.
import { describe, it, expect, beforeAll, afterAll, vi } from 'vitest';
import { readdirSync, readlinkSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { startDaemon, stopDaemonAndNet, removeDir, fdsSettled, type Daemon } from '../helpers/daemon.js';
import { makeCniConf, type CniTestNet } from '../helpers/cniconf.js';
import { connect, exchange, readFull, readReply, requestBytes, type RawReply } from '../helpers/rawclient.js';
import { native } from '../../src/native.js';

const rand = () => randomBytes(3).toString('hex');
const desc = (k: string) => ({ podNetworkDesc: { podId: k, podNs: 'default', podName: k, DNS: null } });
const ADD = 0;
const RELEASE = 1;
const GET = 2;
const REQUEST_TIMEOUT_MS = 2000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

let net: CniTestNet;
let d: Daemon;
const added: string[] = [];

vi.setConfig({ testTimeout: 180_000, hookTimeout: 120_000 });

beforeAll(async () => {
  net = await makeCniConf();
  d = await startDaemon({
    confDir: net.confDir,
    binDirs: net.binDirs,
    cacheDir: net.cacheDir,
    extraArgs: ['--http-listen', '127.0.0.1:0', '--request-timeout', String(REQUEST_TIMEOUT_MS)],
  });
});

afterAll(async () => {
  for (const k of added) exchange(d.socket, RELEASE, k);
  await stopDaemonAndNet(d, net);
  removeDir(d.dir);
});

function addPod(): string {
  const k = `vmpf-${rand()}`;
  expect(exchange(d.socket, ADD, k, desc(k)).command).toBe(0x80);
  added.push(k);
  return k;
}

/** the daemon's fds open on /dev/net/tun (its taps) */
function tapFds(): number {
  let n = 0;
  for (const fd of readdirSync(`/proc/${d.pid}/fd`)) {
    try {
      if (readlinkSync(`/proc/${d.pid}/fd/${fd}`) === '/dev/net/tun') n++;
    } catch {
      /* closed meanwhile */
    }
  }
  return n;
}

/** what a user compares: the reply's fields and payload, and that each fd received is a tap; the fds are closed */
function seen(r: RawReply): object {
  const taps = r.fds.map((fd) => readlinkSync(`/proc/self/fd/${fd}`));
  for (const fd of r.fds) native().close(fd);
  return { command: r.command, key: r.key, dataSize: r.dataSize, oobSize: r.oobSize, data: r.data.toString(), taps };
}

function metric(body: string, labels: string): number | undefined {
  const line = body.split('\n').find((l) => l.startsWith(`vmpod_requests_total{${labels}} `));
  return line === undefined ? undefined : Number(line.split(' ').pop());
}

describe('get answered by the addon', () => {
  it('is the daemon reply byte for byte, with the tap, and counted in the metrics', async () => {
    const k = addPod();
    const fast = seen(exchange(d.socket, GET, k));
    expect(fast).toMatchObject({ command: 0x82, key: k, taps: ['/dev/net/tun'] });
    expect(JSON.parse((fast as { data: string }).data)).toEqual([expect.objectContaining({ type: 0, fdIndex: 0 })]);

    // the same get with its header in two writes: the addon hands the connection to the daemon, which answers
    const fd = connect(d.socket);
    try {
      const req = requestBytes(GET, k);
      native().writeAll(fd, req.subarray(0, 10));
      await sleep(50);
      native().writeAll(fd, req.subarray(10));
      expect(seen(readReply(fd)!)).toEqual(fast);
    } finally {
      native().close(fd);
    }

    const port = d.lines().find((l) => l.msg === 'HTTP listening: /healthz /readyz /metrics')!.port as number;
    const body = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
    expect(metric(body, 'command="get",result="ok"')).toBe(2);
    // only the daemon's answer is timed: the first get never reached it
    expect(body.split('\n')).toContain('vmpod_request_duration_seconds_count{command="get"} 1');
    expect(d.lines().filter((l) => l.msg === 'get done')).toEqual([]); // no line per get at info
  });

  it('a connection goes on after it: get, add, get on one connection, and two gets in one write, in order', () => {
    const k = addPod();
    const k2 = `vmpf-${rand()}`;
    const fd = connect(d.socket);
    try {
      const n = native();
      n.writeAll(fd, requestBytes(GET, k));
      expect(seen(readReply(fd)!)).toMatchObject({ command: 0x82, key: k, taps: ['/dev/net/tun'] });
      n.writeAll(fd, requestBytes(ADD, k2, desc(k2)));
      added.push(k2);
      expect(readReply(fd)).toMatchObject({ command: 0x80, key: k2 });
      n.writeAll(fd, requestBytes(GET, k2));
      expect(seen(readReply(fd)!)).toMatchObject({ command: 0x82, key: k2, taps: ['/dev/net/tun'] });
    } finally {
      native().close(fd);
    }
    const fd2 = connect(d.socket);
    try {
      native().writeAll(fd2, Buffer.concat([requestBytes(GET, k), requestBytes(GET, k2)]));
      expect(seen(readReply(fd2)!)).toMatchObject({ command: 0x82, key: k, taps: ['/dev/net/tun'] });
      expect(seen(readReply(fd2)!)).toMatchObject({ command: 0x82, key: k2, taps: ['/dev/net/tun'] });
    } finally {
      native().close(fd2);
    }
  });

  it('a connection kept open after its get is still served, right away or later, and its hang-up frees it', async () => {
    const k = addPod();
    const fdsBefore = await fdsSettled(d);
    const fd = connect(d.socket);
    try {
      const n = native();
      n.writeAll(fd, requestBytes(GET, k));
      expect(seen(readReply(fd)!)).toMatchObject({ command: 0x82, key: k, taps: ['/dev/net/tun'] });
      // at once (the connection is still settling), then after the daemon has moved it to its epoll set
      n.writeAll(fd, requestBytes(GET, k));
      expect(seen(readReply(fd)!)).toMatchObject({ command: 0x82, key: k, taps: ['/dev/net/tun'] });
      await sleep(50);
      n.writeAll(fd, requestBytes(GET, k));
      expect(seen(readReply(fd)!)).toMatchObject({ command: 0x82, key: k, taps: ['/dev/net/tun'] });
    } finally {
      native().close(fd);
    }
    expect(await fdsSettled(d)).toBe(fdsBefore);
  });

  it('connections waiting at once, gets mixed with requests the daemon serves itself, each get their own answer', async () => {
    const k = addPod();
    const unknown = `vmpf-${rand()}`;
    const fdsBefore = await fdsSettled(d);
    const n = native();
    // all connected and written before any is read: the daemon finds several waiting when it wakes (it takes up to 8
    // gets per wake-up, and a connection it hands to its JS side ends the batch)
    const fds = Array.from({ length: 24 }, () => connect(d.socket));
    try {
      fds.forEach((fd, i) => n.writeAll(fd, requestBytes(GET, i % 5 === 2 ? unknown : k)));
      fds.forEach((fd, i) => {
        const r = readReply(fd)!;
        if (i % 5 === 2) {
          expect(r).toMatchObject({ command: 0xff, fds: [] });
          expect(r.data.toString()).toContain(unknown);
        } else {
          expect(seen(r)).toMatchObject({ command: 0x82, key: k, taps: ['/dev/net/tun'] });
        }
      });
    } finally {
      for (const fd of fds) n.close(fd);
    }
    expect(await fdsSettled(d)).toBe(fdsBefore);
  });

  it('a released pod gets an error naming it, never its old taps; the daemon keeps no tap of it', () => {
    const before = tapFds();
    const k = addPod();
    expect(seen(exchange(d.socket, GET, k))).toMatchObject({ command: 0x82, taps: ['/dev/net/tun'] });
    expect(tapFds()).toBeGreaterThan(before);
    expect(exchange(d.socket, RELEASE, k).command).toBe(0x81);
    added.splice(added.indexOf(k), 1);
    const r = exchange(d.socket, GET, k);
    expect(r.command).toBe(0xff);
    expect(r.fds).toEqual([]);
    expect(r.data.toString()).toContain(k);
    expect(tapFds()).toBe(before);
  });

  it('garbage from 300 peers (bad magic, partial headers, huge sizes, hang-ups) never stops it, nor leaks an fd', async () => {
    const k = addPod();
    const n = native();
    const fdsBefore = await fdsSettled(d);
    const valid = requestBytes(GET, k);
    for (let i = 0; i < 300; i++) {
      const fd = connect(d.socket, 15_000);
      try {
        const kind = i % 5;
        const junk =
          kind === 0
            ? randomBytes(1 + (i % 200)) // noise
            : kind === 1
              ? valid.subarray(0, 1 + (i % 76)) // a header cut short, then a hang-up
              : kind === 2
                ? Buffer.concat([valid.subarray(0, 5), Buffer.from([0xff, 0xff, 0xff, 0xff]), valid.subarray(9)]) // a 4 GB get
                : kind === 3
                  ? Buffer.concat([valid, randomBytes(3)]) // a get, then noise
                  : valid;
        n.writeAll(fd, junk);
        if (kind === 3 || kind === 4)
          expect(seen(readReply(fd)!)).toMatchObject({ command: 0x82, key: k, taps: ['/dev/net/tun'] });
      } finally {
        n.close(fd);
      }
    }
    expect(d.alive()).toBe(true);
    expect(seen(exchange(d.socket, GET, k))).toMatchObject({ command: 0x82, key: k, taps: ['/dev/net/tun'] });
    expect(await fdsSettled(d)).toBe(fdsBefore);
  });

  it('a connection that sends nothing is closed after the request timeout', () => {
    const fd = connect(d.socket, 15_000);
    try {
      const t0 = Date.now();
      expect(readFull(fd, 77).length).toBe(0); // EOF, not the 15 s receive timeout
      expect(Date.now() - t0).toBeLessThan(12_000);
    } finally {
      native().close(fd);
    }
  });
});
