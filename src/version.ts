// The package's version, from its own package.json: the nearest one named vmpod-node above this module. The same
// lookup serves src/ (tests), dist/ (tsc), dist/bundle/ (the bundles) and an installed package, with no build step
// stamping a copy. Read on demand: vmwrapper reads it for --version only, never on a start or probe.
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const NAME = 'vmpod-node';

/** The version in the package.json named vmpod-node nearest above `from` (a dir); throws when there is none. */
export function packageVersion(from = dirname(fileURLToPath(import.meta.url))): string {
  for (let dir = from; ; dir = dirname(dir)) {
    let pkg: { name?: unknown; version?: unknown } | undefined;
    try {
      pkg = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8')) as typeof pkg;
    } catch {
      // none here (or unreadable): look further up
    }
    if (pkg?.name === NAME && typeof pkg.version === 'string') return pkg.version;
    if (dirname(dir) === dir) throw new Error(`no package.json of ${NAME} above ${from}`);
  }
}
