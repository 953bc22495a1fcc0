#!/usr/bin/env node
// What this machine charges code that runs after an idle spell: the same small piece of work timed back to back
// (warm) and as the first thing after a pause, as a lone add runs after the pause between two rounds of the add
// figure, and a pod start on a node (needs nothing but the machine; no root):
//   node bench/idle-penalty.mjs [--rounds 21] [--pauses 50,150,500]
// idle-penalty-js-<P>ms   JavaScript of the kind an add runs: an add request's payload parsed, a state record of
//                         9 KB built and serialized, a few buffers encoded (80-100 us when warm, here)
// idle-penalty-c-<P>ms    a C program reading one byte of every cache line of 1 MiB (bench/c/idle-walk.c), the
//                         same way: the cost is the machine's, not Node's
// Each figure: the first run after a pause of P ms against runs back to back (ratio: the penalty).
// docs/performance.md reads them. Reported, never asserted.
import { execFileSync } from 'node:child_process';
import { setTimeout as sleep } from 'node:timers/promises';
import { parseArgs } from 'node:util';
import { figure } from './lib/figure.mjs';
import { helper } from './lib/cc.mjs';

const { values: o } = parseArgs({
  options: { rounds: { type: 'string', default: '21' }, pauses: { type: 'string', default: '50,150,500' } },
});
const rounds = Number(o.rounds);
const pauses = o.pauses.split(',').map(Number);
if (!Number.isInteger(rounds) || rounds < 1) throw new Error(`--rounds ${o.rounds}: a positive integer`);
if (!pauses.every((p) => Number.isInteger(p) && p > 0)) throw new Error(`--pauses ${o.pauses}: positive integers`);

const payload = JSON.stringify({ podNetworkDesc: { podId: 'pod-1', podNs: 'bench', podName: 'pod-1', DNS: null } });
const tcLine = (dev, prio) =>
  `filter add dev ${dev} parent ffff: prio ${prio} protocol ip u32 match u8 17 0xff at 9 classid ffff:1`.split(' ');

/** the work: parse, build, serialize, encode; returns something so that none of it is optimized away */
function work(i) {
  const req = JSON.parse(payload);
  const steps = Array.from({ length: 12 }, (_, n) => ({
    name: `step-${n}`,
    target: n % 2 ? 'tap0' : 'virtlet-eth0',
    do: Array.from({ length: 4 }, (_, k) => ({ op: 'tc', args: tcLine(n % 2 ? 'tap0' : 'virtlet-eth0', k + 1) })),
    undo: [{ op: 'tc', args: ['qdisc', 'del', 'dev', 'tap0', 'ingress'] }],
  }));
  const rec = { kind: 'record', key: `${req.podNetworkDesc.podId}-${i}`, desc: req.podNetworkDesc, steps };
  const text = JSON.stringify(rec);
  let bytes = 0;
  for (const s of steps) for (const op of s.do) bytes += Buffer.from(op.args.join('\0')).length;
  return text.length + bytes;
}

/** the work timed as the first thing after each of `rounds` pauses */
async function afterPauses(pause) {
  const us = [];
  for (let r = 0; r < rounds; r++) {
    await sleep(pause);
    const t = performance.now();
    sink += work(r);
    us.push((performance.now() - t) * 1000);
  }
  return us;
}

/**
 * the work timed back to back, after 500 untimed runs (the pauses before may have let V8 drop the optimized code): the
 * warm figure
 */
function backToBack() {
  const us = [];
  for (let r = 0; r < 500 + rounds; r++) {
    const t = performance.now();
    sink += work(r);
    if (r >= 500) us.push((performance.now() - t) * 1000);
  }
  return us;
}

let sink = 0;
for (let i = 0; i < 2000; i++) sink += work(i); // compiled and optimized before anything is timed
for (const p of pauses) {
  const cold = await afterPauses(p);
  figure(`idle-penalty-js-${p}ms`, 'us', cold, backToBack(), {
    what: `the JS work (a 9 KB record built and serialized) first after a ${p} ms pause`,
    baselineWhat: 'the same work run back to back',
  });
}
if (sink === 0) throw new Error('the work did nothing');

const out = execFileSync(helper('idle-walk'), ['1024', String(rounds), '0', ...pauses.map(String)], {
  encoding: 'utf8',
});
const rows = new Map(
  out
    .trim()
    .split('\n')
    .map((l) => l.split(' ').map(Number))
    .map(([pause, ...us]) => [pause, us]),
);
for (const p of pauses) {
  figure(`idle-penalty-c-${p}ms`, 'us', rows.get(p), rows.get(0), {
    what: `a C read of every cache line of 1 MiB, first after a ${p} ms pause`,
    baselineWhat: 'the same read right after another one',
  });
}
