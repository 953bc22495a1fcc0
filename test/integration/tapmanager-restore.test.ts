// A restart over many recorded pods: the socket answers while the restore runs (status says so), and then every pod
// answers get with its tap. How soon the first answer comes (each pod's restore waits for a turn of the event loop,
// so requests are served between them) is a latency: bench/pods.mjs measures it (restart@N), no test times it.
import { describe, it, expect, vi } from 'vitest';
import { randomBytes } from 'node:crypto';
import { readFileSync, readdirSync } from 'node:fs';
import { startDaemon, stopDaemonAndNet, removeDir } from '../helpers/daemon.js';
import { makeCniConf } from '../helpers/cniconf.js';
import { exchange } from '../helpers/rawclient.js';
import { native } from '../../src/native.js';
import { fdTableSize } from '../../src/tapmanager/fdtable.js';

const ADD = 0;
const RELEASE = 1;
const GET = 2;
const LIST = 4;
const STATUS = 6;
const PODS = 150;

vi.setConfig({ testTimeout: 600_000 });

describe('restart with many pods recorded', () => {
  it(`answers while ${PODS} pods are being restored, then every pod is back`, async () => {
    const net = await makeCniConf();
    const d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir });
    const prefix = `vmpr${randomBytes(3).toString('hex')}`;
    const keys = Array.from({ length: PODS }, (_, i) => `${prefix}-${i}`);
    let d2 = d;
    try {
      for (const k of keys)
        expect(
          exchange(d.socket, ADD, k, { podNetworkDesc: { podId: k, podNs: 'default', podName: k, DNS: null } }).command,
        ).toBe(0x80);
      expect(await d.stop()).toBe(0); // SIGTERM: the pod networks stay
      d2 = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, reuse: d });
      // the first answer comes while the restore runs (startDaemon returns once the socket takes a connection)
      const first = JSON.parse(exchange(d2.socket, STATUS, '').data.toString()) as {
        ready: boolean;
        restored: boolean;
        reasons: string[];
      };
      expect(first).toMatchObject({
        ready: false,
        restored: false,
        reasons: ['restoring the pods recorded in the state dir'],
      });
      // gets meanwhile are answered with the tap at once (the last pod's moves its restore to the front)
      for (const k of [keys[PODS - 1]!, keys[0]!]) {
        const r = exchange(d2.socket, GET, k);
        expect([k, r.command, r.fds.length]).toEqual([k, 0x82, 1]);
        for (const fd of r.fds) native().close(fd);
      }
      for (let i = 0; i < 600; i++) {
        if ((JSON.parse(exchange(d2.socket, STATUS, '').data.toString()) as { restored: boolean }).restored) break;
        await new Promise((r) => setTimeout(r, 50));
      }
      // the restarted daemon sized its fd table for the recorded pods at once (each growth past the table's end
      // would wait for an RCU grace period in the thread that took the fd)
      const fdSize = Number(/^FDSize:\s+(\d+)$/m.exec(readFileSync(`/proc/${d2.pid}/status`, 'utf8'))?.[1]);
      expect(fdSize).toBeGreaterThanOrEqual(fdTableSize(PODS));
      // restored means every pod's DHCP server listens again
      const listed = JSON.parse(exchange(d2.socket, LIST, '').data.toString()) as { key: string; dhcp: boolean }[];
      expect(listed.filter((p) => keys.includes(p.key)).map((p) => [p.key, p.dhcp])).toEqual(
        keys
          .slice()
          .sort()
          .map((k) => [k, true]),
      );
      for (const k of keys) {
        const r = exchange(d2.socket, GET, k);
        expect([k, r.command, r.fds.length]).toEqual([k, 0x82, 1]);
        for (const fd of r.fds) native().close(fd);
      }
      for (const k of keys) expect(exchange(d2.socket, RELEASE, k).command).toBe(0x81);
      expect(readdirSync(d2.stateDir).filter((f) => f.startsWith(prefix))).toEqual([]);
    } finally {
      await stopDaemonAndNet(d2, net, { ifAlive: true });
      removeDir(d.dir);
    }
    expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
  });
});
