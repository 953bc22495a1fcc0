// The daemon's CNI upkeep, wired once: STATUS kept fresh and gating adds (cni-status.ts), GC on `tapctl gc` and on
// --cni-gc-interval once the restore is done (gc.ts), the pods' checks on --check-interval (checks.ts).
import type { Logger } from '../log.js';
import type { CniClient, NetworkConfigList, PluginStatus } from '../cni/index.js';
import type { PodNetwork } from '../podnet/index.js';
import type { TapmanagerConfig } from './config.js';
import type { TapmanagerService } from './service.js';
import { CniStatusMonitor } from './cni-status.js';
import { runGc, scheduleGc } from './gc.js';

export interface CniUpkeepDeps {
  cni: CniClient;
  loadConfList(): Promise<NetworkConfigList>;
  pods: PodNetwork;
  service: TapmanagerService;
  config: Pick<TapmanagerConfig, 'cniStatusIntervalMs' | 'cniGcIntervalMs' | 'cniGcPlugins' | 'checkIntervalMs'>;
  log: Logger;
  onStatus?: (network: string, statuses: PluginStatus[]) => void;
}

export interface CniUpkeep {
  /** readiness: one sentence per plugin that answers STATUS with an error */
  reasons(): string[];
  /** STATUS now and on its interval; GC and checks once `restored` settles */
  start(restored: Promise<unknown>): void;
  stop(): void;
}

/** Sets the service's admitAdd and gc hooks; nothing runs until start. */
export function cniUpkeep(d: CniUpkeepDeps): CniUpkeep {
  const status = new CniStatusMonitor({
    status: (l) => d.cni.status(l),
    loadConfList: d.loadConfList,
    intervalMs: d.config.cniStatusIntervalMs,
    log: d.log,
    ...(d.onStatus ? { onStatus: d.onStatus } : {}),
  });
  let restored: Promise<unknown> = Promise.resolve();
  let stopped = false;
  let gcTimer: { stop(): void } | undefined;
  // a GC must know every pod the state dir holds: it waits for the restore
  const gcOnce = () =>
    restored.then(() =>
      runGc({
        gc: (l, v, o) => d.cni.gc(l, v, o),
        loadConfList: d.loadConfList,
        liveKeys: () => d.pods.keys(),
        netnsExists: (key) => d.pods.netnsExists(key),
        ifName: d.pods.cniIfName,
        plugins: d.config.cniGcPlugins,
        lock: d.service.ops,
        log: d.log,
      }),
    );
  d.service.hooks.admitAdd = () => status.admitAdd();
  d.service.hooks.gc = gcOnce;
  return {
    reasons: () => status.reasons(),
    start(r) {
      restored = r;
      status.start();
      void r.then(() => {
        if (stopped) return;
        gcTimer = scheduleGc(gcOnce, d.config.cniGcIntervalMs, d.log);
        d.service.checks.start(d.config.checkIntervalMs);
      });
    },
    stop() {
      stopped = true;
      status.stop();
      gcTimer?.stop();
      d.service.checks.stop();
    },
  };
}
