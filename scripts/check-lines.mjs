// Lines of src/ stay within 120 columns (Biome's formatter wraps code, not comments or strings): prints each longer
// line as FILE:LINE and exits 1 when there is one. (Functions of src/ stay within 80 lines: Biome's
// noExcessiveLinesPerFunction, biome.json; the C files' size and headers: test/unit/native-files.test.ts.)
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';

const MAX = 120;
const long = [];
for (const entry of readdirSync('src', { recursive: true, withFileTypes: true })) {
  if (!entry.isFile() || !entry.name.endsWith('.ts')) continue;
  const file = join(entry.parentPath, entry.name);
  readFileSync(file, 'utf8')
    .split('\n')
    .forEach((line, i) => {
      if (line.length > MAX) long.push(`${file}:${i + 1}: ${line.length} columns`);
    });
}
for (const l of long) console.error(l);
if (long.length > 0) {
  console.error(`check-lines: ${long.length} line(s) of src/ over ${MAX} columns`);
  process.exit(1);
}
