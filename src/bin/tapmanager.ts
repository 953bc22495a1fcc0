// tapmanager: the daemon. Only this file chooses exit codes.
import { rmSync } from 'node:fs';
import { join } from 'node:path';
import { execFileSync } from 'node:child_process';
import { parseConfig, usage, type TapmanagerConfig } from '../tapmanager/config.js';
import { FdServer } from '../tapmanager/server.js';
import { TapmanagerService } from '../tapmanager/service.js';
import { PodNetwork } from '../podnet/index.js';
import {
  CniClient,
  spawnPluginExec,
  killOrphanPlugins,
  confListLoader,
  sweepCacheTemps,
  type PluginExec,
} from '../cni/index.js';
import { createLogger, type Logger } from '../log.js';
import { errorChain } from '../errors.js';
import { native } from '../native.js';
import { startHttp, type HttpListener } from '../tapmanager/http.js';
import type { Metrics } from '../tapmanager/metrics.js';
import { SystemdNotifier, notifyConfig } from '../tapmanager/notify.js';
import { preflight } from '../tapmanager/preflight.js';
import { checkReadiness } from '../tapmanager/readiness.js';
import { cniUpkeep } from '../tapmanager/cni-upkeep.js';
import { packageVersion } from '../version.js';
import { setFlagsFromString } from 'node:v8';

/** Under the state dir: one file per running CNI plugin's process group (spawnPluginExec pgidDir). */
export const PLUGIN_PGID_DIR = 'plugins';

/** A group name or number to a gid (getent: no libc binding in Node). */
function resolveGid(group: string): number {
  if (/^\d+$/.test(group)) return Number(group);
  const line = execFileSync('getent', ['group', group], { encoding: 'utf8' }).trim();
  const gid = Number(line.split(':')[2]);
  if (!Number.isInteger(gid)) throw new Error(`group ${JSON.stringify(group)} not found`);
  return gid;
}

/** A start-up problem the operator fixes: printed as one line per problem, no stack. */
class StartupError extends Error {}

/** The daemon's parts, started; stop() ends it (see main). */
export interface Running {
  stop(): Promise<void>;
  /** keys with a request or a restore still running */
  busyKeys(): string[];
  /** settles when the restore of the recorded pods is done */
  restored: Promise<unknown>;
}

/** The state dir's flock, held for the life of the process: one daemon per state dir. */
function lockStateDir(stateDir: string): number {
  try {
    return native().lockExclusive(stateDir);
  } catch (e) {
    if ((e as { code?: string }).code === 'EAGAIN') {
      throw new StartupError(
        `another tapmanager is running on the state dir ${stateDir} (it holds its lock): stop it first, or give ` +
          `this one its own --state-dir and --socket`,
      );
    }
    throw e;
  }
}

/**
 * Start-up order: check the paths (preflight: one line per problem; nothing is created unless all pass, then the state
 * and cache dirs; a later failure removes those again), lock the state dir, the HTTP listener (a taken port ends the
 * start here), then listen on the fd socket and queue the restore of every recorded pod in the same tick. The socket
 * serves at once: a request for a pod still being restored waits in that pod's queue, the others are served meanwhile.
 * Ready (status, /readyz, READY=1) only once the restore is done.
 */
export async function runTapmanager(
  config: TapmanagerConfig,
  log: Logger,
  notifier: SystemdNotifier,
): Promise<Running> {
  const { problems, created } = preflight(config);
  if (problems.length > 0) throw new StartupError(problems.join('\n'));
  try {
    return await startChecked(config, log, notifier);
  } catch (e) {
    // a start that fails (a taken port, another daemon) leaves nothing: the dirs it made go, with what it put there
    for (const dir of created) rmSync(dir, { recursive: true, force: true });
    throw e;
  }
}

/**
 * kill -9 leftovers, before anything runs a plugin or reads a record: plugin process groups the dead daemon left
 * running (they would go on changing pod networks), and temporary files of the CNI cache. Returns the pgid dir.
 */
function sweepKilledDaemon(config: TapmanagerConfig, log: Logger): string {
  const pgidDir = join(config.stateDir, PLUGIN_PGID_DIR);
  const orphans = killOrphanPlugins(pgidDir);
  if (orphans.length > 0) log.warn({ plugins: orphans }, 'killed CNI plugins a previous daemon left running');
  const temps = sweepCacheTemps(config.cniCacheDir);
  if (temps.length > 0) log.info({ files: temps }, 'removed temporary CNI cache files a killed daemon left');
  return pgidDir;
}

/** The CNI client: the plugins spawned by the addon, each run timed when there are metrics. */
function cniClient(
  config: TapmanagerConfig,
  plugins: PluginExec,
  metrics: Metrics | undefined,
  log: Logger,
): CniClient {
  return new CniClient({
    binDirs: config.cniBinDirs,
    cacheDir: config.cniCacheDir,
    exec: metrics ? metrics.timedExec(plugins) : plugins,
    timeoutMs: config.cniTimeoutMs,
    log: log.child({ component: 'cni' }),
  });
}

/** The fd socket's server (not yet listening); gets of ready pods are answered by the addon. */
function fdServer(config: TapmanagerConfig, service: TapmanagerService, log: Logger): FdServer {
  const gid = config.socketGroup ? resolveGid(config.socketGroup) : undefined;
  return new FdServer({
    socketPath: config.socket,
    handler: service,
    log,
    requestTimeoutMs: config.requestTimeoutMs,
    maxConnections: config.maxConnections,
    ...(gid !== undefined ? { allowedGids: [gid], socketGid: gid } : {}),
    // gets of ready pods answered by the addon; at debug every get goes through the service, which logs it
    fastGets: !log.isLevelEnabled('debug'),
  });
}

/** The start once the paths are checked and the state and cache dirs exist: runTapmanager's rest. */
async function startChecked(config: TapmanagerConfig, log: Logger, notifier: SystemdNotifier): Promise<Running> {
  lockStateDir(config.stateDir); // the fd stays open (CLOEXEC) until the process ends
  const pgidDir = sweepKilledDaemon(config, log);
  // metrics (prom-client) only with --http-listen, the one place they are read: loaded on demand
  const metrics = config.httpListen
    ? (await import('../tapmanager/metrics.js')).createMetrics(
        (): Record<string, number> => service.podsByState(),
        (): number => server.fastGetsAnswered,
      )
    : undefined;
  const plugins = spawnPluginExec({ pgidDir });
  const cni = cniClient(config, plugins, metrics, log);
  const loadConf = confListLoader(config.cniConfDir);
  const pods = new PodNetwork({
    stateDir: config.stateDir,
    cni,
    loadConfList: loadConf,
    log,
    enableSriov: config.enableSriov,
    sysfsRoot: config.sysfsRoot,
    spareNetns: config.spareNetns,
    binding: config.binding,
  });
  const service = new TapmanagerService(pods, log, {
    defaultDns: config.defaultDns,
    ...(metrics ? { hooks: { ...metrics.hooks } } : {}),
  });
  const upkeep = cniUpkeep({
    cni,
    loadConfList: loadConf,
    pods,
    service,
    config,
    log: log.child({ component: 'cni' }),
    ...(metrics ? { onStatus: metrics.onCniStatus } : {}),
  });
  const server = fdServer(config, service, log);
  service.replies = server;
  service.hooks.readiness = () =>
    checkReadiness({
      socketPath: config.socket,
      listening: () => server.listening,
      cniConfDir: config.cniConfDir,
      loadConfList: loadConf,
      cniStatus: upkeep.reasons,
    });
  // the HTTP listener before the fd socket: a taken port ends the start before anything is served, and /healthz
  // answers during a long restore (/readyz says why not yet)
  const http = metrics ? await startHttpListener(config, metrics, service, log) : undefined;
  // listen, then queue the restore of every recorded key, in the same tick (both synchronous): the socket is
  // served at once, yet no request can reach a key before its restore is queued. A live socket (another daemon)
  // makes start() throw before anything is restored.
  await listenOrClose(server, http, config.socket);
  let stopping = false;
  const restored = restoreThenReady(service, pods, notifier, log, config.socket, () => stopping);
  upkeep.start(restored);
  log.info(
    { socket: config.socket, cniConfDir: config.cniConfDir, cniBinDirs: config.cniBinDirs, stateDir: config.stateDir },
    'tapmanager listening',
  );
  return {
    stop: async () => {
      stopping = true;
      upkeep.stop();
      await server.stop();
      await service.shutdown();
      plugins.close?.();
      await http?.close();
    },
    busyKeys: () => service.queue.busyKeys,
    restored,
  };
}

/** The HTTP listener of --http-listen (/healthz, /readyz, /metrics); a taken port is a StartupError. */
async function startHttpListener(
  config: TapmanagerConfig,
  metrics: Metrics,
  service: TapmanagerService,
  log: Logger,
): Promise<HttpListener | undefined> {
  if (!config.httpListen) return undefined;
  let http: HttpListener;
  try {
    http = await startHttp(config.httpListen, {
      readiness: () => service.status(),
      metrics: () => metrics.render(),
      log: log.child({ component: 'http' }),
    });
  } catch (e) {
    throw new StartupError((e as Error).message);
  }
  log.info({ host: http.host, port: http.port }, 'HTTP listening: /healthz /readyz /metrics');
  return http;
}

/**
 * Listens on the fd socket; the caller queues the restore of every recorded key in the same tick (both synchronous):
 * the socket is served at once, yet no request can reach a key before its restore is queued. A live socket (another
 * daemon) throws before anything is restored, with the HTTP listener closed.
 */
async function listenOrClose(server: FdServer, http: HttpListener | undefined, socket: string): Promise<void> {
  try {
    server.start();
  } catch (e) {
    await http?.close();
    if ((e as { code?: string }).code === 'EADDRINUSE') {
      throw new StartupError(
        `another tapmanager is serving on the socket ${socket}: stop it first, or give this one its own --socket`,
      );
    }
    throw e;
  }
}

/** The restore of every recorded pod; once done (and no stop has begun), READY=1 for systemd. */
function restoreThenReady(
  service: TapmanagerService,
  pods: PodNetwork,
  notifier: SystemdNotifier,
  log: Logger,
  socket: string,
  stopping: () => boolean,
): Promise<unknown> {
  return service.restore().then(
    (r) => {
      if (Object.values(r).some((keys) => keys.length > 0)) log.info(r, 'restored pod networks from the state dir');
      // listening and restored: systemd may now start what depends on us (not once a stop has begun)
      if (!stopping()) notifier.ready(`serving ${pods.keys().length} pod networks on ${socket}`);
      return r;
    },
    (e: unknown) => log.error({ err: e }, 'restore failed'),
  );
}

/** SIGTERM/SIGINT, caught from the first moment: stop() is called once; later signals are only logged. */
function onStopSignal(log: Logger, stop: (sig: NodeJS.Signals) => void): void {
  let seen = false;
  const handler = (sig: NodeJS.Signals) => {
    if (seen) {
      log.warn({ signal: sig }, 'already stopping: waiting for running requests (bounded by --stop-timeout)');
      return;
    }
    seen = true;
    stop(sig);
  };
  // never removed: a second signal while stopping must find a listener, not Node's default (which would kill the
  // daemon mid-request with no reply sent)
  process.on('SIGTERM', handler);
  process.on('SIGINT', handler);
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
  if (parsed.config.version) {
    process.stdout.write(`${packageVersion()}\n`);
    return 0;
  }
  // before the pool's threads start and before the requests' code is compiled (docs/performance.md, "Sparkplug and
  // two malloc arenas"): each thread of the pool and of V8 would otherwise get a malloc arena of its own, holding what
  // it freed; and adds and releases come a few times a minute, so V8 would run their code in its interpreter for the
  // daemon's whole life, where Sparkplug compiles each function at its first call
  native().mallocArenaMax(2);
  setFlagsFromString('--always-sparkplug');
  const config = parsed.config;
  const log = createLogger('tapmanager', config.logLevel);
  // the first line says which build runs (an operator's first question about a node's logs)
  log.info({ version: packageVersion(), node: process.version }, 'tapmanager starting');
  const notifier = new SystemdNotifier(notifyConfig(process.env), log);
  let signalled: (sig: NodeJS.Signals) => void = () => undefined;
  const stopRequested = new Promise<NodeJS.Signals>((r) => (signalled = r));
  onStopSignal(log, (sig) => signalled(sig));
  let running: Running;
  try {
    running = await runTapmanager(config, log, notifier);
  } catch (e) {
    if (e instanceof StartupError) {
      for (const line of e.message.split('\n')) process.stderr.write(`tapmanager: ${line}\n`);
    } else {
      log.fatal({ err: e }, 'start failed');
      process.stderr.write(`tapmanager: ${errorChain(e)}\n`);
    }
    return 1;
  }
  const sig = await stopRequested;
  notifier.stopping('finishing running requests; pod networks stay in place');
  log.info(
    { signal: sig, busyKeys: running.busyKeys(), stopTimeoutMs: config.stopTimeoutMs },
    'stopping: no new connections, finishing running requests; pod networks stay in place',
  );
  let timer: NodeJS.Timeout | undefined;
  const bound = new Promise<'timeout'>((r) => (timer = setTimeout(() => r('timeout'), config.stopTimeoutMs)));
  const outcome = await Promise.race([
    running.stop().then(
      () => 'stopped' as const,
      (e: unknown) => {
        log.error({ err: e }, 'stop failed');
        return 'failed' as const;
      },
    ),
    bound,
  ]);
  clearTimeout(timer);
  notifier.close();
  // the lines written after a reply's turn (a DHCP server's stop line) are out before the exit
  await new Promise((r) => setImmediate(r));
  if (outcome === 'timeout') {
    log.error(
      { busyKeys: running.busyKeys(), stopTimeoutMs: config.stopTimeoutMs },
      'requests still running at --stop-timeout: exiting; the next start finishes or rolls them back',
    );
    return 1;
  }
  log.info('stopped');
  return outcome === 'stopped' ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (e) => {
    process.stderr.write(`tapmanager: ${errorChain(e)}\n`);
    process.exit(1);
  },
);
