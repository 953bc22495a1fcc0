// CNI STATUS (1.1.0) of the node's network, kept fresh: at start, on --cni-status-interval, and before an add when
// the last answer is older than that (or the config changed since). A plugin answering an error (50: cannot take
// adds, 51: and existing attachments may be degraded; a hang killed at the timeout counts as 50) makes tapmanager
// not ready and refuses adds at once with the plugin and its message, without running the chain. Releases, gets
// and recovers are not gated. A list below 1.1.0 is never asked.
import { ErrorCode, VmpodError } from '../errors.js';
import type { Logger } from '../log.js';
import type { NetworkConfigList, PluginStatus } from '../cni/index.js';

export interface CniStatusDeps {
  status(list: NetworkConfigList): Promise<PluginStatus[]>;
  loadConfList(): Promise<NetworkConfigList>;
  intervalMs: number;
  log: Logger;
  /** each answer of each plugin (the vmpod_cni_status gauge) */
  onStatus?: (network: string, statuses: PluginStatus[]) => void;
}

interface Answer {
  at: number;
  list: NetworkConfigList;
  statuses: PluginStatus[];
}

export class CniStatusMonitor {
  private last: Answer | undefined;
  private asking: Promise<Answer> | undefined;
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly d: CniStatusDeps) {}

  /** Asks now (one question at a time: a caller during a run gets its answer); the plugins' answers. */
  async refresh(): Promise<PluginStatus[]> {
    return (await this.ask()).statuses;
  }

  /**
   * Before an add: throws, naming the plugin and its message, when the network cannot take adds. Returns the network
   * it admitted, which the add then runs against (the config is read once per add), or undefined when the config
   * cannot be read (the add fails on it with its own error).
   */
  async admitAdd(): Promise<NetworkConfigList | undefined> {
    let list: NetworkConfigList;
    try {
      list = await this.d.loadConfList();
    } catch {
      return undefined;
    }
    const a =
      this.last !== undefined && this.last.list === list && Date.now() - this.last.at < this.d.intervalMs
        ? this.last
        : await this.ask();
    const bad = a.statuses.find((s) => s.code !== 0);
    if (bad)
      throw new VmpodError(
        ErrorCode.Cni,
        `add refused: ${describe(a.list.name, bad)}; the network cannot take adds now`,
        { op: 'add' },
      );
    return list;
  }

  /** For /readyz and status: one sentence per plugin that answered an error at the last STATUS. */
  reasons(): string[] {
    const a = this.last;
    return a === undefined ? [] : a.statuses.filter((s) => s.code !== 0).map((s) => describe(a.list.name, s));
  }

  /** At start: asks now, then every intervalMs. */
  start(): void {
    const tick = (): void =>
      void this.ask().catch((e: unknown) => this.d.log.warn({ err: e }, 'CNI STATUS could not be asked'));
    tick();
    this.timer = setInterval(tick, this.d.intervalMs);
    this.timer.unref();
  }

  stop(): void {
    clearInterval(this.timer);
  }

  private ask(): Promise<Answer> {
    // cleared in a callback, never inside the run (see PodChecker.checkAll)
    this.asking ??= this.askNow().finally(() => {
      this.asking = undefined;
    });
    return this.asking;
  }

  private async askNow(): Promise<Answer> {
    const list = await this.d.loadConfList();
    const statuses = await this.d.status(list);
    const before = this.reasons();
    this.last = { at: Date.now(), list, statuses };
    this.d.onStatus?.(list.name, statuses);
    const now = this.reasons();
    if (now.join('\n') !== before.join('\n'))
      this.d.log[now.length > 0 ? 'error' : 'info'](
        { network: list.name, statuses },
        now.length > 0 ? 'CNI STATUS: the network cannot take adds' : 'CNI STATUS: the network takes adds',
      );
    return this.last;
  }
}

function describe(network: string, s: PluginStatus): string {
  const what = s.code === 51 ? 'cannot take adds, and existing attachments may be degraded' : 'cannot take adds';
  return `CNI plugin ${s.plugin} of network ${network} answers STATUS with error ${s.code} (${what}): ${s.msg}`;
}
