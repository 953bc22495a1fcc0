#!/usr/bin/env node
// Runs every benchmark in turn (root; after `npm run build`): `npm run bench`, or `npm run bench -- dhcp-answer add-latency`.
// Each prints its own JSON lines and summary; docs/performance.md explains them.
import { spawnSync } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const ALL = ['dhcp-answer', 'add-latency', 'vmwrapper-start', 'vm-start-baseline', 'vm-start-pair'];
const chosen = process.argv.slice(2);
const unknown = chosen.filter((b) => !ALL.includes(b));
if (unknown.length) {
  console.error(`unknown benchmark(s): ${unknown.join(', ')}; choose from ${ALL.join(', ')}`);
  process.exit(2);
}
let failed = 0;
for (const b of chosen.length ? chosen : ALL) {
  console.log(`\n== ${b}`);
  const r = spawnSync(process.execPath, [join(here, `${b}.mjs`)], { stdio: 'inherit' });
  if (r.status !== 0) failed++;
}
process.exit(failed ? 1 : 0);
