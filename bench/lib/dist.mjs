// Benchmarks run the project's built output (dist/, made by `npm run build`), never the TypeScript sources.
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

export const repo = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');

/** import dist/<rel> (e.g. "dhcp/index.js"), with a clear message when the build is missing */
export async function importDist(rel) {
  const file = join(repo, 'dist', rel);
  if (!existsSync(file))
    throw new Error(`${file} does not exist: run "npm run build" first (benchmarks use the built output)`);
  return import(pathToFileURL(file).href);
}
