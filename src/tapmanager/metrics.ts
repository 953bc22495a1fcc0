// Prometheus metrics (prom-client): tapmanager only. Imported by src/bin/tapmanager.ts and nothing else, so the
// vmwrapper and tapctl bundles never contain prom-client (test/unit/bundle-deps.test.ts checks). The rest of the
// daemon reports through plain callbacks (ServiceHooks, the CNI exec wrapper below).
// docs/operations.md lists every metric and what an alert on it means.
import { basename } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from 'prom-client';
import type { PluginExec, PluginStatus } from '../cni/index.js';
import { CheckReason } from '../podnet/check.js';
import type { ServiceHooks } from './service.js';
import { packageVersion } from '../version.js';

export const PREFIX = 'vmpod_';

/** Requests are fast (get, list) or wait on CNI plugins (add, release): buckets from 1 ms to 2 min. */
const REQUEST_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120];
const PLUGIN_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60];
const RESTORE_BUCKETS = [0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300];

export interface Metrics {
  registry: Registry;
  /** hooks for TapmanagerService */
  hooks: Required<Pick<ServiceHooks, 'onRequest' | 'onDhcpPacket' | 'onDhcpLease' | 'onRestored' | 'onCheckFailure'>>;
  /** each CNI STATUS answer (cni-status.ts): vmpod_cni_status */
  onCniStatus(network: string, statuses: PluginStatus[]): void;
  /** wraps a CNI PluginExec so that each plugin run is timed by plugin and command */
  timedExec(inner: PluginExec): PluginExec;
  /** the text exposition and its content type */
  render(): Promise<{ contentType: string; body: string }>;
}

/**
 * `podsByState` is read at scrape time (a gauge with collect); so is `fastGets`, the gets the socket server answered
 * without the service (counted in requests_total as get/ok; they take microseconds and stay out of the histogram).
 */
type Base = <L extends string>(
  name: string,
  help: string,
  labelNames?: L[],
) => { name: string; help: string; labelNames: L[]; registers: Registry[] };

/** The fd protocol's requests and the CNI plugins' runs. */
function requestMetrics(base: Base) {
  const requests = new Counter(
    base('requests_total', 'fd-protocol requests served, by command and result ("ok" or the error code)', [
      'command',
      'result',
    ]),
  );
  const duration = new Histogram({
    ...base('request_duration_seconds', 'time from a complete request to its reply, by command', ['command']),
    buckets: REQUEST_BUCKETS,
  });
  const plugin = new Histogram({
    ...base('cni_plugin_duration_seconds', 'CNI plugin run time, by plugin, CNI command and result (ok or error)', [
      'plugin',
      'command',
      'result',
    ]),
    buckets: PLUGIN_BUCKETS,
  });
  return { requests, duration, plugin };
}

/** DHCP datagrams and leases; known label values start at 0 so a rate() sees the first increment. */
function dhcpMetrics(base: Base) {
  const dhcp = new Counter(
    base(
      'dhcp_packets_total',
      'DHCP datagrams by direction (received, sent) and message type (received: discover, request, inform, release, ' +
        'decline, malformed, ignored; sent: offer, ack, nak)',
      ['direction', 'type'],
    ),
  );
  const leases = new Counter(
    base('dhcp_leases_served_total', 'DHCP ACKs that granted a pod its lease (answers to REQUEST)'),
  );
  for (const type of ['discover', 'request']) dhcp.inc({ direction: 'received', type }, 0);
  for (const type of ['offer', 'ack', 'nak']) dhcp.inc({ direction: 'sent', type }, 0);
  leases.inc(0);
  return { dhcp, leases };
}

/** The pods by phase, the restore at start, and the build. */
function lifecycleMetrics(base: Base, podsByState: () => Record<string, number>) {
  new Gauge({
    ...base('pods', 'pod networks by state record phase (adding, ready, releasing, corrupt)', ['state']),
    collect() {
      this.reset();
      const counts = { adding: 0, ready: 0, releasing: 0, ...podsByState() };
      for (const [state, n] of Object.entries(counts)) this.set({ state }, n);
    },
  });
  const restore = new Histogram({
    ...base('restore_duration_seconds', 'time to restore the pods recorded in the state dir at start-up'),
    buckets: RESTORE_BUCKETS,
  });
  const restoredAt = new Gauge(base('restored', '1 once the pods recorded in the state dir are restored, 0 before'));
  restoredAt.set(0);
  // the usual build_info: 1, the version in a label (joins with other series by instance)
  new Gauge(
    base('build_info', 'the running tapmanager build: always 1, its package version in the label', ['version']),
  ).set({ version: packageVersion() }, 1);
  return { restore, restoredAt };
}

/** CNI STATUS answers and the pod checks' failures. */
function cniUpkeepMetrics(base: Base) {
  const cniStatus = new Gauge(
    base(
      'cni_status',
      'the last CNI STATUS answer of each plugin of a cniVersion 1.1.0+ network: 0 ok, else the CNI error code (50: ' +
        'cannot take adds, 51: and attachments may be degraded)',
      ['network', 'plugin'],
    ),
  );
  const checkFailures = new Counter(
    base(
      'pod_check_failures_total',
      'pod checks that failed, by reason (docs/operations.md says what to do for each)',
      ['reason'],
    ),
  );
  for (const reason of Object.values(CheckReason)) checkFailures.inc({ reason }, 0);
  return { cniStatus, checkFailures };
}

export function createMetrics(podsByState: () => Record<string, number>, fastGets: () => number = () => 0): Metrics {
  const registry = new Registry();
  // prom-client's process and Node.js metrics under their standard names (process_*, nodejs_*): the names every
  // dashboard and alert written for prom-client expects; only our own metrics carry PREFIX
  collectDefaultMetrics({ register: registry });
  /** what every metric has: its prefixed name, its help, its labels, this registry */
  const base: Base = (name, help, labelNames = []) => ({
    name: `${PREFIX}${name}`,
    help,
    labelNames,
    registers: [registry],
  });
  const { requests, duration, plugin } = requestMetrics(base);
  const { dhcp, leases } = dhcpMetrics(base);
  const { restore, restoredAt } = lifecycleMetrics(base, podsByState);
  const { cniStatus, checkFailures } = cniUpkeepMetrics(base);
  let fastCounted = 0;

  return {
    registry,
    hooks: {
      onRequest(command, result, seconds) {
        requests.inc({ command, result });
        duration.observe({ command }, seconds);
      },
      onDhcpPacket(direction, type) {
        dhcp.inc({ direction, type });
      },
      onDhcpLease() {
        leases.inc();
      },
      onRestored(seconds) {
        restore.observe(seconds);
        restoredAt.set(1);
      },
      onCheckFailure(reason) {
        checkFailures.inc({ reason });
      },
    },
    onCniStatus(network, statuses) {
      // a plugin taken out of the list leaves no stale series
      cniStatus.reset();
      for (const s of statuses) cniStatus.set({ network, plugin: s.plugin }, s.code);
    },
    timedExec: (inner) => timedExec(plugin, inner),
    async render() {
      const answered = fastGets();
      if (answered > fastCounted) requests.inc({ command: 'get', result: 'ok' }, answered - fastCounted);
      fastCounted = answered;
      return { contentType: registry.contentType, body: await registry.metrics() };
    },
  };
}

/** A CNI PluginExec whose every plugin run is observed in `plugin` by plugin, command and result. */
function timedExec(plugin: Histogram<'plugin' | 'command' | 'result'>, inner: PluginExec): PluginExec {
  return {
    ...(inner.findInPath ? { findInPath: inner.findInPath.bind(inner) } : {}),
    async run(opts) {
      const labels = { plugin: basename(opts.pluginPath), command: (opts.env.CNI_COMMAND ?? 'unknown').toLowerCase() };
      const t0 = performance.now();
      try {
        const out = await inner.run(opts);
        plugin.observe({ ...labels, result: 'ok' }, (performance.now() - t0) / 1000);
        return out;
      } catch (e) {
        plugin.observe({ ...labels, result: 'error' }, (performance.now() - t0) / 1000);
        throw e;
      }
    },
  };
}
