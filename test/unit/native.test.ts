// The C addon against the real kernel (runs as root): fd passing, taps in a netns, UDP in a netns,
// execve, errno-named errors. Every kernel object is named vmpt-<rand> / short random link names
// and removed in afterAll/afterEach; each suite checks that nothing of its own is left.
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execa } from 'execa';
import { native, netnsAdd, PollEvent, type Native } from '../../src/native.js';

const n: Native = native();
const ADDON = path.resolve(import.meta.dirname, '../../build/Release/vmpod_native.node');
// fcntl.h: O_CLOEXEC is 02000000 (octal) in the "flags:" line of /proc/self/fdinfo/<fd>
const O_CLOEXEC = 0o2000000;

const rand = (): string => randomBytes(4).toString('hex');

async function ip(...args: string[]): Promise<string> {
  const r = await execa('ip', args, { timeout: 10_000 });
  return r.stdout;
}

async function netnsList(): Promise<string[]> {
  const out = await ip('netns', 'list');
  return out
    .split('\n')
    .map((l) => l.split(' ')[0] ?? '')
    .filter((s) => s.length > 0);
}

function fdinfo(fd: number): string {
  return fs.readFileSync(`/proc/self/fdinfo/${fd}`, 'utf8');
}

function isCloexec(fd: number): boolean {
  const m = /^flags:\s+([0-7]+)$/m.exec(fdinfo(fd));
  if (!m?.[1]) throw new Error(`no flags in fdinfo of ${fd}`);
  return (parseInt(m[1], 8) & O_CLOEXEC) !== 0;
}

/** Resolves on the next readability (or hangup) of fd; the poll stops after one event. */
function readable(fd: number): Promise<void> {
  return new Promise((resolve, reject) => {
    const p = n.pollReadable(fd, (err) => {
      p.stop();
      if (err) reject(err);
      else resolve();
    });
  });
}

function errorOf(fn: () => unknown): NodeJS.ErrnoException {
  try {
    fn();
  } catch (e) {
    return e as NodeJS.ErrnoException;
  }
  throw new Error('expected a throw');
}

describe('errors', () => {
  it('close of an invalid or closed fd throws EBADF with errno and a message naming the fd', () => {
    const e = errorOf(() => n.close(-1));
    expect(e).toBeInstanceOf(Error);
    expect(e.code).toBe('EBADF');
    expect(e.errno).toBe(9);
    expect(e.message).toBe('close fd -1: EBADF (Bad file descriptor)');

    const fd = n.dupCloexec(0, 100);
    expect(fd).toBeGreaterThanOrEqual(100);
    expect(isCloexec(fd)).toBe(true);
    n.close(fd);
    expect(errorOf(() => n.close(fd)).code).toBe('EBADF');
  });

  it('connectUnix to a missing path throws ENOENT naming the path', () => {
    const p = path.join(os.tmpdir(), `vmpt-missing-${rand()}.sock`);
    const e = errorOf(() => n.connectUnix(p));
    expect(e.code).toBe('ENOENT');
    expect(e.message).toContain(p);
  });

  it('bad JS arguments throw TypeError, with code EINVAL and its errno as every addon error has', () => {
    const calls: (() => unknown)[] = [
      () => n.close('3' as unknown as number),
      () => n.read(0, 1.5),
      () => n.trySendMsg(0, 'x' as unknown as Buffer, []),
      () => n.openTap('/proc/self/ns/net', 'a-name-longer-than-15'),
      () => n.connectUnix('a\0b'),
      () => n.listenUnix(42 as unknown as string, 0o600, 1),
      () => n.mallocArenaMax(0),
      () => n.mallocArenaMax(65),
      () => n.reserveFds(0),
      () =>
        n.fastGetServer(
          0,
          { allowedGids: 'x' } as never,
          () => {},
          () => {},
        ),
    ];
    for (const call of calls) {
      const e = errorOf(call);
      expect(e).toBeInstanceOf(TypeError);
      expect({ code: e.code, errno: e.errno }).toEqual({ code: 'EINVAL', errno: os.constants.errno.EINVAL });
    }
  });

  it('mallocArenaMax takes a count from 1 to 64 (tapmanager sets 2 at its start)', () => {
    expect(n.mallocArenaMax(64)).toBeUndefined();
  });

  it('reserveFds grows the fd table at once, on a pool thread, and leaves no fd of its own open', async () => {
    const fdSize = (): number => Number(/^FDSize:\s+(\d+)$/m.exec(fs.readFileSync('/proc/self/status', 'utf8'))?.[1]);
    const before = fdSize();
    // within the soft RLIMIT_NOFILE, where it stops
    const limit = Number(/^Max open files\s+(\d+)/m.exec(fs.readFileSync('/proc/self/limits', 'utf8'))?.[1]);
    const want = Math.min(before * 4, limit);
    const open = fs.readdirSync('/proc/self/fd').length;
    const held = await n.reserveFds(want);
    expect(held).toBeGreaterThanOrEqual(want);
    expect(fdSize()).toBeGreaterThanOrEqual(want);
    expect(fs.readdirSync('/proc/self/fd').length).toBe(open);
    // a size the table holds already: nothing to grow, the same answer
    expect(await n.reserveFds(8)).toBeGreaterThanOrEqual(8);
  });
});

describe('unix sockets and fd passing', () => {
  let dir: string;
  let sockPath: string;
  let listenFd = -1;
  const open: number[] = [];
  const track = (fd: number): number => {
    open.push(fd);
    return fd;
  };

  beforeAll(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmpt-'));
    sockPath = path.join(dir, 'fd.sock');
    listenFd = n.listenUnix(sockPath, 0o660, 16);
  });

  afterEach(() => {
    for (const fd of open.splice(0)) {
      try {
        n.close(fd);
      } catch {
        // closed by the test itself
      }
    }
  });

  afterAll(() => {
    n.close(listenFd);
    fs.rmSync(dir, { recursive: true, force: true });
    expect(fs.existsSync(dir)).toBe(false);
  });

  /** A connected pair: client (blocking) and the accepted server side (nonblocking). */
  async function pair(): Promise<{ client: number; server: number }> {
    // connections nobody accepted yet go first: listenUnix's liveness probe (the EADDRINUSE test) leaves one in the
    // backlog, and an accept would hand it out instead of ours (its peer is gone: EPIPE, EOF)
    for (let fd = n.accept(listenFd); fd >= 0; fd = n.accept(listenFd)) n.close(fd);
    const client = track(n.connectUnix(sockPath));
    await readable(listenFd);
    const server = track(n.accept(listenFd));
    expect(server).toBeGreaterThan(2);
    return { client, server };
  }

  it('listenUnix makes a socket with the mode, CLOEXEC, and replaces a stale socket', () => {
    const st = fs.statSync(sockPath);
    expect(st.isSocket()).toBe(true);
    expect(st.mode & 0o777).toBe(0o660);
    expect(isCloexec(listenFd)).toBe(true);
    expect(n.accept(listenFd)).toBe(-1); // nothing pending: EAGAIN

    // a stale socket file of an earlier run
    const stale = path.join(dir, 'stale.sock');
    n.close(n.listenUnix(stale, 0o600, 1));
    const fd = track(n.listenUnix(stale, 0o600, 1));
    expect(fs.statSync(stale).mode & 0o777).toBe(0o600);
    n.close(fd);
  });

  it('listenUnix refuses a path that is not a socket and a path longer than sun_path', () => {
    const file = path.join(dir, 'plain-file');
    fs.writeFileSync(file, 'x');
    expect(errorOf(() => n.listenUnix(file, 0o660, 1)).code).toBe('EEXIST');
    expect(fs.readFileSync(file, 'utf8')).toBe('x');
    expect(errorOf(() => n.listenUnix(path.join(dir, 'x'.repeat(120)), 0o660, 1)).code).toBe('ENAMETOOLONG');
  });

  it('accept, peerCred, read: EAGAIN is null, EOF is an empty Buffer', async () => {
    const { client, server } = await pair();
    expect(isCloexec(client)).toBe(true);
    expect(isCloexec(server)).toBe(true);
    const cred = n.peerCred(server);
    expect(cred).toEqual({ pid: process.pid, uid: process.getuid?.(), gid: process.getgid?.() });

    expect(n.read(server, 16)).toBeNull();
    n.writeAll(client, Buffer.from('ping'));
    await readable(server);
    expect(n.read(server, 16)?.toString()).toBe('ping');
    n.close(client);
    await readable(server);
    expect(n.read(server, 16)).toEqual(Buffer.alloc(0));
  });

  it('trySendMsg passes data and 2 fds in one SCM_RIGHTS; recvMsg returns them CLOEXEC', async () => {
    const { client, server } = await pair();
    const a = path.join(dir, 'a');
    const b = path.join(dir, 'b');
    fs.writeFileSync(a, 'A');
    fs.writeFileSync(b, 'B');
    const fa = track(fs.openSync(a, 'r'));
    const fb = track(fs.openSync(b, 'r'));

    expect(n.trySendMsg(server, Buffer.from('hello'), [fa, fb])).toBe(5);
    const r = n.recvMsg(client, 64, 24); // CMSG_SPACE(8) = 24
    r.fds.forEach(track);
    expect(r.data.toString()).toBe('hello');
    expect(r.ctrunc).toBe(false);
    expect(r.fds).toHaveLength(2);
    const [ra, rb] = r.fds as [number, number];
    expect(fs.fstatSync(ra).ino).toBe(fs.fstatSync(fa).ino);
    expect(fs.fstatSync(rb).ino).toBe(fs.fstatSync(fb).ino);
    expect(isCloexec(ra)).toBe(true);
    expect(isCloexec(rb)).toBe(true);
  });

  it('sends one filler byte 0x00 when data is empty and fds are given', async () => {
    const { client, server } = await pair();
    const f = track(fs.openSync(__filenameOf(), 'r'));
    expect(n.trySendMsg(server, Buffer.alloc(0), [f])).toBe(1);
    const r = n.recvMsg(client, 64, 24);
    r.fds.forEach(track);
    expect([...r.data]).toEqual([0]);
    expect(r.fds).toHaveLength(1);
    expect(fs.fstatSync(r.fds[0]!).ino).toBe(fs.fstatSync(f).ino);
    // nothing and no fds: nothing is sent
    expect(n.trySendMsg(server, Buffer.alloc(0), [])).toBe(0);
  });

  it('a control buffer too small for the fds gives ctrunc (the kernel drops the rest)', async () => {
    const { client, server } = await pair();
    const f = track(fs.openSync(__filenameOf(), 'r'));
    n.trySendMsg(server, Buffer.from('x'), [f, f, f]);
    const r = n.recvMsg(client, 64, 24); // room for 2 of the 3 fds
    r.fds.forEach(track);
    expect(r.ctrunc).toBe(true);
    expect(r.fds).toHaveLength(2);

    n.trySendMsg(server, Buffer.from('y'), [f]);
    const r0 = n.recvMsg(client, 64, 0); // no control buffer at all
    expect(r0.data.toString()).toBe('y');
    expect(r0.fds).toEqual([]);
    expect(r0.ctrunc).toBe(true);
  });

  it('recvMsg returns an empty Buffer on EOF and EAGAIN after SO_RCVTIMEO', async () => {
    const { client, server } = await pair();
    n.setTimeouts(client, 50);
    expect(errorOf(() => n.recvMsg(client, 64, 24)).code).toBe('EAGAIN');
    n.close(server);
    const r = n.recvMsg(client, 64, 24);
    expect(r.data).toEqual(Buffer.alloc(0));
    expect(r.fds).toEqual([]);
  });

  it('trySendMsg refuses more than 253 fds', async () => {
    const { server } = await pair();
    const e = errorOf(() => n.trySendMsg(server, Buffer.from('x'), new Array<number>(254).fill(0)));
    expect(e.code).toBe('EINVAL');
  });

  it('listenUnix leaves a socket someone listens on alone: EADDRINUSE, and the first listener still accepts', async () => {
    expect(errorOf(() => n.listenUnix(sockPath, 0o660, 1)).code).toBe('EADDRINUSE');
    expect(fs.statSync(sockPath).isSocket()).toBe(true);
    const { client } = await pair();
    expect(client).toBeGreaterThan(2);
  });

  it('trySendMsg sends what fits without waiting, -1 when the socket is full; fds go with the first byte', async () => {
    const { client, server } = await pair();
    const f = track(n.dupCloexec(0, 3));
    expect(n.trySendMsg(server, Buffer.alloc(0), [f])).toBe(1); // the filler byte carries the fd
    const got = n.recvMsg(client, 1, 24);
    expect(got.fds).toHaveLength(1);
    n.close(got.fds[0]!);
    let total = 0;
    let last = 0;
    while ((last = n.trySendMsg(server, Buffer.alloc(64 * 1024), [])) > 0) total += last;
    expect(last).toBe(-1);
    expect(total).toBeGreaterThan(0);
  });

  it('pollReadable().want adds writability: the callback gets the Writable bit', async () => {
    const { server } = await pair();
    const events = await new Promise<number>((resolve) => {
      const p = n.pollReadable(server, (_err, ev) => {
        p.stop();
        resolve(ev);
      });
      p.want(false, true);
    });
    expect(events & PollEvent.Writable).toBe(PollEvent.Writable);
  });

  it('lockExclusive: a second lock on the same dir fails with EAGAIN until the first fd is closed', () => {
    const a = n.lockExclusive(dir);
    expect(isCloexec(a)).toBe(true);
    expect(errorOf(() => n.lockExclusive(dir)).code).toBe('EAGAIN');
    n.close(a);
    n.close(n.lockExclusive(dir));
  });

  it('pollReadable: stop is idempotent and a stopped poller does not call back', async () => {
    const { client, server } = await pair();
    let calls = 0;
    const p = n.pollReadable(server, () => {
      calls++;
    });
    p.stop();
    p.stop();
    n.writeAll(client, Buffer.from('z'));
    await readable(server); // a second poller sees it
    expect(calls).toBe(0);
    expect(n.read(server, 4)?.toString()).toBe('z');
  });

  it('pollReadable keeps the process alive without a JS reference to the poller', async () => {
    // in a child: no reference is kept, GC runs, the poll must still fire and keep the loop alive
    const script = path.join(dir, 'poll-gc.mjs');
    fs.writeFileSync(
      script,
      [
        `import { createRequire } from 'node:module';`,
        `const n = createRequire(import.meta.url)(${JSON.stringify(ADDON)});`,
        `const l = n.listenUnix(process.argv[2], 0o600, 1);`,
        `n.pollReadable(l, () => { const c = n.accept(l); if (c >= 0) { console.log('accepted'); process.exit(0); } });`,
        `setTimeout(() => { globalThis.gc(); const c = n.connectUnix(process.argv[2]); }, 50);`,
      ].join('\n'),
    );
    const r = await execa(process.execPath, ['--expose-gc', script, path.join(dir, 'gc.sock')], { timeout: 20_000 });
    expect(r.stdout).toBe('accepted');
  });

  it('a worker with an active poller terminates cleanly (the uv handle closes before the env ends)', async () => {
    // in a child process, so that a crash shows as a failed exit instead of killing the test runner
    const script = path.join(dir, 'worker.mjs');
    const code = [
      `const n = require(${JSON.stringify(ADDON)});`,
      `const l = n.listenUnix(${JSON.stringify(path.join(dir, 'w'))} + require('worker_threads').threadId, 0o600, 1);`,
      `n.pollReadable(l, () => {});`,
      `require('worker_threads').parentPort.postMessage('ready');`,
    ].join('\n');
    fs.writeFileSync(
      script,
      [
        `import { Worker } from 'node:worker_threads';`,
        `for (let i = 0; i < 3; i++) {`,
        `  const w = new Worker(${JSON.stringify(code)}, { eval: true });`,
        `  await new Promise((r) => w.once('message', r));`,
        `  await w.terminate();`,
        `}`,
        `console.log('ok');`,
      ].join('\n'),
    );
    const r = await execa(process.execPath, [script], { timeout: 20_000, reject: false });
    expect(r.exitCode).toBe(0);
    expect(r.stdout).toBe('ok');
  });
});

function __filenameOf(): string {
  return new URL(import.meta.url).pathname;
}

describe('openTap', () => {
  const nsName = `vmpt-${rand()}`;
  const nsPath = `/var/run/netns/${nsName}`;
  const tapName = `vt${rand()}`; // 10 bytes, unique on this host
  const fds: number[] = [];

  beforeAll(async () => {
    await ip('netns', 'add', nsName);
  });

  afterEach(() => {
    for (const fd of fds.splice(0)) n.close(fd);
  });

  afterAll(async () => {
    await ip('netns', 'delete', nsName);
    expect(await netnsList()).not.toContain(nsName);
    await expect(ip('link', 'show', tapName)).rejects.toThrow();
  });

  it('creates the tap inside the netns, CLOEXEC, and leaves the host netns alone', async () => {
    const before = fs.readlinkSync('/proc/thread-self/ns/net');
    const fd = await n.openTap(nsPath, tapName);
    fds.push(fd);
    expect(fs.readlinkSync('/proc/thread-self/ns/net')).toBe(before);
    expect(fdinfo(fd)).toContain(`iff:\t${tapName}`);
    expect(isCloexec(fd)).toBe(true);
    expect(await ip('-n', nsName, 'link', 'show', tapName)).toContain(tapName);
    await expect(ip('link', 'show', tapName)).rejects.toThrow();
  });

  it('a second single-queue open of an open tap is EBUSY', async () => {
    fds.push(await n.openTap(nsPath, tapName, { vnetHdr: true }));
    await expect(n.openTap(nsPath, tapName, { vnetHdr: true })).rejects.toMatchObject({
      code: 'EBUSY',
      errno: os.constants.errno.EBUSY,
      message: `TUNSETIFF ${tapName} in ${nsPath}: EBUSY (Device or resource busy)`,
    });
  });

  it('multi-queue: two fds on one name', async () => {
    const mq = `vq${rand()}`;
    const a = await n.openTap(nsPath, mq, { multiQueue: true, vnetHdr: true });
    fds.push(a);
    const b = await n.openTap(nsPath, mq, { multiQueue: true, vnetHdr: true });
    fds.push(b);
    expect(fdinfo(a)).toContain(`iff:\t${mq}`);
    expect(fdinfo(b)).toContain(`iff:\t${mq}`);
    // IFF_MULTI_QUEUE must match the existing link: a single-queue open of it fails
    await expect(n.openTap(nsPath, mq)).rejects.toMatchObject({ code: 'EINVAL' });
    expect(await ip('-n', nsName, 'link', 'show', mq)).toContain(mq);
  });

  it('openTapQueues: more queues of a multi-queue tap at once, on the loop or a pool thread, all or none', async () => {
    const mq = `vq${rand()}`;
    const opts = { multiQueue: true, vnetHdr: true };
    fds.push(await n.openTap(nsPath, mq, opts));
    const three = await n.openTapQueues(nsPath, mq, 3, opts);
    fds.push(...three);
    const two = await n.openTapQueues(nsPath, mq, 2, { ...opts, offLoop: true });
    fds.push(...two);
    expect(new Set([...three, ...two]).size).toBe(5);
    for (const fd of [...three, ...two]) {
      expect(fdinfo(fd)).toContain(`iff:\t${mq}`);
      expect(isCloexec(fd)).toBe(true);
    }
    const info = JSON.parse(await ip('-n', nsName, '-j', '-d', 'link', 'show', mq)) as {
      linkinfo: { info_data: { numqueues: number } };
    }[];
    expect(info[0]!.linkinfo.info_data.numqueues).toBe(6);
    // past the kernel's 256 queues: E2BIG, and none of this call's opens is left
    await expect(n.openTapQueues(nsPath, mq, 251, opts)).rejects.toMatchObject({ code: 'E2BIG' });
    const after = JSON.parse(await ip('-n', nsName, '-j', '-d', 'link', 'show', mq)) as {
      linkinfo: { info_data: { numqueues: number } };
    }[];
    expect(after[0]!.linkinfo.info_data.numqueues).toBe(6);
    expect(() => n.openTapQueues(nsPath, mq, 0, opts)).toThrow(/count/);
    expect(() => n.openTapQueues(nsPath, mq, 257, opts)).toThrow(/count/);
  });

  it('exclusive: EBUSY, without an open, when the tap has queues attached; a free tap opens', async () => {
    const mq = `vq${rand()}`;
    const opts = { multiQueue: true, vnetHdr: true };
    // persistent, as tapmanager's taps are: it stays when the last fd goes
    await ip('-n', nsName, 'tuntap', 'add', 'dev', mq, 'mode', 'tap', 'vnet_hdr', 'multi_queue');
    const held = await n.openTap(nsPath, mq, opts);
    fds.push(held);
    await expect(n.openTap(nsPath, mq, { ...opts, exclusive: true })).rejects.toMatchObject({
      code: 'EBUSY',
      message: `tap ${mq} in ${nsPath} has 1 queue attached: EBUSY (Device or resource busy)`,
    });
    fds.splice(fds.indexOf(held), 1);
    n.close(held);
    const fd = await n.openTap(nsPath, mq, { ...opts, exclusive: true, offLoop: true });
    fds.push(fd);
    expect(fdinfo(fd)).toContain(`iff:\t${mq}`);
    // a link that is not there: ENODEV, none in the dump of the links (without exclusive, TUNSETIFF would make a new
    // tap)
    await expect(n.openTap(nsPath, `vx${rand()}`, { ...opts, exclusive: true })).rejects.toMatchObject({
      code: 'ENODEV',
    });
  });

  it('a missing nsPath gives ENOENT and the thread stays in its netns', async () => {
    const before = fs.readlinkSync('/proc/thread-self/ns/net');
    await expect(n.openTap(`/var/run/netns/vmpt-missing-${rand()}`, tapName)).rejects.toMatchObject({ code: 'ENOENT' });
    expect(fs.readlinkSync('/proc/thread-self/ns/net')).toBe(before);
    // a path that is not a netns: setns fails, still home
    await expect(n.openTap('/etc/hostname', tapName)).rejects.toMatchObject({ code: 'EINVAL' });
    expect(fs.readlinkSync('/proc/thread-self/ns/net')).toBe(before);
  });

  it('offLoop: the same tap opened on a pool thread, with the same errors', async () => {
    const before = fs.readlinkSync('/proc/thread-self/ns/net');
    const fd = await n.openTap(nsPath, tapName, { vnetHdr: true, offLoop: true });
    fds.push(fd);
    expect(fdinfo(fd)).toContain(`iff:\t${tapName}`);
    expect(isCloexec(fd)).toBe(true);
    expect(fs.readlinkSync('/proc/thread-self/ns/net')).toBe(before);
    const off = { vnetHdr: true, offLoop: true };
    await expect(n.openTap(nsPath, tapName, off)).rejects.toMatchObject({
      code: 'EBUSY',
      message: `TUNSETIFF ${tapName} in ${nsPath}: EBUSY (Device or resource busy)`,
    });
    await expect(n.openTap(`/var/run/netns/vmpt-missing-${rand()}`, tapName, off)).rejects.toMatchObject({
      code: 'ENOENT',
    });
    await expect(n.openTap('/etc/hostname', tapName, off)).rejects.toMatchObject({ code: 'EINVAL' });
    // bad arguments throw at once, on the loop or off it
    expect(() => n.openTap(nsPath, 'a-name-longer-than-15', off)).toThrow(TypeError);
    expect(() => n.openTap(nsPath, tapName, 1 as never)).toThrow(/openTap: opts must be an object/);
    expect(() => n.openTap(nsPath, tapName, { offLoop: 1 } as never)).toThrow(TypeError);
  });
});

describe('killGroup', () => {
  it('returns the errno instead of throwing: ESRCH for a group that is gone; a pgid below 2 is refused', () => {
    expect(n.killGroup(2 ** 22 + 12345, 0)).toBe(os.constants.errno.ESRCH);
    expect(() => n.killGroup(1, 9)).toThrow(/killGroup: pgid must be an integer in \[2, /);
    expect(() => n.killGroup(0, 9)).toThrow(/pgid/);
  });
});

describe('netnsMake, netnsBind (netnsAdd), netnsDel', () => {
  const made: string[] = [];
  afterAll(async () => {
    for (const name of made)
      if (fs.existsSync(`/var/run/netns/${name}`)) await execa('ip', ['netns', 'del', name], { reject: false });
    const left = await netnsList();
    for (const name of made) expect(left).not.toContain(name);
  });

  it('makes a netns that `ip netns` and `ip -n` see, off the main thread, and the caller stays in its own', async () => {
    const name = `vmpt-${rand()}`;
    made.push(name);
    const before = fs.readlinkSync('/proc/thread-self/ns/net');
    await netnsAdd('/var/run/netns', name);
    expect(fs.readlinkSync('/proc/thread-self/ns/net')).toBe(before);
    expect(await netnsList()).toContain(name);
    // a netns of its own: only lo, down, and not the host's
    expect(await ip('-n', name, '-o', 'link', 'show')).toMatch(/^1: lo: <LOOPBACK> /);
    const inode = (await execa('ip', ['netns', 'exec', name, 'readlink', '/proc/self/ns/net'])).stdout.trim();
    expect(inode).not.toBe(before);
    // the pool thread went back too: a second netns is another new one, not made inside the first
    const second = `vmpt-${rand()}`;
    made.push(second);
    await netnsAdd('/var/run/netns', second);
    expect((await execa('ip', ['netns', 'exec', second, 'readlink', '/proc/self/ns/net'])).stdout.trim()).not.toBe(
      inode,
    );
    await n.netnsDel(`/var/run/netns/${name}`);
    await n.netnsDel(`/var/run/netns/${second}`);
    expect(await netnsList()).not.toContain(name);
    expect(await netnsList()).not.toContain(second);
  });

  it('writes its sysctls inside the new netns, and a failing one leaves no netns', async () => {
    const name = `vmpt-${rand()}`;
    made.push(name);
    const host = fs.readFileSync('/proc/sys/net/ipv4/conf/default/rp_filter', 'utf8').trim();
    const want = host === '2' ? '1' : '2';
    await netnsAdd('/var/run/netns', name, [
      `net.ipv4.conf.default.rp_filter=${want}`,
      'net.ipv6.conf.default.accept_dad=0',
    ]);
    const read = (k: string) =>
      execa('ip', ['netns', 'exec', name, 'cat', `/proc/sys/net/${k}`]).then((r) => r.stdout.trim());
    expect([await read('ipv4/conf/default/rp_filter'), await read('ipv6/conf/default/accept_dad')]).toEqual([
      want,
      '0',
    ]);
    expect(fs.readFileSync('/proc/sys/net/ipv4/conf/default/rp_filter', 'utf8').trim()).toBe(host);
    await n.netnsDel(`/var/run/netns/${name}`);
    const bad = `vmpt-${rand()}`;
    made.push(bad);
    await expect(netnsAdd('/var/run/netns', bad, ['net.ipv4.conf.vmpt-nosuchdev.rp_filter=0'])).rejects.toMatchObject({
      code: 'ENOENT',
      errno: os.constants.errno.ENOENT,
      message: 'netnsMake: sysctl -w net.ipv4.conf.vmpt-nosuchdev.rp_filter=0: ENOENT (No such file or directory)',
    });
    expect(fs.existsSync(`/var/run/netns/${bad}`)).toBe(false);
    expect(await netnsList()).not.toContain(bad);
  });

  it('a taken name rejects with EEXIST and leaves the existing netns alone', async () => {
    const name = `vmpt-${rand()}`;
    made.push(name);
    await ip('netns', 'add', name);
    await ip('-n', name, 'link', 'add', 'vmptd0', 'type', 'bridge');
    await expect(netnsAdd('/var/run/netns', name)).rejects.toMatchObject({
      code: 'EEXIST',
      message: `netnsBind: create /var/run/netns/${name}: EEXIST (File exists)`,
    });
    expect(await ip('-n', name, 'link', 'show', 'vmptd0')).toContain('vmptd0');
    await ip('netns', 'del', name);
  });

  it('refuses names that are not one file name, and removes a file that is no mount', async () => {
    const typeError = { name: 'TypeError', code: 'EINVAL', errno: os.constants.errno.EINVAL };
    await expect(netnsAdd('/var/run/netns', '../x')).rejects.toMatchObject(typeError);
    await expect(netnsAdd('relative', 'x')).rejects.toMatchObject(typeError);
    await expect(netnsAdd('/var/run/netns', 'x', ['net/../../x=1'])).rejects.toThrow(
      /netnsMake: setting "net\/..\/..\/x=1" is not name=value/,
    );
    expect(fs.existsSync('/var/run/netns/x')).toBe(false);
    expect(() => n.netnsDel('x')).toThrow(TypeError);
    const name = `vmpt-${rand()}`;
    fs.writeFileSync(`/var/run/netns/${name}`, '');
    await n.netnsDel(`/var/run/netns/${name}`);
    expect(fs.existsSync(`/var/run/netns/${name}`)).toBe(false);
    await expect(n.netnsDel(`/var/run/netns/${name}`)).rejects.toMatchObject({ code: 'ENOENT' });
  });
});

describe('netnsMake sysctls', () => {
  it('refuses malformed setting names before anything is made', () => {
    for (const bad of ['../../etc/passwd=x', 'net/ipv4=1', 'noequals', '=1', 'Net.IPv4=1']) {
      const e = errorOf(() => n.netnsMake([bad]));
      expect(e).toBeInstanceOf(TypeError);
      expect(e.code).toBe('EINVAL');
    }
  });
});

describe('udpSocketInNetns, recvFrom, sendTo; packetSocketInNetns, recvFrame', () => {
  // two netns joined by a veth pair: the datagram arrives on a real interface
  const ns1 = `vmpt-${rand()}`;
  const ns2 = `vmpt-${rand()}`;
  const fds: number[] = [];

  beforeAll(async () => {
    await ip('netns', 'add', ns1);
    await ip('netns', 'add', ns2);
    await ip('-n', ns1, 'link', 'add', 'v1', 'type', 'veth', 'peer', 'name', 'v2', 'netns', ns2);
    await ip('-n', ns1, 'addr', 'add', '10.253.7.1/24', 'dev', 'v1');
    await ip('-n', ns2, 'addr', 'add', '10.253.7.2/24', 'dev', 'v2');
    await ip('-n', ns1, 'link', 'set', 'v1', 'up');
    await ip('-n', ns2, 'link', 'set', 'v2', 'up');
  });

  afterAll(async () => {
    for (const fd of fds.splice(0)) n.close(fd);
    await ip('netns', 'delete', ns1);
    await ip('netns', 'delete', ns2);
    const left = await netnsList();
    expect(left).not.toContain(ns1);
    expect(left).not.toContain(ns2);
  });

  async function ifindex(ns: string, dev: string): Promise<number> {
    const [link] = JSON.parse(await ip('-n', ns, '-j', 'link', 'show', dev)) as { ifindex: number }[];
    return link!.ifindex;
  }

  async function recvOne(fd: number): Promise<NonNullable<ReturnType<Native['recvFrom']>>> {
    for (;;) {
      const r = n.recvFrom(fd, 1500);
      if (r) return r;
      await readable(fd);
    }
  }

  it('receives unicast and broadcast with source, port and ifindex', async () => {
    const server = n.udpSocketInNetns(`/var/run/netns/${ns1}`, 'v1', 6767);
    fds.push(server);
    const client = n.udpSocketInNetns(`/var/run/netns/${ns2}`, 'v2', 6768);
    fds.push(client);
    expect(isCloexec(server)).toBe(true);
    expect(n.recvFrom(server, 1500)).toBeNull();
    const v1 = await ifindex(ns1, 'v1');

    expect(n.sendTo(client, Buffer.from('unicast'), '10.253.7.1', 6767)).toBe(7);
    const u = await recvOne(server);
    expect(u).toEqual({ data: Buffer.from('unicast'), address: '10.253.7.2', port: 6768, ifindex: v1 });

    // the DHCP case: a broadcast out of the bound device
    n.sendTo(client, Buffer.from('bcast'), '255.255.255.255', 6767);
    const b = await recvOne(server);
    expect(b).toEqual({ data: Buffer.from('bcast'), address: '10.253.7.2', port: 6768, ifindex: v1 });

    expect(() => n.sendTo(client, Buffer.from('x'), '10.253.7', 6767)).toThrow(TypeError);
  });

  /** the next frame on a packet socket that `want` accepts (others: ARP, MLD, ... skipped) */
  async function nextFrame(fd: number, want: (f: Buffer) => boolean): Promise<{ data: Buffer; csumNotReady: boolean }> {
    for (;;) {
      const r = n.recvFrame(fd, 2048);
      if (r && want(r.data)) return r;
      if (!r) await readable(fd);
    }
  }
  const ACCEPT_ALL = Buffer.from([0x06, 0, 0, 0, 0, 0, 0x04, 0]);
  const udpTo =
    (port: number, off = 0) =>
    (f: Buffer) =>
      f.readUInt16BE(off + 12) === 0x0800 && f[off + 23] === 17 && f.readUInt16BE(off + 36) === port;

  it('packetSocketInNetns + recvFrame: a checksum left to fill in (veth tx offload) is reported, a full one is not', async () => {
    const ns1Path = `/var/run/netns/${ns1}`;
    const ns2Path = `/var/run/netns/${ns2}`;
    const raw = n.packetSocketInNetns(ns1Path, 'v1', ACCEPT_ALL);
    fds.push(raw);
    const vnet = n.packetSocketInNetns(ns1Path, 'v1', ACCEPT_ALL, { vnetHdr: true });
    fds.push(vnet);
    const client = n.udpSocketInNetns(ns2Path, 'v2', 6790);
    fds.push(client);
    // a kernel UDP socket sending out of a veth (tx checksum offload on by default): CHECKSUM_PARTIAL
    n.sendTo(client, Buffer.from('partial'), '10.253.7.1', 6791);
    const p = await nextFrame(raw, udpTo(6791));
    expect(p.csumNotReady).toBe(true);
    expect(p.data.subarray(42).toString()).toBe('partial');
    // the same frame with PACKET_VNET_HDR: struct virtio_net_hdr first, VIRTIO_NET_HDR_F_NEEDS_CSUM and where the
    // checksum goes (csum_start: the UDP header, after Ethernet and IPv4; csum_offset 6: UDP's checksum field)
    const v = await nextFrame(vnet, udpTo(6791, 10));
    expect(v.data[0]! & 1).toBe(1);
    expect({ start: v.data.readUInt16LE(6), offset: v.data.readUInt16LE(8) }).toEqual({ start: 34, offset: 6 });
    // a frame written whole, checksum included (as the DHCPv6 server writes its replies), is not reported
    const sender = n.packetSocketInNetns(ns2Path, 'v2', ACCEPT_ALL);
    fds.push(sender);
    const whole = Buffer.from(p.data);
    whole.writeUInt16BE(0, 40); // UDP over IPv4: checksum 0 is "none", a complete datagram
    n.writeAll(sender, whole);
    expect((await nextFrame(raw, (f) => udpTo(6791)(f) && f.readUInt16BE(40) === 0)).csumNotReady).toBe(false);
    expect(() => n.packetSocketInNetns(ns1Path, 'v1', ACCEPT_ALL, { vnetHdr: 'yes' as never })).toThrow(TypeError);
  });

  it('errors name the netns and the device', () => {
    const e = errorOf(() => n.udpSocketInNetns(`/var/run/netns/${ns1}`, 'nosuchdev0', 6769));
    expect(e.code).toBe('ENODEV');
    expect(e.message).toContain('nosuchdev0');
    expect(e.message).toContain(ns1);
  });
});

describe('execve', () => {
  let dir: string;
  beforeAll(() => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmpt-exec-'));
  });
  afterAll(() => {
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('keeps the pid, the kept fd and stdio; closes other fds; resets SIGPIPE and the mask', async () => {
    const keepFile = path.join(dir, 'keep');
    const otherFile = path.join(dir, 'other');
    fs.writeFileSync(keepFile, '');
    fs.writeFileSync(otherFile, '');
    const script = path.join(dir, 'child.mjs');
    // sh lists its own fds, then execs cat on its status: cat's SigIgn/SigBlk are what execve left
    // (dash blocks signals while it waits for a child, so it must not read its own status itself).
    const shScript = 'echo "PID $$"; ls -l /proc/$$/fd; exec cat /proc/self/status';
    fs.writeFileSync(
      script,
      [
        `import { createRequire } from 'node:module';`,
        `import fs from 'node:fs';`,
        `const n = createRequire(import.meta.url)(${JSON.stringify(ADDON)});`,
        `const keep = fs.openSync(${JSON.stringify(keepFile)}, 'r');`,
        `const other = fs.openSync(${JSON.stringify(otherFile)}, 'r');`,
        `fs.writeSync(1, JSON.stringify({ pid: process.pid, keep, other }) + '\\n');`,
        `const env = Object.entries(process.env).map(([k, v]) => k + '=' + v);`,
        `n.execve('/bin/sh', ['sh', '-c', ${JSON.stringify(shScript)}], env, [keep]);`,
      ].join('\n'),
    );
    const r = await execa(process.execPath, [script], { timeout: 20_000 });
    const [first, ...rest] = r.stdout.split('\n');
    const before = JSON.parse(first!) as { pid: number; keep: number; other: number };
    const out = rest.join('\n');

    expect(out).toContain(`PID ${before.pid}`);
    expect(out).toMatch(new RegExp(`^Pid:\\s+${before.pid}$`, 'm'));
    const fdTargets = new Map<number, string>();
    for (const m of out.matchAll(/ (\d+) -> (.*)$/gm)) fdTargets.set(Number(m[1]), m[2]!);
    expect(fdTargets.get(before.keep)).toBe(keepFile);
    expect([...fdTargets.values()]).not.toContain(otherFile);
    for (const fd of [0, 1, 2]) expect(fdTargets.has(fd)).toBe(true);
    // no epoll/eventfd/socket of Node's survived (0..2 are execa's socketpairs)
    const leaked = [...fdTargets].filter(([fd, t]) => fd > 2 && /eventpoll|eventfd|socket:|pipe:/.test(t));
    expect(leaked).toEqual([]);
    expect(out).toMatch(/^SigIgn:\s+0+$/m);
    expect(out).toMatch(/^SigBlk:\s+0+$/m);
  });

  it('a failed execve throws ENOENT and leaves the process usable', () => {
    const e = errorOf(() => n.execve('/nonexistent/vmpt', ['x'], [], []));
    expect(e.code).toBe('ENOENT');
    expect(e.message).toContain('/nonexistent/vmpt');
    expect(errorOf(() => n.execve('/bin/true', ['true'], [], [1_000_000])).code).toBe('EBADF');
  });
});
