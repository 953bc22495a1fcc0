// CNI GC of tapmanager's network: after the restore at start, every --cni-gc-interval, and on `tapctl gc`. It holds the
// OpLock alone, so no add or release of any pod runs meanwhile, and the live attachments it names are read inside it.
// Stale attachments (a cache record of tapmanager's ifName whose container id has no pod in the state dir and no pod
// netns) get a DEL with the config their record holds; the plugins get GC only with --cni-gc plugins (on a Kubernetes
// node the conflist is shared with the container runtime, whose pods such a GC would not name).
import type { Logger } from '../log.js';
import type { GcAttachment, GcOptions, GcReport, NetworkConfigList } from '../cni/index.js';
import type { OpLock } from './oplock.js';

export interface GcDeps {
  gc(list: NetworkConfigList, valid: readonly GcAttachment[], opts: GcOptions): Promise<GcReport>;
  loadConfList(): Promise<NetworkConfigList>;
  /** the pods in tapmanager's state (every record, whatever its phase) */
  liveKeys(): string[];
  /** a pod netns exists for this key: a pod whose record was lost (recover re-attaches it, release DELs it) */
  netnsExists(key: string): boolean;
  /** CNI_IFNAME of tapmanager's attachments */
  ifName: string;
  /** --cni-gc plugins */
  plugins: boolean;
  lock: OpLock;
  log: Logger;
}

/** One GC, alone (OpLock); logs what it removed and every error, and returns the report. */
export function runGc(d: GcDeps): Promise<GcReport> {
  return d.lock.runExclusive(async () => {
    const list = await d.loadConfList();
    const valid = d.liveKeys().map((containerId) => ({ containerId, ifName: d.ifName }));
    const report = await d.gc(list, valid, {
      plugins: d.plugins,
      ifNames: [d.ifName],
      stillHeld: (a) => d.netnsExists(a.containerId),
    });
    const log = d.log.child({ op: 'gc', network: report.network });
    if (report.disabled) log.info('CNI GC: the network config has disableGC: nothing done');
    else
      log[report.removed.length > 0 ? 'info' : 'debug'](
        { removed: report.removed, pluginsAsked: report.pluginsAsked, live: valid.length },
        'CNI GC done',
      );
    for (const error of report.errors) log.error({ error }, 'CNI GC: a part failed');
    return report;
  });
}

/** Runs `once` now and then every intervalMs (0: never, not even now); a failure is logged and the next one comes. */
export function scheduleGc(once: () => Promise<unknown>, intervalMs: number, log: Logger): { stop(): void } {
  if (intervalMs === 0) return { stop() {} };
  const tick = (): void => void once().catch((e: unknown) => log.error({ op: 'gc', err: e }, 'CNI GC failed'));
  tick();
  const timer = setInterval(tick, intervalMs);
  timer.unref();
  return { stop: () => clearInterval(timer) };
}
