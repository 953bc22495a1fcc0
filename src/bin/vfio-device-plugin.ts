// vfio-device-plugin: the kubelet device plugin for VFIO PCI functions. Only this file chooses exit codes:
// 0 after SIGTERM/SIGINT (sockets removed), 1 when the start fails (a bad config: one line per problem) or kubelet
// refuses the registration, 2 on a usage error.
import { existsSync, statSync } from 'node:fs';
import { errorChain } from '../errors.js';
import { createLogger } from '../log.js';
import { loadResources } from '../deviceplugin/config.js';
import { dpUsage, parseOptions } from '../deviceplugin/options.js';
import type { Inventory } from '../deviceplugin/inventory.js';
import type { DpMetrics } from '../deviceplugin/metrics.js';
import { VfioDevicePlugin } from '../deviceplugin/plugin.js';
import { startHttp, type HttpListener } from '../tapmanager/http.js';
import { packageVersion } from '../version.js';

const NAME = 'vfio-device-plugin';

/**
 * --probe PATH: one GET of the running plugin's listener, for exec probes (the image has no curl; podman kube play
 * runs an exec probe through a shell, so its command is plain words). A wildcard address is asked on loopback.
 */
async function probe(listen: { host: string; port: number }, path: string): Promise<number> {
  const host = listen.host === '0.0.0.0' ? '127.0.0.1' : listen.host === '::' ? '::1' : listen.host;
  const url = `http://${host.includes(':') ? `[${host}]` : host}:${listen.port}${path}`;
  try {
    const r = await fetch(url, { signal: AbortSignal.timeout(5000) });
    if (r.ok) return 0;
    process.stderr.write(`${NAME}: ${url}: ${r.status} ${(await r.text()).trim()}\n`);
  } catch (e) {
    process.stderr.write(`${NAME}: ${url}: ${errorChain(e)}\n`);
  }
  return 1;
}

async function main(): Promise<number> {
  const parsed = parseOptions(process.argv.slice(2), process.env);
  if (!parsed.ok) {
    for (const e of parsed.errors) process.stderr.write(`${NAME}: ${e}\n`);
    process.stderr.write(`${dpUsage()}\n`);
    return 2;
  }
  const o = parsed.options;
  if (o.help) {
    process.stdout.write(`${dpUsage()}\n`);
    return 0;
  }
  if (o.version) {
    process.stdout.write(`${packageVersion()}\n`);
    return 0;
  }
  if (o.probe !== undefined) return probe(o.httpListen!, o.probe);
  const { resources, problems } = await loadResources(o.config, { cdi: o.cdiDir !== undefined });
  if (!existsSync(o.kubeletDir) || !statSync(o.kubeletDir).isDirectory())
    problems.push(
      `--kubelet-dir ${o.kubeletDir} is not a directory: mount kubelet's device-plugins dir there (the host's ` +
        `/var/lib/kubelet/device-plugins)`,
    );
  if (problems.length > 0) {
    for (const p of problems) process.stderr.write(`${NAME}: ${p}\n`);
    return 1;
  }
  const log = createLogger(NAME, o.logLevel);
  // the first line says which build runs
  log.info({ version: packageVersion(), node: process.version }, `${NAME} starting`);
  let stop: (sig: NodeJS.Signals) => void = () => undefined;
  const stopped = new Promise<NodeJS.Signals>((r) => (stop = r));
  process.on('SIGTERM', () => stop('SIGTERM'));
  process.on('SIGINT', () => stop('SIGINT'));
  // prom-client only with --http-listen, the one place its metrics are read
  const metrics: DpMetrics | undefined = o.httpListen
    ? (await import('../deviceplugin/metrics.js')).createDpMetrics(
        (): Inventory => plugin.inventory,
        (): boolean => plugin.registered,
      )
    : undefined;
  const plugin: VfioDevicePlugin = new VfioDevicePlugin(o, resources, log, metrics?.hooks ?? {});
  let http: HttpListener | undefined;
  try {
    if (o.httpListen && metrics) {
      http = await startHttp(o.httpListen, {
        readiness: async () => ({
          ready: plugin.registered,
          reasons: plugin.registered ? [] : ['not registered with kubelet yet'],
        }),
        metrics: () => metrics.render(),
        log: log.child({ component: 'http' }),
      });
      log.info({ host: http.host, port: http.port }, 'HTTP listening: /healthz /readyz /metrics');
    }
    await plugin.start();
  } catch (e) {
    plugin.stop();
    await http?.close();
    process.stderr.write(`${NAME}: ${errorChain(e)}\n`);
    return 1;
  }
  log.info(
    {
      kubeletDir: o.kubeletDir,
      cdiDir: o.cdiDir ?? null,
      resources: resources.map((r) => `${r.resourceName} (${r.unit})`),
    },
    'serving',
  );
  const end = await Promise.race([stopped, plugin.registrar.refused]);
  plugin.stop();
  await http?.close();
  if (end instanceof Error) {
    process.stderr.write(`${NAME}: ${end.message}\n`);
    return 1;
  }
  log.info({ signal: end }, 'stopped: sockets removed');
  return 0;
}

main().then(
  (code) => process.exit(code),
  (e) => {
    process.stderr.write(`${NAME}: ${errorChain(e)}\n`);
    process.exit(1);
  },
);
