#!/usr/bin/env node
// Pod network ADD and release latency through tapmanager, against the CNI plugins alone, in the same run.
//   node bench/add-latency.mjs [--runs N]      (root; default 20; needs `npm run build`)
// pair:     tapctl-equivalent FdClient add / release against a running tapmanager (netns, CNI ADD, bridge + tap,
//           DHCP server, state record; release undoes it all)
// baseline: the same conflist run by our CNI client in-process: ip netns add + CNI ADD, then CNI DEL + ip netns del
// Our share = pair - baseline. Prints one JSON line per set and a human summary. Reported, never asserted.
import { parseArgs } from 'node:util';
import { randomBytes } from 'node:crypto';
import { loadTs } from './lib/ts.mjs';
import { median, percentile } from './lib/stats.mjs';


const load = () =>
  loadTs('add-latency-helpers', [
        "export { makeCniConf } from './test/helpers/cniconf.ts';",
        "export { startDaemon, removeDir } from './test/helpers/daemon.ts';",
        "export { FdClient } from './src/client/fdclient.ts';",
        "export { CniClient, loadConfList, execaPluginExec } from './src/cni/index.ts';",
  ]);

const p90 = (xs) => percentile([...xs].sort((a, b) => a - b), 90);
const r1 = (x) => Math.round(x * 10) / 10;

async function ip(args) {
  const { execa } = await import('execa');
  await execa('ip', args, { timeout: 10_000 });
}

async function main() {
  const { values } = parseArgs({ options: { runs: { type: 'string', default: '20' } } });
  const runs = Number(values.runs);
  if (!Number.isInteger(runs) || runs < 1 || runs > 500) throw new Error(`--runs ${values.runs}: expected 1 to 500`);
  if (process.getuid?.() !== 0) throw new Error('needs root (netns, bridge, tap)');
  const h = await load();
  const net = await h.makeCniConf();
  const d = await h.startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir });
  const client = new h.FdClient(d.socket, { timeoutMs: 60_000 });
  const cni = new h.CniClient({ binDirs: net.binDirs, cacheDir: net.cacheDir, exec: h.execaPluginExec() });
  const list = await h.loadConfList(net.confDir);
  const pair = { add: [], release: [] };
  const base = { add: [], release: [] };
  try {
    for (let i = 0; i < runs; i++) {
      // interleaved, so both see the same machine state
      const key = `vmpb-${randomBytes(3).toString('hex')}`;
      let t = performance.now();
      client.add(key, { podId: key, podNs: 'bench', podName: 'bench', DNS: null });
      pair.add.push(performance.now() - t);
      t = performance.now();
      client.release(key);
      pair.release.push(performance.now() - t);

      const bkey = `vmpb-${randomBytes(3).toString('hex')}`;
      const rt = { containerId: bkey, netns: `/var/run/netns/${bkey}`, ifName: 'virtlet-eth0', args: [['IgnoreUnknown', '1']] };
      t = performance.now();
      await ip(['netns', 'add', bkey]);
      await cni.add(list, rt);
      base.add.push(performance.now() - t);
      t = performance.now();
      await cni.del(list, rt);
      await ip(['netns', 'del', bkey]);
      base.release.push(performance.now() - t);
    }
  } finally {
    await d.stop();
    await net.cleanup();
    h.removeDir(d.dir);
  }
  const summary = {};
  for (const op of ['add', 'release']) {
    summary[op] = {
      pairMedianMs: r1(median(pair[op])),
      pairP90Ms: r1(p90(pair[op])),
      cniOnlyMedianMs: r1(median(base[op])),
      cniOnlyP90Ms: r1(p90(base[op])),
      ourShareMs: r1(median(pair[op]) - median(base[op])),
      ratio: Math.round((median(pair[op]) / median(base[op])) * 100) / 100,
    };
    console.log(JSON.stringify({ bench: 'add-latency', op, runs, ...summary[op] }));
  }
  console.log(
    `add: ${summary.add.pairMedianMs} ms through tapmanager vs ${summary.add.cniOnlyMedianMs} ms CNI alone (ours +${summary.add.ourShareMs} ms, x${summary.add.ratio}); ` +
      `release: ${summary.release.pairMedianMs} ms vs ${summary.release.cniOnlyMedianMs} ms (ours +${summary.release.ourShareMs} ms, x${summary.release.ratio}); ${runs} runs each`,
  );
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
