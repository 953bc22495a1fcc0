// The fd client against a tiny scripted server in a child process (the addon used directly, not the real
// tapmanager): the client is synchronous, so the server cannot run on this thread.
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it, vi } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import { fstatSync, closeSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { once } from 'node:events';
import { FdClient } from '../../src/client/fdclient.js';
import { errOf } from '../helpers/errors.js';

const ADDON = join(import.meta.dirname, '../../build/Release/vmpod_native.node');

// The scripted server. Each request key selects a behaviour; headers are built by hand (77 bytes, BE).
const SERVER = String.raw`
import { createRequire } from 'node:module';
import { openSync, writeSync } from 'node:fs';
const [addonPath, sock, dir] = process.argv.slice(2);
const n = createRequire(import.meta.url)(addonPath);

function header(cmd, dataSize, oobSize, key, magic = 0x42424242) {
  const b = Buffer.alloc(77, 0x20);
  b.writeUInt32BE(magic, 0); b.writeUInt8(cmd, 4); b.writeUInt32BE(dataSize, 5); b.writeUInt32BE(oobSize, 9);
  if (key === null) b.fill(0, 13); else b.write(key, 13, 'latin1');
  return b;
}
const INFO1 = Buffer.from('[{"type":0,"mac":"QqSmIoAu","fdIndex":0,"pciAddress":""}]');
const INFO2 = Buffer.from('[{"type":0,"mac":"QqSmIoAu","fdIndex":0,"pciAddress":""},{"type":1,"mac":"/u0AAAAB","fdIndex":1,"pciAddress":"0000:03:00.1"}]');
const CSN = Buffer.from('{"Result":{"interfaces":[{"name":"eth0","mac":"42:a4:a6:22:80:2e","sandbox":"/var/run/netns/add-ok"}],"ips":[{"version":"4","address":"10.1.90.5/24","gateway":"10.1.90.1"}],"routes":[{"dst":"0.0.0.0/0","gw":"10.1.90.1"}],"dns":{}},"NsPath":"/var/run/netns/add-ok","Interfaces":[{"Type":0,"Name":"eth0","HardwareAddr":"QqSmIoAu","PCIAddress":"","MTU":1500,"VlanID":0}]}');
const devnull = openSync('/dev/null', 'r');
const file = openSync(dir + '/f1', 'w+');
writeSync(file, 'hello');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
// all of data, the fds with its first byte: trySendMsg again (after 1 ms) while the socket is full
const send = (c, data, fds = []) => {
  for (let off = 0; off < Math.max(data.length, fds.length ? 1 : 0); ) {
    const k = n.trySendMsg(c, data.subarray(off), off ? [] : fds);
    if (k < 0) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 1);
    else off += k;
  }
};

async function respond(c, cmd, key, data) {
  const log = (what) => process.stdout.write(JSON.stringify({ cmd, key, what, data: data.toString() }) + '\n');
  log('request');
  if (cmd === 0 && key === 'add-ok') { send(c, header(0x80, CSN.length, 0, key)); send(c, CSN); return; }
  if (cmd === 1) { send(c, header(0x81, 0, 0, key)); return; }
  if (cmd === 3) { send(c, header(0x83, 0, 0, key)); return; }
  if (cmd === 4) { const p = Buffer.from('[{"key":"a"},{"key":"b"}]'); send(c, header(0x84, p.length, 0, key)); send(c, p); return; }
  if (cmd !== 2) { const t = Buffer.from('bad command'); send(c, Buffer.concat([header(0xff, t.length, 0, null), t])); return; }
  switch (key) {
    case 'two-fds': send(c, header(0x82, INFO2.length, 24, key)); send(c, INFO2, [devnull, file]); return;
    case 'stream': // fds with the first bytes, the rest of the payload later
      send(c, header(0x82, INFO2.length, 24, key)); send(c, INFO2.subarray(0, 5), [devnull, file]);
      await sleep(50); send(c, INFO2.subarray(5)); return;
    case 'split': { // the header in two pieces
      const h = header(0x82, INFO1.length, 24, key);
      send(c, h.subarray(0, 10)); await sleep(50); send(c, h.subarray(10)); send(c, INFO1, [file]); return;
    }
    case 'filler': send(c, header(0x82, 0, 24, key)); send(c, Buffer.alloc(0), [devnull]); return; // addon adds the 0x00 byte
    case 'none': send(c, header(0x82, 2, 0, key)); send(c, Buffer.from('[]')); return;
    case 'fd-count': send(c, header(0x82, INFO2.length, 24, key)); send(c, INFO2, [devnull]); return;
    case 'error': { const t = Buffer.from('no fds for key "error"'); send(c, Buffer.concat([header(0xff, t.length, 0, null), t])); return; }
    case 'wrong-key': send(c, header(0x82, INFO1.length, 24, 'other')); send(c, INFO1, [devnull]); return;
    case 'bad-json': { const p = Buffer.from('[{"type":0,"mac":"zz","fdIndex":0}]'); send(c, header(0x82, p.length, 24, key)); send(c, p, [devnull]); return; }
    case 'wrong-cmd': send(c, header(0x81, 0, 0, key)); return;
    case 'bad-magic': send(c, header(0x82, 0, 0, key, 0x41414141)); return;
    case 'big': send(c, header(0x82, 2 * 1024 * 1024, 0, key)); return;
    case 'hangup': send(c, header(0x82, 0, 0, key).subarray(0, 10)); return;
    case 'short-data': send(c, header(0x82, 100, 0, key)); send(c, INFO1); return; // then closes
    case 'silent': return; // never answers; the client times out
    default: { const t = Buffer.from('unscripted key ' + key); send(c, Buffer.concat([header(0xff, t.length, 0, null), t])); }
  }
}

function serve(c) {
  let buf = Buffer.alloc(0);
  let busy = false;
  const p = n.pollReadable(c, async () => {
    const d = n.read(c, 65536);
    if (d === null) return;
    if (d.length === 0) { p.stop(); n.close(c); return; }
    buf = Buffer.concat([buf, d]);
    if (busy || buf.length < 77) return;
    const size = buf.readUInt32BE(5);
    if (buf.length < 77 + size) return;
    busy = true;
    const cmd = buf[4], key = buf.subarray(13, 77).toString('latin1').trim();
    await respond(c, cmd, key, buf.subarray(77, 77 + size));
    if (key !== 'silent') { p.stop(); n.close(c); }
  });
}

const lfd = n.listenUnix(sock, 0o600, 16);
const lp = n.pollReadable(lfd, () => { for (let c; (c = n.accept(lfd)) >= 0; ) serve(c); });
process.stdout.write('ready\n');
process.stdin.on('end', () => { lp.stop(); process.exit(0); });
process.stdin.resume();
`;

let dir: string;
let sock: string;
let server: ChildProcess;
let serverLog = '';

function openFds(): string[] {
  return readdirSync('/proc/self/fd').sort();
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'vmpod-fdclient-'));
  sock = join(dir, 's.sock');
  writeFileSync(join(dir, 'server.mjs'), SERVER);
  server = spawn(process.execPath, [join(dir, 'server.mjs'), ADDON, sock, dir], { stdio: ['pipe', 'pipe', 'inherit'] });
  server.stdout!.setEncoding('utf8');
  const ready = new Promise<void>((resolve, reject) => {
    server.stdout!.on('data', (s: string) => {
      serverLog += s;
      if (serverLog.startsWith('ready\n')) resolve();
    });
    server.once('exit', (code) => reject(new Error(`scripted server exited with ${code}`)));
  });
  await ready;
});

afterAll(async () => {
  if (server && server.exitCode === null) {
    const exited = once(server, 'exit');
    server.stdin!.end();
    await exited;
  }
  rmSync(dir, { recursive: true, force: true });
});

let fdsBefore: string[];
beforeEach(() => {
  fdsBefore = openFds();
});
afterEach(() => {
  // every fd the client received was closed (or closed by the test): nothing leaked
  expect(openFds()).toEqual(fdsBefore);
});

describe('FdClient against a scripted server', () => {
  it('get: payload and 2 real fds in interface order', () => {
    const r = new FdClient(sock).get('two-fds');
    try {
      expect(r.infos).toEqual([
        { type: 0, mac: 'QqSmIoAu', fdIndex: 0, pciAddress: '' },
        { type: 1, mac: '/u0AAAAB', fdIndex: 1, pciAddress: '0000:03:00.1' },
      ]);
      expect(r.fds).toHaveLength(2);
      const devnull = statSync('/dev/null');
      const f1 = statSync(join(dir, 'f1'));
      const s0 = fstatSync(r.fds[0]!);
      const s1 = fstatSync(r.fds[1]!);
      expect(s0.isCharacterDevice() && s0.rdev === devnull.rdev).toBe(true);
      expect(s1.isFile() && s1.ino === f1.ino && s1.dev === f1.dev).toBe(true);
      expect(s1.size).toBe(5);
    } finally {
      r.fds.forEach((fd) => closeSync(fd));
    }
  });

  it('get: payload arriving after the fds (short first read)', () => {
    const r = new FdClient(sock).get('stream');
    expect(r.infos.map((i) => i.fdIndex)).toEqual([0, 1]);
    expect(r.fds.map((fd) => fstatSync(fd).isCharacterDevice())).toEqual([true, false]);
    r.fds.forEach((fd) => closeSync(fd));
  });

  it('get: header arriving in pieces', () => {
    const r = new FdClient(sock).get('split');
    expect(r.infos).toHaveLength(1);
    expect(fstatSync(r.fds[0]!).ino).toBe(statSync(join(dir, 'f1')).ino);
    r.fds.forEach((fd) => closeSync(fd));
  });

  it('get: no interfaces, no fds', () => {
    expect(new FdClient(sock).get('none')).toEqual({ infos: [], fds: [] });
  });

  it('get: accepts the filler byte of a dataSize 0 reply, then rejects the fd count and closes the fd', () => {
    const e = errOf(() => new FdClient(sock).get('filler'));
    expect(e.code).toBe('PROTOCOL');
    expect(e.message).toMatch(/^get "filler" via .*: 1 fds for 0 interfaces$/);
  });

  it('get: fewer fds than interfaces', () => {
    const e = errOf(() => new FdClient(sock).get('fd-count'));
    expect(e.message).toMatch(/get "fd-count" via .*: 1 fds for 2 interfaces$/);
  });

  it('get: an undecodable payload', () => {
    const e = errOf(() => new FdClient(sock).get('bad-json'));
    expect(e.code).toBe('PROTOCOL');
    expect(e.message).toMatch(
      /^get "bad-json" via .*: bad response payload: get info is invalid: \[0\]\.mac must be a MAC/,
    );
  });

  it('get: error reply', () => {
    const e = errOf(() => new FdClient(sock).get('error'));
    expect(e.message).toBe('server returned error: no fds for key "error"');
  });

  it('get: wrong echoed key, and the received fd is closed', () => {
    const e = errOf(() => new FdClient(sock).get('wrong-key'));
    expect(e.code).toBe('PROTOCOL');
    expect(e.message).toMatch(/get "wrong-key" via .*: response is for key "other"/);
  });

  it('rejects a wrong response command, a bad magic, an oversized claim', () => {
    expect(errOf(() => new FdClient(sock).get('wrong-cmd')).message).toMatch(
      /unexpected response command 0x81 \(release-response\)/,
    );
    expect(errOf(() => new FdClient(sock).get('bad-magic')).message).toMatch(/bad magic 0x41414141/);
    expect(errOf(() => new FdClient(sock).get('big')).message).toMatch(/claims 2097152 payload bytes/);
  });

  it('reports a connection closed mid-header and mid-payload', () => {
    expect(errOf(() => new FdClient(sock).get('hangup')).message).toMatch(
      /connection closed after 10 of 77 header bytes/,
    );
    expect(errOf(() => new FdClient(sock).get('short-data')).message).toMatch(
      /connection closed after 57 of 100 payload bytes/,
    );
  });

  it('times out on a silent server', () => {
    const e = errOf(() => new FdClient(sock, { timeoutMs: 200 }).get('silent'));
    expect(e.code).toBe('TIMEOUT');
    expect(e.message).toMatch(/read response header: timed out after 200 ms/);
  });

  it('add, release, recover and list', async () => {
    const c = new FdClient(sock);
    const csn = c.add('add-ok', { podId: 'add-ok', podNs: 'default', podName: 'vm' });
    expect(csn.NsPath).toBe('/var/run/netns/add-ok');
    expect(csn.Interfaces[0]).toMatchObject({ HardwareAddr: 'QqSmIoAu', mac: '42:a4:a6:22:80:2e', MTU: 1500 });
    c.release('rel-ok');
    c.recover('rec-ok', {
      podNetworkDesc: { podId: 'rec-ok', podNs: 'd', podName: 'vm' },
      csn,
      HaveRunningContainers: true,
    });
    expect(c.list()).toEqual([{ key: 'a' }, { key: 'b' }]);
    // what the server saw (its log arrives through a pipe, asynchronously)
    await vi.waitFor(() => expect(serverLog).toContain('"cmd":4'));
    const seen = serverLog
      .split('\n')
      .filter((l) => l.startsWith('{'))
      .map((l) => JSON.parse(l) as { cmd: number; key: string; data: string });
    expect(seen.find((s) => s.cmd === 0)!.data).toBe(
      '{"podNetworkDesc":{"podId":"add-ok","podNs":"default","podName":"vm","DNS":null}}',
    );
    expect(JSON.parse(seen.find((s) => s.cmd === 3)!.data)).toMatchObject({
      HaveRunningContainers: true,
      csn: { NsPath: '/var/run/netns/add-ok' },
    });
    expect(seen.find((s) => s.cmd === 4)!.key).toBe('');
  });

  it('validates keys before connecting and reports a missing socket', () => {
    expect(errOf(() => new FdClient(sock).get('../x')).code).toBe('BAD_KEY');
    expect(errOf(() => new FdClient(sock).release('')).code).toBe('BAD_KEY');
    const e = errOf(() => new FdClient(join(dir, 'nope.sock')).get('k'));
    expect(e.code).toBe('SYSCALL');
    expect(e.message).toMatch(/get "k" via .*nope\.sock: connect: /);
  });
});
