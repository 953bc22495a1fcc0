// tapmanager: the daemon. Only this file chooses exit codes.
import { mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { execFileSync } from 'node:child_process';
import { parseConfig, usage, type TapmanagerConfig } from '../tapmanager/config.js';
import { FdServer } from '../tapmanager/server.js';
import { TapmanagerService } from '../tapmanager/service.js';
import { PodNetwork } from '../podnet/index.js';
import { CniClient, execaPluginExec, killOrphanPlugins, loadConfList, sweepCacheTemps } from '../cni/index.js';
import { createLogger, type Logger } from '../log.js';
import { errorChain } from '../errors.js';

/** Under the state dir: one file per running CNI plugin's process group (execaPluginExec pgidDir). */
export const PLUGIN_PGID_DIR = 'plugins';

/** A group name or number to a gid (getent: no libc binding in Node). */
function resolveGid(group: string): number {
  if (/^\d+$/.test(group)) return Number(group);
  const line = execFileSync('getent', ['group', group], { encoding: 'utf8' }).trim();
  const gid = Number(line.split(':')[2]);
  if (!Number.isInteger(gid)) throw new Error(`group ${JSON.stringify(group)} not found`);
  return gid;
}

export async function runTapmanager(config: TapmanagerConfig, log: Logger): Promise<() => Promise<void>> {
  mkdirSync(dirname(config.socket), { recursive: true, mode: 0o755 });
  mkdirSync(config.stateDir, { recursive: true, mode: 0o700 });
  // kill -9 leftovers, before anything runs a plugin or reads a record: plugin process groups the dead daemon
  // left running (they would go on changing pod networks), and temporary files of the CNI cache
  const pgidDir = join(config.stateDir, PLUGIN_PGID_DIR);
  const orphans = killOrphanPlugins(pgidDir);
  if (orphans.length > 0) log.warn({ plugins: orphans }, 'killed CNI plugins a previous daemon left running');
  const temps = await sweepCacheTemps(config.cniCacheDir);
  if (temps.length > 0) log.info({ files: temps }, 'removed temporary CNI cache files a killed daemon left');
  const cni = new CniClient({ binDirs: config.cniBinDirs, cacheDir: config.cniCacheDir, exec: execaPluginExec({ pgidDir }), timeoutMs: config.cniTimeoutMs, log: log.child({ component: 'cni' }) });
  const pods = new PodNetwork({
    stateDir: config.stateDir,
    cni,
    loadConfList: () => loadConfList(config.cniConfDir),
    log,
    enableSriov: config.enableSriov,
    sysfsRoot: config.sysfsRoot,
  });
  const service = new TapmanagerService(pods, log, { defaultDns: config.defaultDns });
  const restored = await service.restore();
  if (restored.restored.length + restored.rolledBack.length > 0) log.info(restored, 'restored pod networks from the state dir');
  const gid = config.socketGroup ? resolveGid(config.socketGroup) : undefined;
  const server = new FdServer({
    socketPath: config.socket,
    handler: service,
    log,
    ...(gid !== undefined ? { allowedGids: [gid], socketGid: gid } : {}),
  });
  server.start();
  log.info({ socket: config.socket, cniConfDir: config.cniConfDir, cniBinDirs: config.cniBinDirs, stateDir: config.stateDir }, 'tapmanager listening');
  return async () => {
    await server.stop();
    await service.shutdown();
  };
}

async function main(): Promise<number> {
  const parsed = parseConfig(process.argv.slice(2), process.env);
  if (!parsed.ok) {
    for (const e of parsed.errors) process.stderr.write(`tapmanager: ${e}\n`);
    process.stderr.write(`${usage()}\n`);
    return 2;
  }
  if (parsed.config.help) {
    process.stdout.write(`${usage()}\n`);
    return 0;
  }
  const log = createLogger('tapmanager', parsed.config.logLevel);
  let stop: () => Promise<void>;
  try {
    stop = await runTapmanager(parsed.config, log);
  } catch (e) {
    log.fatal({ err: e }, 'start failed');
    process.stderr.write(`tapmanager: ${errorChain(e)}\n`);
    return 1;
  }
  await new Promise<void>((resolve) => {
    const onSignal = (sig: NodeJS.Signals) => {
      log.info({ signal: sig }, 'stopping: finishing running requests, pod networks stay in place');
      process.off('SIGTERM', onSignal);
      process.off('SIGINT', onSignal);
      void stop().then(resolve, (e) => {
        log.error({ err: e }, 'stop failed');
        resolve();
      });
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
  });
  log.info('stopped');
  return 0;
}

main().then(
  (code) => process.exit(code),
  (e) => {
    process.stderr.write(`tapmanager: ${errorChain(e)}\n`);
    process.exit(1);
  },
);
