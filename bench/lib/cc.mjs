// The C helpers of the benchmarks (bench/c/*.c: the bare baselines and the shared client) are compiled at bench time
// with the system's `cc` into .cache/bench/bin (git-ignored), again whenever the source is newer than the binary.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { repo } from './dist.mjs';

const binDir = join(repo, '.cache', 'bench', 'bin');

/** Path of the compiled helper bench/c/<name>.c, compiling it first if needed. */
export function helper(name) {
  const src = join(repo, 'bench', 'c', `${name}.c`);
  const out = join(binDir, name);
  if (!existsSync(out) || statSync(out).mtimeMs < statSync(src).mtimeMs) {
    mkdirSync(binDir, { recursive: true });
    execFileSync('cc', ['-O2', '-Wall', '-o', out, src], { stdio: ['ignore', 'inherit', 'inherit'] });
  }
  return out;
}
