// Who may use the socket: uid 0, and the members of --socket-group. File mode 0660 keeps others out; SO_PEERCRED
// keeps out anyone who gets through anyway.
import { describe, it, expect, afterEach } from 'vitest';
import { chmodSync, statSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { startDaemon, removeDir, REPO, type Daemon } from '../helpers/daemon.js';
import { makeCniConf, type CniTestNet } from '../helpers/cniconf.js';

const NOBODY = 65534; // nobody / nogroup on Debian

/**
 * Runs the built fd client's list() as another user (setpriv, so supplementary groups can be given too);
 * returns its exit code and output.
 */
function listAs(
  uid: number,
  gid: number,
  socket: string,
  groups: number[] = [],
): { status: number | null; out: string } {
  const script = `
    import { FdClient } from ${JSON.stringify(join(REPO, 'dist/client/fdclient.js'))};
    try { console.log(JSON.stringify(new FdClient(${JSON.stringify(socket)}, { timeoutMs: 5000 }).list())); }
    catch (e) { console.log(String(e.message)); process.exit(3); }`;
  const ids = [`--reuid=${uid}`, `--regid=${gid}`, groups.length ? `--groups=${groups.join(',')}` : '--clear-groups'];
  const r = spawnSync('setpriv', [...ids, process.execPath, '--input-type=module', '-e', script], {
    encoding: 'utf8',
    timeout: 20_000,
  });
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
}

let net: CniTestNet | undefined;
let d: Daemon | undefined;
afterEach(async () => {
  if (d) {
    expect(await d.stop()).toBe(0);
    removeDir(d.dir);
  }
  await net?.cleanup();
  d = undefined;
  net = undefined;
});

describe('socket access', () => {
  it('refuses a peer that is neither root nor in the socket group, even when the file mode lets it connect', async () => {
    net = await makeCniConf();
    d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir });
    chmodSync(d.dir, 0o755);
    // 0660 root:root: nobody cannot even connect
    expect(listAs(NOBODY, NOBODY, d.socket)).toMatchObject({ status: 3, out: expect.stringMatching(/EACCES/) });
    // opened up by hand: the server still refuses by credentials, and says why
    chmodSync(d.socket, 0o666);
    const r = listAs(NOBODY, NOBODY, d.socket);
    expect(r.status).toBe(3);
    expect(r.out).toMatch(/server returned error: permission denied: uid 65534 gid 65534/);
    expect(d.alive()).toBe(true);
  });

  it('closes a refused peer that keeps writing once it has its reason; others are served meanwhile', async () => {
    net = await makeCniConf();
    // a request timeout far beyond the peer's patience: only a close right after the reason ends its connection
    d = await startDaemon({
      confDir: net.confDir,
      binDirs: net.binDirs,
      cacheDir: net.cacheDir,
      extraArgs: ['--request-timeout', '600000'],
    });
    chmodSync(d.dir, 0o755);
    chmodSync(d.socket, 0o666);
    // as nobody: a list request, then 64 KiB writes until one fails (or 60 s pass); then the reply it was sent
    const script = `
      import { createRequire } from 'node:module';
      const n = createRequire(import.meta.url)(${JSON.stringify(join(REPO, 'build/Release/vmpod_native.node'))});
      const fd = n.connectUnix(${JSON.stringify(d.socket)});
      const head = Buffer.alloc(77, 0x20);
      head.writeUInt32BE(0x42424242, 0); head.writeUInt8(4, 4); head.writeUInt32BE(0, 5); head.writeUInt32BE(0, 9);
      n.writeAll(fd, head);
      n.setTimeouts(fd, 1000);
      let writeError = 'none';
      for (const end = Date.now() + 60_000; Date.now() < end; ) {
        try { n.writeAll(fd, Buffer.alloc(65536, 0x41)); }
        catch (e) { if (e.code !== 'EAGAIN') { writeError = e.code; break; } }
      }
      let reply = Buffer.alloc(0);
      for (;;) {
        let r;
        try { r = n.recvMsg(fd, 65536, 0); } catch (e) { break; }
        if (r.data.length === 0) break;
        reply = Buffer.concat([reply, r.data]);
      }
      console.log(JSON.stringify({ writeError, command: reply[4], text: reply.subarray(77).toString() }));`;
    const r = spawnSync(
      'setpriv',
      ['--reuid=65534', '--regid=65534', '--clear-groups', process.execPath, '--input-type=module', '-e', script],
      {
        encoding: 'utf8',
        timeout: 90_000,
      },
    );
    expect(r.stderr).toBe('');
    const seen = JSON.parse(r.stdout) as { writeError: string; command: number; text: string };
    expect(seen.command).toBe(0xff);
    expect(seen.text).toBe('permission denied: uid 65534 gid 65534 may not use this socket');
    expect(['EPIPE', 'ECONNRESET']).toContain(seen.writeError);
    // the daemon is up and serves root
    expect(listAs(0, 0, d.socket)).toMatchObject({ status: 0, out: '[]\n' });
    expect(d.alive()).toBe(true);
  });

  it('serves the members of --socket-group, and gives the socket that group', async () => {
    net = await makeCniConf();
    d = await startDaemon({
      confDir: net.confDir,
      binDirs: net.binDirs,
      cacheDir: net.cacheDir,
      extraArgs: ['--socket-group', String(NOBODY)],
    });
    chmodSync(d.dir, 0o755);
    const st = statSync(d.socket);
    expect(st.gid).toBe(NOBODY);
    expect(st.mode & 0o777).toBe(0o660);
    const r = listAs(NOBODY, NOBODY, d.socket);
    expect(r).toMatchObject({ status: 0 });
    expect(JSON.parse(r.out)).toEqual([]);
    // a member through a supplementary group (primary group 100, "users") is served too
    expect(listAs(NOBODY, 100, d.socket, [NOBODY])).toMatchObject({ status: 0 });
    // and without the group, refused by the file mode
    expect(listAs(NOBODY, 100, d.socket)).toMatchObject({ status: 3 });
  });
});

describe('per-key serialisation, cross-key parallelism', () => {
  it('a release sent while its add is still running waits for it; another pod is set up meanwhile', async () => {
    const { writeFileSync, readFileSync, mkdirSync, chmodSync: chmod } = await import('node:fs');
    const { randomBytes } = await import('node:crypto');
    const { encodeHeader } = await import('../../src/protocol/header.js');
    const { native } = await import('../../src/native.js');
    const { SYSTEM_CNI_BIN } = await import('../helpers/cniconf.js');
    net = await makeCniConf();
    // a plugin chained after bridge that holds ADD for 1.5 s for containers whose id starts with "slow"
    const bin = join(net.root, 'slowbin');
    mkdirSync(bin);
    writeFileSync(
      join(bin, 'vmpod-test-slow'),
      '#!/bin/sh\nwhile IFS= read -r _l; do :; done\ncase "$CNI_COMMAND:$CNI_CONTAINERID" in ADD:slow*) /bin/sleep 1.5 ;; esac\n' +
        'case "$CNI_COMMAND" in ADD) printf \'{"cniVersion":"1.0.0"}\' ;; esac\n',
    );
    chmod(join(bin, 'vmpod-test-slow'), 0o755);
    const confFile = join(net.confDir, '10-test.conflist');
    const conf = JSON.parse(readFileSync(confFile, 'utf8')) as { plugins: unknown[] };
    conf.plugins.push({ type: 'vmpod-test-slow' });
    writeFileSync(confFile, JSON.stringify(conf));
    d = await startDaemon({ confDir: net.confDir, binDirs: [bin, SYSTEM_CNI_BIN], cacheDir: net.cacheDir });
    const n = native();
    const slow = `slow-${randomBytes(3).toString('hex')}`;
    const fast = `vmpt-${randomBytes(3).toString('hex')}`;
    const send = (command: number, key: string, payload?: object): number => {
      const data = Buffer.from(payload ? JSON.stringify(payload) : '');
      const fd = n.connectUnix(d!.socket);
      n.setTimeouts(fd, 30_000);
      n.writeAll(fd, Buffer.concat([encodeHeader({ command, dataSize: data.length, oobSize: 0, key }), data]));
      return fd;
    };
    const replyOf = (fd: number): number => {
      let buf = Buffer.alloc(0);
      while (buf.length < 77 || buf.length < 77 + buf.readUInt32BE(5)) {
        const r = n.recvMsg(fd, 65536, 0);
        if (r.data.length === 0) break;
        buf = Buffer.concat([buf, r.data]);
      }
      n.close(fd);
      return buf[4]!;
    };
    const desc = (k: string) => ({ podNetworkDesc: { podId: k, podNs: 'default', podName: k, DNS: null } });
    const addSlow = send(0, slow, desc(slow));
    await new Promise((r) => setTimeout(r, 300)); // the add is inside its slow plugin now
    const releaseSlow = send(1, slow);
    const addFast = send(0, fast, desc(fast));
    // the other pod is not held up by the slow one: its add completes first
    expect(replyOf(addFast)).toBe(0x80);
    expect(replyOf(addSlow)).toBe(0x80);
    expect(replyOf(releaseSlow)).toBe(0x81);
    expect(replyOf(send(1, fast))).toBe(0x81);
    // the daemon's log lines arrive through a pipe: let the event loop read them (bounded)
    const order = () =>
      d!
        .lines()
        .filter((l) => l.msg === `${String(l.op)} done` && (l.key === slow || l.key === fast))
        .map((l) => `${l.op} ${l.key === slow ? 'slow' : 'fast'}`);
    for (let i = 0; i < 100 && order().length < 4; i++) await new Promise((r) => setTimeout(r, 20));
    expect(order()).toEqual(['add fast', 'add slow', 'release slow', 'release fast']);
    expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
  });
});
