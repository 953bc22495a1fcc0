// systemd's notify protocol (sd_notify(3)): READY=1 once tapmanager listens and has restored, STOPPING=1 on SIGTERM,
// WATCHDOG=1 every WATCHDOG_USEC/2 while the event loop turns. One datagram each to $NOTIFY_SOCKET, sent by the
// addon (docs/decisions.md says why not unix-dgram). Without NOTIFY_SOCKET every call does nothing.
import { native } from '../native.js';
import type { Logger } from '../log.js';

export interface NotifyConfig {
  socket?: string;
  /** watchdog ping interval in ms (half of WATCHDOG_USEC), when systemd asked for one for this PID */
  watchdogMs?: number;
}

/** Pure: what the environment asks for. WATCHDOG_PID, when set, must be our PID (sd_watchdog_enabled). */
export function notifyConfig(env: Record<string, string | undefined>, pid = process.pid): NotifyConfig {
  const socket = env.NOTIFY_SOCKET || undefined;
  const usec = Number(env.WATCHDOG_USEC ?? '');
  const forUs = env.WATCHDOG_PID === undefined || env.WATCHDOG_PID === '' || Number(env.WATCHDOG_PID) === pid;
  const watchdogMs =
    socket && Number.isSafeInteger(usec) && usec > 0 && forUs ? Math.max(1, Math.floor(usec / 2000)) : undefined;
  return { ...(socket ? { socket } : {}), ...(watchdogMs ? { watchdogMs } : {}) };
}

export class SystemdNotifier {
  private timer: NodeJS.Timeout | undefined;

  constructor(
    private readonly cfg: NotifyConfig,
    private readonly log: Logger,
    private readonly send: (path: string, data: Buffer) => unknown = (p, d) => native().notifyDatagram(p, d),
  ) {}

  get enabled(): boolean {
    return this.cfg.socket !== undefined;
  }

  /** Sends "KEY=VALUE" lines; a failure is logged, never thrown (systemd may have gone away). */
  notify(...lines: string[]): void {
    if (!this.cfg.socket) return;
    try {
      this.send(this.cfg.socket, Buffer.from(lines.join('\n')));
    } catch (e) {
      this.log.warn({ err: e, socket: this.cfg.socket, message: lines }, 'sd_notify failed');
    }
  }

  ready(status: string): void {
    this.notify('READY=1', `STATUS=${status}`, `MAINPID=${process.pid}`);
    if (this.cfg.watchdogMs && !this.timer) {
      this.timer = setInterval(() => this.notify('WATCHDOG=1'), this.cfg.watchdogMs);
      this.timer.unref();
    }
  }

  stopping(status: string): void {
    this.notify('STOPPING=1', `STATUS=${status}`);
  }

  /** Stops the watchdog pings (at exit). */
  close(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }
}
