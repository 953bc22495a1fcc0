#!/usr/bin/env node
// A lone add, stage by stage, next to the bare add's two parts (root; after `npm run build`):
//   node bench/add-stages.mjs [--runs 30] [--warmup 5]
// Each round adds one pod through tapmanager (the C client) and one bare (bench/c/bare-cni.c: `ip netns add`, then the
// bridge plugin's ADD), the sides taking turns going first, 150 ms apart, as the add figure of bench/pods.mjs does.
// tapmanager runs at --log-level debug: its "pod network added" line says when each stage of the add ended
// (src/podnet/add.ts), and its "add done" line how long the request took. Figures:
//   add-stage-netns    the netns made (the network read, the record written and synced, a spare bound or a netns
//                      made, the first plugin exec'd meanwhile) vs `ip netns add`
//   add-stage-plugin   the CNI ADD from then on (the plugin gets its config then: its exec and start overlapped the
//                      netns stage) to its result read, vs the bare plugin's whole run
//   add-after-plugin   everything after the plugin, up to the client's reply, vs nothing the bare add does: printed
//                      as a measure, with its parts (the netns read and the plan, the apply, the taps, the ready
//                      record, and the request's way in and out of the pipeline)
// Debug logging costs a little; the figures are for finding where time goes, not for the goals (bench/pods.mjs).
import { parseArgs } from 'node:util';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { Cleanup } from './lib/cleanup.mjs';
import { podWorld } from './lib/pods.mjs';
import { figure, measure, dist } from './lib/figure.mjs';

const { values: o } = parseArgs({
  options: { runs: { type: 'string', default: '30' }, warmup: { type: 'string', default: '5' } },
});
const runs = Number(o.runs);
const warmup = Number(o.warmup);
if (process.getuid?.() !== 0) throw new Error('needs root (netns, bridge, tap)');
process.env.VMPOD_BENCH_LOG_LEVEL = 'debug';
const cleanup = new Cleanup();
cleanup.installGuards('add-stages', 900_000);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

try {
  const w = await podWorld(cleanup);
  await w.start();
  /** key -> the client's time of its add */
  const client = new Map();
  const bare = [];
  for (let i = 0; i < warmup + runs; i++) {
    const [k] = w.keys(1, 's');
    const [b] = w.keys(1, 'y');
    const sides = [
      async () => {
        const r = await w.add([k]);
        if (i >= warmup) client.set(k, r.opsMs[0]);
      },
      async () => {
        const r = await w.bareAdd([b]);
        if (i >= warmup) bare.push(r.partsMs[0]);
      },
    ];
    for (const side of i % 2 ? sides.reverse() : sides) await side();
    await w.release([k]);
    await w.bareDel([b]);
    await sleep(150);
  }
  const lines = readFileSync(join(w.dir, 'tapmanager.log'), 'utf8')
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l))
    .filter((j) => client.has(j.key));
  const stagesOf = new Map(lines.filter((j) => j.msg === 'pod network added').map((j) => [j.key, j.stages]));
  const servedOf = new Map(lines.filter((j) => j.msg === 'add done').map((j) => [j.key, j.durationMs]));
  const keys = [...client.keys()].filter((k) => stagesOf.has(k) && servedOf.has(k));
  if (keys.length !== client.size) throw new Error(`${client.size - keys.length} adds without their log lines`);
  const s = (k) => stagesOf.get(k);
  figure(
    'add-stage-netns',
    'ms',
    keys.map((k) => s(k).netns),
    bare.map((p) => p.netns),
    {
      what: "a lone add: the network read, the record, the netns made or a spare bound, the first plugin exec'd",
      baselineWhat: '`ip netns add`',
    },
  );
  figure(
    'add-stage-plugin',
    'ms',
    keys.map((k) => s(k).cni - s(k).netns),
    bare.map((p) => p.plugin),
    {
      what: "a lone add: the CNI ADD from the netns made (the plugin exec'd already) to its result",
      baselineWhat: "the bridge plugin exec'd by a C program",
    },
  );
  const part = (f) => dist(keys.map(f)).median;
  measure('add-after-plugin', 'ms', dist(keys.map((k) => client.get(k) - s(k).cni)), {
    parts: {
      observeAndPlan: part((k) => s(k).planned - s(k).cni),
      apply: part((k) => s(k).applied - s(k).planned),
      // within it: the plan's record; the requests' start and, when the plan allows, the DHCP servers' meanwhile
      applyRecord: part((k) => s(k).recorded - s(k).planned),
      applyDhcp: part((k) => (s(k).dhcp ?? s(k).recorded) - s(k).recorded),
      taps: part((k) => s(k).taps - s(k).applied),
      ready: part((k) => s(k).ready - s(k).taps),
      // the service around the pipeline (its queue, the reply's encoding) and the socket both ways
      serviceAndSocket: part((k) => client.get(k) - s(k).ready),
      socketOnly: part((k) => client.get(k) - servedOf.get(k)),
    },
  });
} finally {
  await cleanup.run();
}
