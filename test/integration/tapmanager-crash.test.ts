// kill -9 of the built tapmanager in the middle of an add (a plugin hanging, started by the fault-injection
// plugin chained after the real bridge + host-local): the next daemon on the same dirs kills the orphaned plugin,
// sweeps the temporary files, rolls the cut-off add back (the IP is freed), and the retry succeeds; then
// `tapctl release --force` over the wire.
import { describe, it, expect } from 'vitest';
import { existsSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';
import { makeCniConf } from '../helpers/cniconf.js';
import { readPgidRecords } from '../../src/cni/index.js';
import { BIN, startDaemon, stopDaemonAndNet } from '../helpers/daemon.js';
import { processAlive } from '../helpers/baseline.js';

async function waitFor(what: string, cond: () => boolean | Promise<boolean>, ms = 60_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await cond())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** The PID records in a plugins dir: the slots that hold one. */
const pidRecords = (dir: string) => readdirSync(dir).flatMap((n) => readPgidRecords(join(dir, n)));

const tapctl = (socket: string, ...args: string[]) =>
  execa(process.execPath, [BIN.tapctl, '--socket', socket, ...args], { reject: false, timeout: 120_000 });

describe('tapmanager killed with SIGKILL mid-add', () => {
  it('the next start kills the orphaned plugin, sweeps temp files, rolls the add back; the retry succeeds', async () => {
    const net = await makeCniConf({ faulty: true });
    net.setFaults({ ADD: 'hang' });
    const key = `vmpodk-${randomBytes(4).toString('hex')}`;
    const d1 = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir });
    let d2: Awaited<ReturnType<typeof startDaemon>> | undefined;
    try {
      const add = tapctl(d1.socket, 'add', key, '--pod-name', `vm-${key}`, '--pod-namespace', 'default');
      await waitFor('the hanging plugin', () => net.faultyRuns().some((r) => r.verb === 'ADD'));
      const plugin = net.faultyRuns().find((r) => r.verb === 'ADD')!.pid;
      expect((await net.leftovers()).allocations).toHaveLength(1);
      // the plugin's group is recorded while it runs (a slot file per plugin running at once)
      expect(pidRecords(join(d1.stateDir, 'plugins')).map((r) => [r.pgid, r.verb, r.containerId])).toEqual([
        [plugin, 'ADD', key],
      ]);

      d1.proc.kill('SIGKILL');
      await waitFor('the daemon to die', () => !d1.alive());
      expect((await add).exitCode).toBe(1);
      expect(processAlive(plugin), 'the plugin outlives the killed daemon').toBe(true);
      // what a writer killed mid-write leaves
      writeFileSync(join(d1.stateDir, `.tmp-${key}-1-deadbeef`), '{"half');
      mkdirSync(join(net.cacheDir, 'results'), { recursive: true });
      writeFileSync(join(net.cacheDir, 'results', `x-${key}-eth0.tmp-1-deadbeef`), '{"half');

      net.setFaults({});
      d2 = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, reuse: d1 });
      await waitFor('the orphaned plugin to die', () => !processAlive(plugin), 10_000);
      expect(d2.lines().some((l) => l.msg === 'killed CNI plugins a previous daemon left running')).toBe(true);
      // the socket answers at once, the rollback runs in the background (its CNI DEL is a plugin too): ready once done
      const socket2 = d2.socket;
      await waitFor(
        'the restore (status --ready)',
        async () => (await tapctl(socket2, 'status', '--ready')).exitCode === 0,
      );
      expect(pidRecords(join(d1.stateDir, 'plugins'))).toEqual([]);
      expect(readdirSync(d1.stateDir).filter((n) => n.startsWith('.tmp-'))).toEqual([]);
      expect(existsSync(join(net.cacheDir, 'results', `x-${key}-eth0.tmp-1-deadbeef`))).toBe(false);
      // the cut-off add was rolled back: no record, no netns, the IP freed
      expect(readdirSync(d1.stateDir).filter((n) => n.endsWith('.json'))).toEqual([]);
      expect(existsSync(`/var/run/netns/${key}`)).toBe(false);
      expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });

      // the retry succeeds; release --force on the wire (nothing fails: no leftovers) frees everything
      const retry = await tapctl(d2.socket, 'add', key, '--pod-name', `vm-${key}`, '--pod-namespace', 'default');
      expect(retry.stderr).toBe('');
      expect(retry.exitCode).toBe(0);
      const forced = await tapctl(d2.socket, 'release', '--force', key);
      expect(forced.exitCode).toBe(0);
      expect(JSON.parse(String(forced.stdout))).toEqual({ released: true, leftovers: [] });
      expect(existsSync(`/var/run/netns/${key}`)).toBe(false);
      expect(await net.leftovers()).toEqual({ veths: [], allocations: [], cacheFiles: [] });
    } finally {
      for (const r of net.faultyRuns()) if (processAlive(r.pid)) process.kill(r.pid, 'SIGKILL');
      if (d2) await stopDaemonAndNet(d2, net, { podKey: key });
      else {
        if (d1.alive()) d1.proc.kill('SIGKILL');
        if (existsSync(`/var/run/netns/${key}`)) await execa('ip', ['netns', 'del', key], { reject: false });
        await net.cleanup();
      }
    }
  });
});
