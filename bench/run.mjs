#!/usr/bin/env node
// Runs the benchmarks (root; after `npm run build`) and prints every figure with its same-run baseline and the
// ratio (median, p90, p99), then the issue's goal:
//   npm run bench                                   all of them
//   npm run bench -- pods dhcp-first                some of them
//   npm run -s bench -- --json                      one JSON array of the figures on stdout (-s keeps npm's
//                                                   banner off it; the benches' own output goes to stderr)
//   npm run bench -- pods -- --figures add --runs 5 arguments after a second "--" go to every chosen bench
// docs/performance.md explains each figure and how its baseline is built.
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const ALL = [
  'pods',
  'add-stages',
  'dhcp-first',
  'dhcp6-first',
  'vmwrapper-start',
  'dhcp-answer',
  'vm-start-pair',
  'idle-penalty',
];
const argv = process.argv.slice(2);
const dash = argv.indexOf('--');
const own = dash < 0 ? argv : argv.slice(0, dash);
const pass = dash < 0 ? [] : argv.slice(dash + 1);
const json = own.includes('--json');
const chosen = own.filter((a) => a !== '--json');
const unknown = chosen.filter((b) => !ALL.includes(b));
if (unknown.length) {
  console.error(`unknown benchmark(s): ${unknown.join(', ')}; choose from ${ALL.join(', ')}`);
  process.exit(2);
}
const say = json ? (s) => process.stderr.write(`${s}\n`) : (s) => process.stdout.write(`${s}\n`);

function runOne(name) {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, [join(here, `${name}.mjs`), ...pass], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const figures = [];
    let buf = '';
    child.stdout.on('data', (b) => {
      buf += b;
      let i;
      while ((i = buf.indexOf('\n')) >= 0) {
        const line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        say(line);
        if (line.startsWith('{"figure"')) figures.push({ bench: name, ...JSON.parse(line) });
      }
    });
    child.on('close', (code) => resolve({ code, figures }));
  });
}

const fmt = (x) => (x === null || x === undefined ? '-' : String(x));
const all = [];
let failed = 0;
for (const b of chosen.length ? chosen : ALL) {
  say(`\n== ${b}`);
  const r = await runOne(b);
  if (r.code !== 0) {
    failed++;
    say(`== ${b} FAILED (exit ${r.code})`);
  }
  all.push(...r.figures);
}
if (json) process.stdout.write(`${JSON.stringify(all, null, 1)}\n`);
else {
  say('\n== figures (ours | same-run baseline | ratio; median / p90 / p99)');
  for (const f of all) {
    if (f.value) {
      say(`${f.figure.padEnd(32)} ${JSON.stringify(f.value)}${f.extra ? ` ${JSON.stringify(f.extra)}` : ''}`);
      continue;
    }
    const d = (x) => `${fmt(x.median)} / ${fmt(x.p90)} / ${fmt(x.p99)}`;
    const goal = f.goal === null ? '' : `  goal <= ${f.goal}x${f.goalP99 ? ` (p99 <= ${f.goalP99}x)` : ''}`;
    say(`${f.figure.padEnd(32)} ${d(f.ours)} ${f.unit} | ${d(f.baseline)} ${f.unit} | x${d(f.ratio)}${goal}`);
  }
}
process.exit(failed ? 1 : 0);
