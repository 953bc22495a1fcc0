// prom-client belongs to tapmanager alone: bundle each program as scripts/bundle.mjs does and read what went in.
import { describe, it, expect } from 'vitest';
import { join } from 'node:path';
import { build } from 'esbuild';
import { REPO } from '../helpers/daemon.js';

async function inputs(name: string): Promise<string[]> {
  const r = await build({
    entryPoints: [join(REPO, `src/bin/${name}.ts`)],
    bundle: true,
    platform: 'node',
    target: 'node24',
    format: 'esm',
    write: false,
    metafile: true,
    logLevel: 'silent',
    absWorkingDir: REPO,
  });
  return Object.keys(r.metafile.inputs);
}

describe('what each bundle contains', () => {
  it('prom-client and the metrics module are in tapmanager only', async () => {
    const tm = await inputs('tapmanager');
    expect(tm.some((f) => f.includes('node_modules/prom-client/'))).toBe(true);
    expect(tm).toContain('src/tapmanager/metrics.ts');
    for (const name of ['vmwrapper', 'tapctl']) {
      const files = await inputs(name);
      expect(
        files.filter((f) => f.includes('prom-client') || f.includes('tdigest') || f.startsWith('src/tapmanager/')),
        name,
      ).toEqual([]);
    }
  }, 120_000);

  it('vmwrapper loads no logger library (its one line is written by hand) and no execa', async () => {
    const files = await inputs('vmwrapper');
    expect(
      files.filter((f) => /node_modules\/(pino|execa|thread-stream|sonic-boom)\//.test(f) || f === 'src/log.ts'),
    ).toEqual([]);
    expect(files).toContain('src/vmwrapper/logline.ts');
  }, 120_000);
});
