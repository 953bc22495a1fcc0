// The pods' checks over time (tapctl check, --check-interval): the last failing check of each pod, which `tapctl
// list` shows as "degraded" (with the reasons in --json) until a later check passes. A failure is logged with the pod
// and the reasons, and counted per reason (vmpod_pod_check_failures_total). Nothing is repaired.
import { lazyChild, type Logger } from '../log.js';
import type { PodCheck } from '../podnet/index.js';

export interface PodCheckerDeps {
  /** one pod's check, in its key's queue */
  check(key: string): Promise<PodCheck>;
  /** the ready pods, checked on the interval */
  readyKeys(): string[];
  log: Logger;
  /** each failing check, once per reason it found */
  onFailure?: (reason: string) => void;
}

export class PodChecker {
  private readonly failing = new Map<string, PodCheck>();
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<void> | undefined;

  constructor(private readonly d: PodCheckerDeps) {}

  /** Checks one pod now; its failures are kept (degraded) or cleared (passed). */
  async checkOne(key: string): Promise<PodCheck> {
    const r = await this.d.check(key);
    const log = lazyChild(this.d.log, { key, op: 'check' });
    if (r.ok) {
      if (this.failing.delete(key)) log.info({ cni: r.cni }, 'pod check passes again: no longer degraded');
      else log.debug({ cni: r.cni }, 'pod check passed');
      return r;
    }
    this.failing.set(key, r);
    for (const reason of new Set(r.failures.map((f) => f.reason))) this.d.onFailure?.(reason);
    log.error(
      { reasons: r.failures.map((f) => f.reason), failures: r.failures, cni: r.cni },
      'pod check failed: degraded (nothing is repaired)',
    );
    return r;
  }

  /** The pod's last check, when it failed. */
  degraded(key: string): PodCheck | undefined {
    return this.failing.get(key);
  }

  /** A released pod: its failures go with it. */
  forget(key: string): void {
    this.failing.delete(key);
  }

  /** Every ready pod, one after another; a check that cannot run is logged and the next one goes. */
  checkAll(): Promise<void> {
    // cleared in a callback, never inside the run: a run with no pod ends before `running` would be set
    this.running ??= this.runAll().finally(() => {
      this.running = undefined;
    });
    return this.running;
  }

  private async runAll(): Promise<void> {
    for (const key of this.d.readyKeys()) {
      await this.checkOne(key).catch((e: unknown) =>
        this.d.log.warn({ key, op: 'check', err: e }, 'pod check could not run'),
      );
    }
  }

  /** Every intervalMs (0: never), from intervalMs after now. */
  start(intervalMs: number): void {
    if (intervalMs === 0) return;
    this.timer = setInterval(() => void this.checkAll(), intervalMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }
}
