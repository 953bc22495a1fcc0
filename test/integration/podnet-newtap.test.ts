// A tap made a moment ago for an add may be held for a moment by a process forked meanwhile (a CNI plugin of
// another pod, spawned between the open and the close of the fd that made the tap; it closes that fd when it
// execs). Add waits such a holder out, briefly, and reports a tap that stays busy. Real netns, real taps.
import { describe, it, expect, afterEach } from 'vitest';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readlinkSync } from 'node:fs';
import { execa } from 'execa';
import { pino } from 'pino';
import { openFds } from '../../src/podnet/fds.js';
import { silentLogger } from '../../src/log.js';
import { errorChain } from '../../src/errors.js';
import { native } from '../../src/native.js';
import type { PodInterface } from '../../src/state/types.js';

const ns = `vmpnt-${randomBytes(3).toString('hex')}`;
const nsPath = `/var/run/netns/${ns}`;
const tap = { type: 'tap', tapName: 'tap0' } as PodInterface;

/** A process in the netns with tap0 attached (as a forked plugin holds it) for holdMs; resolves once it holds it. */
async function holdTap(holdMs: number): Promise<ChildProcess> {
  const py = `
import fcntl, os, struct, sys, time
fd = os.open('/dev/net/tun', os.O_RDWR)
fcntl.ioctl(fd, 0x400454ca, struct.pack('16sH', b'tap0', 0x0002 | 0x1000 | 0x4000))  # TUNSETIFF: TAP, NO_PI, VNET_HDR
print('held', flush=True)
time.sleep(${holdMs / 1000})`;
  const child = spawn('ip', ['netns', 'exec', ns, 'python3', '-c', py], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve, reject) => {
    child.stdout!.on('data', (b: Buffer) => b.toString().includes('held') && resolve());
    child.on('exit', (code) => reject(new Error(`holder exited ${code}`)));
  });
  return child;
}

const exited = (c: ChildProcess) => new Promise<void>((r) => (c.exitCode !== null ? r() : c.on('exit', () => r())));

afterEach(async () => {
  await execa('ip', ['netns', 'del', ns], { reject: false });
  expect((await execa('ip', ['netns', 'list'])).stdout).not.toContain(ns);
});

describe('opening the taps of a new pod network', () => {
  it.each([
    ['on the event loop', false],
    ['on a pool thread (other adds in flight)', true],
  ])('waits for a process that holds the new tap for a moment, then opens it (%s)', async (_how, offLoop) => {
    await execa('ip', ['netns', 'add', ns]);
    await execa('ip', ['-n', ns, 'tuntap', 'add', 'dev', 'tap0', 'mode', 'tap', 'vnet_hdr']);
    const holder = await holdTap(60);
    const lines: { msg: string }[] = [];
    const log = pino({ level: 'debug' }, { write: (s: string) => void lines.push(JSON.parse(s) as { msg: string }) });
    const fds = await openFds(nsPath, [tap], log, { justMade: true, offLoop });
    expect(fds).toHaveLength(1);
    expect(readlinkSync(`/proc/self/fd/${fds[0]}`)).toBe('/dev/net/tun');
    for (const fd of fds) native().close(fd);
    // it was busy first, and waited (the holder is gone now: its tap was free to open)
    expect(lines.map((l) => l.msg)).toContain(
      'a new tap is busy (a process forked meanwhile still holds the fd that made it): waiting',
    );
    await exited(holder);
  });

  it('a tap that stays busy fails the open with EBUSY, after a quarter of a second at most', async () => {
    await execa('ip', ['netns', 'add', ns]);
    await execa('ip', ['-n', ns, 'tuntap', 'add', 'dev', 'tap0', 'mode', 'tap', 'vnet_hdr']);
    const holder = await holdTap(3000);
    try {
      const t0 = Date.now();
      const e = await openFds(nsPath, [tap], silentLogger(), { justMade: true }).catch((x: unknown) => x);
      expect(errorChain(e)).toContain(`TUNSETIFF tap0 in ${nsPath}: EBUSY`);
      expect(Date.now() - t0).toBeLessThan(2500); // gave up before the holder let go
    } finally {
      holder.kill();
      await exited(holder);
    }
  });
});
