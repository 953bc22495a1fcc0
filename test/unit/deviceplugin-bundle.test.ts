// gRPC and prom-client belong to the programs that use them: vmwrapper's bundle holds neither the device plugin nor
// its libraries; the device plugin's loads prom-client only under --http-listen (a lazily evaluated module).
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { build } from 'esbuild';
import { describe, expect, it } from 'vitest';
import { REPO } from '../helpers/daemon.js';

async function inputs(entry: string): Promise<string[]> {
  const r = await build({
    entryPoints: [join(REPO, entry)],
    bundle: true,
    platform: 'node',
    target: 'node20',
    format: 'esm',
    write: false,
    metafile: true,
    logLevel: 'silent',
    absWorkingDir: REPO,
  });
  return Object.keys(r.metafile.inputs);
}

describe('the device plugin in the bundles', () => {
  it("vmwrapper's built bundles (npm run build) hold no device-plugin code, no grpc-js, no prom-client", () => {
    for (const b of ['vmwrapper.cjs', 'vmwrapper-start.cjs']) {
      const map = JSON.parse(readFileSync(join(REPO, 'dist/bundle', `${b}.map`), 'utf8')) as { sources: string[] };
      expect(map.sources.length, b).toBeGreaterThan(3);
      expect(
        map.sources.filter((f) => /src\/deviceplugin\/|node_modules\/(@grpc|prom-client)\//.test(f)),
        b,
      ).toEqual([]);
    }
  });

  it('vfio-device-plugin has its module and prom-client, and the metrics module only behind import()', async () => {
    const files = await inputs('src/bin/vfio-device-plugin.ts');
    expect(files).toContain('src/deviceplugin/plugin.ts');
    expect(files).toContain('src/deviceplugin/metrics.ts');
    expect(readFileSync(join(REPO, 'src/bin/vfio-device-plugin.ts'), 'utf8')).toMatch(
      /await import\('\.\.\/deviceplugin\/metrics\.js'\)/,
    );
    expect(files.some((f) => f.includes('node_modules/prom-client/'))).toBe(true);
  }, 120_000);
});
