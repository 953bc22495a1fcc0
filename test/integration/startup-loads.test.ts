// What the built programs load. An ESM import of a Node builtin builds its ESM facade, which reads every export:
// `import ... from 'node:http'` loads undici (fetch, WebSocket) and http2 at every start, about 36 ms and 6 MB of a
// tapmanager start on the project's machine (docs/performance.md). tapmanager and tapctl use no HTTP client, and
// tapmanager takes node:http only when --http-listen starts its listener.
import { spawnSync } from 'node:child_process';
import { execa } from 'execa';
import { describe, expect, it } from 'vitest';
import { BIN, startDaemon, stopDaemonAndNet, type Daemon } from '../helpers/daemon.js';
import { makeCniConf } from '../helpers/cniconf.js';

/**
 * A preload that writes the HTTP builtins the process loaded (process.moduleLoadList) as its last line on stderr
 * (URL-encoded: NODE_OPTIONS takes quotes as its own)
 */
const HOOK = `data:text/javascript,${encodeURIComponent(
  'process.on("exit", () => process.stderr.write("LOADED " + ' +
    'JSON.stringify(process.moduleLoadList.filter((m) => /undici|http/.test(m))) + "\\n"))',
)}`;

function loadedIn(output: string): string[] {
  const line = output.split('\n').find((l) => l.startsWith('LOADED '));
  if (line === undefined) throw new Error(`no LOADED line in: ${output.slice(-500)}`);
  return JSON.parse(line.slice('LOADED '.length)) as string[];
}

/** The HTTP builtins a run of the built program with these args loaded by its exit. */
function httpModulesLoaded(program: string, args: string[]): string[] {
  const r = spawnSync(process.execPath, ['--import', HOOK, program, ...args], {
    encoding: 'utf8',
    timeout: 30_000,
  });
  return loadedIn(r.stderr);
}

/** A daemon (with these flags) that answers one request and stops: the HTTP builtins it loaded in its life. */
async function daemonLoads(extraArgs: string[]): Promise<string[]> {
  const net = await makeCniConf();
  let d: Daemon | undefined;
  try {
    d = await startDaemon({
      confDir: net.confDir,
      binDirs: net.binDirs,
      extraArgs,
      env: { NODE_OPTIONS: `--import=${HOOK}` },
    });
    const listed = await execa(process.execPath, [BIN.tapctl, '--socket', d.socket, 'list'], { timeout: 30_000 });
    expect(listed.exitCode).toBe(0);
    // the line is written at the daemon's exit, into its log, which goes with its dir
    expect(await d.stop()).toBe(0);
    return loadedIn(d.logs());
  } finally {
    if (d) await stopDaemonAndNet(d, net, { ifAlive: true });
    else await net.cleanup();
  }
}

describe('builtins loaded at start', () => {
  it('tapmanager and tapctl (npm run build) load no node:http, http2 or undici', () => {
    expect(httpModulesLoaded(BIN.tapmanager, ['--help'])).toEqual([]);
    expect(httpModulesLoaded(BIN.tapctl, ['--help'])).toEqual([]);
  });

  it('a daemon loads node:http only with --http-listen, and undici never', async () => {
    expect(await daemonLoads([])).toEqual([]);
    const withHttp = await daemonLoads(['--http-listen', '127.0.0.1:0']);
    expect(withHttp).toContain('NativeModule http');
    expect(withHttp.filter((m) => /undici/.test(m))).toEqual([]);
  }, 120_000);
});
