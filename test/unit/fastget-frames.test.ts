// The fd protocol has two decoders: the TS codec (src/protocol) and the addon's fast get server (native/fastget.c),
// which answers gets itself. Every frame of test/fixtures/fd-frames.ts goes to both: to the codec as bytes, to the
// addon through a real socket from a real peer (root, or another uid/gid by setpriv). The addon must answer exactly
// the frames the codec reads as a get without payload of a registered key from a peer its credentials allow, and
// hand every other one to JS with the bytes it read and the peer, for JS to decide as the codec does.
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { chmodSync, mkdtempSync, openSync, closeSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { native, type FastGetServer, type PeerCred } from '../../src/native.js';
import { RequestReader, encodeResponse } from '../../src/protocol/frames.js';
import { decodeHeader } from '../../src/protocol/header.js';
import { Command } from '../../src/protocol/commands.js';
import { allowedByCred } from '../../src/protocol/peer.js';
import { peerAllowed } from '../../src/tapmanager/server.js';
import { ErrorCode, VmpodError } from '../../src/errors.js';
import { ALLOWED_GID, FRAMES, PEERS, REGISTERED, type Frame, type TsVerdict } from '../fixtures/fd-frames.js';

const n = native();

/** The peer: connects, writes the frame in one write, then reads a whole reply, or to the end. */
const CLIENT = `
import net from 'node:net';
const [sock, hex] = process.argv.slice(1);
let got = Buffer.alloc(0);
const done = (how) => { process.stdout.write(JSON.stringify({ how, got: got.toString('hex') })); process.exit(0); };
const s = net.createConnection(sock, () => s.write(Buffer.from(hex, 'hex')));
s.on('data', (d) => { got = Buffer.concat([got, d]); if (got.length >= 77 && got.length >= 77 + got.readUInt32BE(5)) done('reply'); });
s.on('end', () => done('end'));
s.on('error', (e) => done(e.code));
`;

function tsVerdict(bytes: Buffer): TsVerdict {
  const reader = new RequestReader();
  const reqs = reader.push(bytes);
  if (reader.error) {
    expect(reqs).toEqual([]);
    expect(reader.error).toBeInstanceOf(VmpodError);
    expect(reader.error.code).toBe(ErrorCode.Protocol);
    return 'protocol-error';
  }
  if (reqs.length === 0) return 'incomplete';
  expect(reqs).toHaveLength(1);
  return { command: reqs[0]!.command, key: reqs[0]!.key };
}

/** What the codec and the peer rule say the addon may answer itself. */
function tsFast(frame: Frame, verdict: TsVerdict): boolean {
  return (
    typeof verdict === 'object' &&
    verdict.command === Command.Get &&
    decodeHeader(frame.bytes).dataSize === 0 &&
    (REGISTERED as readonly string[]).includes(verdict.key) &&
    allowedByCred(PEERS[frame.peer], [ALLOWED_GID])
  );
}

interface Adopted {
  prefix: Buffer | null;
  peer: PeerCred;
  allowed: boolean;
}

let dir: string;
let listenFd: number;
let server: FastGetServer;
let tapFd: number;
const replies = new Map<string, Buffer>();
const adopted: Adopted[] = [];

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'vmpod-fgframes-'));
  chmodSync(dir, 0o755);
  listenFd = n.listenUnix(join(dir, 's.sock'), 0o666, 16);
  server = n.fastGetServer(
    listenFd,
    { allowedGids: [ALLOWED_GID], maxConnections: 64, idleMs: 30_000 },
    (fd, prefix, peer) => {
      const cred = peer ?? n.peerCred(fd);
      // the server's own rule, read while the peer still waits for its answer
      adopted.push({ prefix, peer: cred, allowed: peerAllowed(cred, [ALLOWED_GID]) });
      n.close(fd);
    },
    (err) => {
      throw err;
    },
  );
  tapFd = openSync('/dev/null', 'r');
  for (const key of REGISTERED) {
    const { header, data } = encodeResponse(Command.Get, key, Buffer.from(`[{"key":"${key}"}]`), 1);
    const reply = Buffer.concat([header, data]);
    replies.set(key, reply);
    server.register(key, reply, [tapFd]);
  }
});

afterAll(() => {
  server?.stop();
  if (listenFd >= 0) n.close(listenFd);
  if (tapFd >= 0) closeSync(tapFd);
  rmSync(dir, { recursive: true, force: true });
});

async function sendAs(frame: Frame): Promise<{ how: string; got: Buffer }> {
  const p = PEERS[frame.peer];
  const node = [
    process.execPath,
    '--input-type=module',
    '-e',
    CLIENT,
    join(dir, 's.sock'),
    frame.bytes.toString('hex'),
  ];
  const ids = [
    `--reuid=${p.uid}`,
    `--regid=${p.gid}`,
    p.groups.length ? `--groups=${p.groups.join(',')}` : '--clear-groups',
  ];
  const r =
    p.uid === 0
      ? await execa(node[0]!, node.slice(1), { timeout: 20_000 })
      : await execa('setpriv', [...ids, ...node], { timeout: 20_000 });
  const out = JSON.parse(r.stdout) as { how: string; got: string };
  return { how: out.how, got: Buffer.from(out.got, 'hex') };
}

describe('every frame of the table is decided alike by the TS codec and the addon', () => {
  it('the table covers each kind of frame and peer', () => {
    const kinds = new Set(FRAMES.map((f) => (typeof f.ts === 'object' ? `request:${f.fast}` : f.ts)));
    expect([...kinds].sort()).toEqual(['incomplete', 'protocol-error', 'request:false', 'request:true']);
    expect(new Set(FRAMES.map((f) => f.peer))).toEqual(new Set(Object.keys(PEERS)));
  });

  it.each(FRAMES)('$name (from $peer)', async (frame) => {
    const verdict = tsVerdict(frame.bytes);
    expect(verdict).toEqual(frame.ts);
    expect(tsFast(frame, verdict)).toBe(frame.fast);

    adopted.length = 0;
    const seen = await sendAs(frame);
    if (frame.fast) {
      // answered by the addon: the registered reply, and JS never saw the connection
      expect(seen).toEqual({ how: 'reply', got: replies.get((verdict as { key: string }).key) });
      expect(adopted).toEqual([]);
      return;
    }
    // handed to JS: nothing was sent, and JS got the connection with what the addon read and the peer (this test's JS
    // closes it at once: the peer sees the end, or a reset or broken pipe when its bytes were not all read)
    expect(seen.got).toEqual(Buffer.alloc(0));
    expect(['end', 'ECONNRESET', 'EPIPE']).toContain(seen.how);
    expect(adopted).toHaveLength(1);
    const a = adopted[0]!;
    const p = PEERS[frame.peer];
    expect({ uid: a.peer.uid, gid: a.peer.gid }).toEqual({ uid: p.uid, gid: p.gid });
    expect(a.allowed).toBe(frame.peer !== 'stranger');
    // a peer the credentials allow was read up to one header; the others were not read at all
    expect(a.prefix).toEqual(allowedByCred(p, [ALLOWED_GID]) ? frame.bytes.subarray(0, 77) : null);
  });
});
