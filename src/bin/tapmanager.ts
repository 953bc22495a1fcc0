// tapmanager: the daemon. Only this file chooses exit codes.
import { execFileSync } from 'node:child_process';
import { parseConfig, usage, type TapmanagerConfig } from '../tapmanager/config.js';
import { FdServer } from '../tapmanager/server.js';
import { TapmanagerService } from '../tapmanager/service.js';
import { PodNetwork } from '../podnet/index.js';
import { CniClient, execaPluginExec, loadConfList } from '../cni/index.js';
import { createLogger, type Logger } from '../log.js';
import { errorChain } from '../errors.js';
import { createMetrics } from '../tapmanager/metrics.js';
import { startHttp, type HttpListener } from '../tapmanager/http.js';
import { SystemdNotifier, notifyConfig } from '../tapmanager/notify.js';
import { preflight } from '../tapmanager/preflight.js';
import { checkReadiness } from '../tapmanager/readiness.js';

/** A group name or number to a gid (getent: no libc binding in Node). */
function resolveGid(group: string): number {
  if (/^\d+$/.test(group)) return Number(group);
  const line = execFileSync('getent', ['group', group], { encoding: 'utf8' }).trim();
  const gid = Number(line.split(':')[2]);
  if (!Number.isInteger(gid)) throw new Error(`group ${JSON.stringify(group)} not found`);
  return gid;
}

/** A start-up problem the operator fixes: printed as one line, no stack. */
class StartupError extends Error {}

export async function runTapmanager(config: TapmanagerConfig, log: Logger, notifier: SystemdNotifier): Promise<() => Promise<void>> {
  const problems = preflight(config);
  if (problems.length > 0) throw new StartupError(problems.join('\n'));
  const loadConf = () => loadConfList(config.cniConfDir);
  let service: TapmanagerService | undefined;
  const metrics = createMetrics(() => service?.podsByState() ?? {});
  const cni = new CniClient({ binDirs: config.cniBinDirs, cacheDir: config.cniCacheDir, exec: metrics.timedExec(execaPluginExec()), timeoutMs: config.cniTimeoutMs, log: log.child({ component: 'cni' }) });
  const pods = new PodNetwork({
    stateDir: config.stateDir,
    cni,
    loadConfList: loadConf,
    log,
    enableSriov: config.enableSriov,
    sysfsRoot: config.sysfsRoot,
  });
  service = new TapmanagerService(pods, log, metrics.hooks);
  const svc = service;
  let server: FdServer | undefined;
  svc.hooks.readiness = () => checkReadiness({ socketPath: config.socket, listening: () => server?.listening ?? false, cniConfDir: config.cniConfDir, loadConfList: loadConf });
  // the HTTP listener comes first: a taken port ends the start at once, and /healthz answers during a long restore
  let http: HttpListener | undefined;
  if (config.httpListen) {
    try {
      http = await startHttp(config.httpListen, { readiness: async () => svc.status(), metrics: () => metrics.render(), log: log.child({ component: 'http' }) });
    } catch (e) {
      throw new StartupError((e as Error).message);
    }
    log.info({ host: http.host, port: http.port }, 'HTTP listening: /healthz /readyz /metrics');
  }
  const restored = await svc.restore();
  if (restored.restored.length + restored.rolledBack.length > 0) log.info(restored, 'restored pod networks from the state dir');
  const gid = config.socketGroup ? resolveGid(config.socketGroup) : undefined;
  server = new FdServer({
    socketPath: config.socket,
    handler: svc,
    log,
    ...(gid !== undefined ? { allowedGids: [gid], socketGid: gid } : {}),
  });
  server.start();
  log.info({ socket: config.socket, cniConfDir: config.cniConfDir, cniBinDirs: config.cniBinDirs, stateDir: config.stateDir }, 'tapmanager listening');
  // listening and restored: systemd may now start what depends on us
  notifier.ready(`serving ${pods.keys().length} pod networks on ${config.socket}`);
  const srv = server;
  return async () => {
    await srv.stop();
    await svc.shutdown();
    await http?.close();
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
  const notifier = new SystemdNotifier(notifyConfig(process.env), log);
  let stop: () => Promise<void>;
  try {
    stop = await runTapmanager(parsed.config, log, notifier);
  } catch (e) {
    if (e instanceof StartupError) {
      for (const line of e.message.split('\n')) process.stderr.write(`tapmanager: ${line}\n`);
    } else {
      log.fatal({ err: e }, 'start failed');
      process.stderr.write(`tapmanager: ${errorChain(e)}\n`);
    }
    return 1;
  }
  await new Promise<void>((resolve) => {
    const onSignal = (sig: NodeJS.Signals) => {
      log.info({ signal: sig }, 'stopping: finishing running requests, pod networks stay in place');
      notifier.stopping('finishing running requests; pod networks stay in place');
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
  notifier.close();
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
