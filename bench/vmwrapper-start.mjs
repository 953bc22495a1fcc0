#!/usr/bin/env node
// vmwrapper's cost on every VM start: spawn to the exec'd emulator's exit, with /bin/true as the emulator.
//   node bench/vmwrapper-start.mjs [--runs N]      (root; default 30; needs `npm run build`)
// Sets, interleaved, in one run:
//   true        /bin/true spawned directly (the floor)
//   node        `node -e 0` (Node's own start-up: the floor for any Node program)
//   probe       vmwrapper, VIRTLET_EMULATOR empty: libvirt's probe path
//   start       vmwrapper with VIRTLET_NET_KEY: a get from tapmanager (1 tap fd), argv rewrite, execve
// Prints one JSON line per set and a human summary. Reported, never asserted.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { randomBytes } from 'node:crypto';
import { loadTs } from './lib/ts.mjs';
import { repo } from './lib/dist.mjs';
import { median } from './lib/stats.mjs';

const vmwrapper = join(repo, 'dist/bundle/vmwrapper.js');

const load = () =>
  loadTs('vmwrapper-start-helpers', [
        "export { makeCniConf } from './test/helpers/cniconf.ts';",
        "export { startDaemon, removeDir } from './test/helpers/daemon.ts';",
        "export { FdClient } from './src/client/fdclient.ts';",
  ]);

const r1 = (x) => Math.round(x * 10) / 10;

function timeOnce(cmd, args, env) {
  const t = performance.now();
  const r = spawnSync(cmd, args, { env, stdio: ['ignore', 'ignore', 'pipe'] });
  const ms = performance.now() - t;
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${r.status}: ${r.stderr}`);
  return ms;
}

async function main() {
  const { values } = parseArgs({ options: { runs: { type: 'string', default: '30' } } });
  const runs = Number(values.runs);
  if (!Number.isInteger(runs) || runs < 1 || runs > 1000) throw new Error(`--runs ${values.runs}: expected 1 to 1000`);
  if (process.getuid?.() !== 0) throw new Error('needs root (netns, bridge, tap)');
  const h = await load();
  const net = await h.makeCniConf();
  const d = await h.startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir });
  const key = `vmpw-${randomBytes(3).toString('hex')}`;
  const client = new h.FdClient(d.socket);
  const base = { PATH: process.env.PATH, VMPOD_LOG_LEVEL: 'silent' };
  const sets = { true: [], node: [], probe: [], start: [] };
  try {
    client.add(key, { podId: key, podNs: 'bench', podName: 'bench', DNS: null });
    for (let i = 0; i < runs; i++) {
      sets.true.push(timeOnce('/bin/true', [], base));
      sets.node.push(timeOnce(process.execPath, ['-e', '0'], base));
      sets.probe.push(timeOnce(process.execPath, [vmwrapper, '-S'], { ...base, VMWRAPPER_DEFAULT_EMULATOR: '/bin/true' }));
      sets.start.push(
        timeOnce(process.execPath, [vmwrapper, '-S'], { ...base, VIRTLET_EMULATOR: '/bin/true', VIRTLET_NET_KEY: key, VIRTLET_FD_SERVER_SOCKET_PATH: d.socket }),
      );
    }
  } finally {
    try {
      client.release(key);
    } finally {
      await d.stop();
      await net.cleanup();
      h.removeDir(d.dir);
    }
  }
  const m = Object.fromEntries(Object.entries(sets).map(([k, v]) => [k, median(v)]));
  for (const [k, v] of Object.entries(sets)) console.log(JSON.stringify({ bench: 'vmwrapper-start', set: k, runs, medianMs: r1(median(v)), minMs: r1(Math.min(...v)), maxMs: r1(Math.max(...v)) }));
  console.log(
    `vmwrapper probe ${r1(m.probe)} ms, start with one tap ${r1(m.start)} ms, vs node -e 0 ${r1(m.node)} ms ` +
      `(start/node x${(m.start / m.node).toFixed(2)}, vmwrapper's own share ${r1(m.start - m.node)} ms); /bin/true ${r1(m.true)} ms; ${runs} runs each`,
  );
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
