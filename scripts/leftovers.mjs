// What the test run left behind, for scripts/test.sh: temp dirs and files of the project's tests (names starting with
// "vmp": vmpod-, vmpt-, vmpc-) and named netns that were not there before the run. Each test removes what it made and
// checks its own netns and links; this catches what a test forgot (a daemon's temp dir, say).
//   node scripts/leftovers.mjs snapshot FILE    writes what is there now to FILE
//   node scripts/leftovers.mjs check FILE       prints each new one (exit 1), or nothing (exit 0)
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const NETNS_DIR = '/var/run/netns';

function list(dir, keep = () => true) {
  try {
    return readdirSync(dir)
      .filter(keep)
      .map((n) => join(dir, n));
  } catch {
    return [];
  }
}

const now = () => [...list(tmpdir(), (n) => n.startsWith('vmp')), ...list(NETNS_DIR)];

const [cmd, file] = process.argv.slice(2);
if (cmd === 'snapshot' && file) {
  writeFileSync(file, JSON.stringify(now()));
} else if (cmd === 'check' && file) {
  const before = new Set(JSON.parse(readFileSync(file, 'utf8')));
  const left = now().filter((p) => !before.has(p));
  for (const p of left) console.log(`left behind by the tests: ${p}`);
  process.exit(left.length > 0 ? 1 : 0);
} else {
  console.error('usage: leftovers.mjs snapshot|check FILE');
  process.exit(2);
}
