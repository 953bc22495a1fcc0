// What the built programs load before their own code runs. An ESM import of a Node builtin builds its ESM facade,
// which reads every export: `import ... from 'node:http'` loads undici (fetch, WebSocket) and http2 at every start,
// about 36 ms and 6 MB of a tapmanager start on the project's machine (docs/performance.md). tapmanager and tapctl
// use no HTTP client, and tapmanager's HTTP listener takes node:http when --http-listen starts it.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { REPO } from '../helpers/daemon.js';

/** The builtins a run of the bundle with these args loaded by its exit (process.moduleLoadList), HTTP ones only. */
function httpModulesLoaded(bundle: string, args: string[]): string[] {
  const hook =
    'data:text/javascript,process.on("exit",()=>process.stderr.write("LOADED "+JSON.stringify(' +
    'process.moduleLoadList.filter((m)=>/undici|http/.test(m)))+"\\n"))';
  const r = spawnSync(process.execPath, ['--import', hook, join(REPO, 'dist/bundle', bundle), ...args], {
    encoding: 'utf8',
    timeout: 30_000,
  });
  const line = r.stderr.split('\n').find((l) => l.startsWith('LOADED '));
  if (line === undefined) throw new Error(`${bundle} ${args.join(' ')}: no LOADED line (${r.stderr.slice(-500)})`);
  return JSON.parse(line.slice('LOADED '.length)) as string[];
}

describe('builtins loaded at start', () => {
  it('tapmanager and tapctl (npm run build) load no node:http, http2 or undici', () => {
    expect(httpModulesLoaded('tapmanager.js', ['--help'])).toEqual([]);
    expect(httpModulesLoaded('tapctl.js', ['--help'])).toEqual([]);
  });
});
