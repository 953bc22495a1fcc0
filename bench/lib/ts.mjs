// Loads the project's TypeScript test helpers into a benchmark: Node 24 strips types, but the helpers import each other
// by their .js names (tsc's convention), which only a bundler maps to the .ts files, so the named re-exports are
// bundled with esbuild into .cache/bench/<name>.mjs (git-ignored). Bare imports (execa) stay
// external and resolve from the repo's node_modules; the helpers' repo-relative paths (dist/bundle,
// build/Release) resolve from .cache/bench/../.. = the repo.
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import * as esbuild from 'esbuild';
import { repo } from './dist.mjs';

/** lines: export statements relative to the repo, e.g. "export { makeCniConf } from './test/helpers/cniconf.ts';" */
export async function loadTs(name, lines) {
  const outdir = join(repo, '.cache', 'bench');
  await mkdir(outdir, { recursive: true });
  const outfile = join(outdir, `${name}.mjs`);
  await esbuild.build({
    stdin: { contents: lines.join('\n'), resolveDir: repo, sourcefile: `${name}-entry.ts`, loader: 'ts' },
    bundle: true,
    platform: 'node',
    format: 'esm',
    target: 'node24',
    packages: 'external',
    outfile,
    logLevel: 'warning',
  });
  return import(`${pathToFileURL(outfile).href}?t=${Date.now()}`);
}
