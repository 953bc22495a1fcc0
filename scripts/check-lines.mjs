// The shape rules no formatter holds: lines of src/ stay within 120 columns (Biome's formatter wraps code, not
// comments or strings), and each C file of the addon (native/) stays within 700 lines and opens with a comment that
// states its job. (Functions of src/ stay within 80 lines: Biome's noExcessiveLinesPerFunction, biome.json.) Prints
// each breach as FILE:LINE and exits 1 when there is one.
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

const MAX_COLUMNS = 120;
const MAX_C_LINES = 700;
const breaches = [];
for (const entry of readdirSync('src', { recursive: true, withFileTypes: true })) {
  if (!entry.isFile() || !entry.name.endsWith('.ts')) continue;
  const file = join(entry.parentPath, entry.name);
  readFileSync(file, 'utf8')
    .split('\n')
    .forEach((line, i) => {
      if (line.length > MAX_COLUMNS) breaches.push(`${file}:${i + 1}: ${line.length} columns`);
    });
}
for (const name of readdirSync('native')) {
  if (!/\.[ch]$/.test(name)) continue;
  const file = join('native', name);
  const lines = readFileSync(file, 'utf8').replace(/\n$/, '').split('\n');
  if (lines.length > MAX_C_LINES) breaches.push(`${file}:${lines.length}: ${lines.length} lines, over ${MAX_C_LINES}`);
  if (!lines[0]?.startsWith('//')) breaches.push(`${file}:1: no header comment stating the file's job`);
}
for (const b of breaches) console.error(b);
if (breaches.length > 0) {
  console.error(`check-lines: ${breaches.length} breach(es) of the shape rules`);
  process.exit(1);
}
