// JSON logs (pino) on stderr. Every request line carries key, op and durationMs (the daemon adds them).
import { pino, type Bindings, type Logger, type LevelWithSilent } from 'pino';

export type { Logger };

export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;

export function isLogLevel(s: string): s is LevelWithSilent {
  return (LOG_LEVELS as readonly string[]).includes(s);
}

/** A logger writing synchronously to fd 2, so nothing is lost before an exit or an execve. */
export function createLogger(name: string, level: LevelWithSilent = 'info'): Logger {
  return pino(
    { name, level, base: { pid: process.pid }, timestamp: pino.stdTimeFunctions.isoTime },
    pino.destination({ dest: 2, sync: true }),
  );
}

/** A logger that drops everything (tests, library use). */
export function silentLogger(): Logger {
  return pino({ level: 'silent' });
}

const LINE_METHODS: ReadonlySet<PropertyKey> = new Set(['fatal', 'error', 'warn', 'info', 'debug', 'trace']);

/** each lazy child's way to its real logger (a lazy child of a lazy child makes both) */
const realOf = new WeakMap<Logger, () => Logger>();

/**
 * A child of `parent` made only when it first writes a line (or is asked for anything else). pino's child()
 * serializes its bindings at once, and most loggers made per pod (a restore's, an add's, a DHCP server's) write no
 * line at the daemon's level: a restore of 500 pods made 1,500 of them. A line below the level is dropped without
 * making the child; a child of this one is lazy too.
 */
export function lazyChild(parent: Logger, bindings: Bindings): Logger {
  let made: Logger | undefined;
  const real = (): Logger => (made ??= (realOf.get(parent)?.() ?? parent).child(bindings));
  // what the proxy hands out, made once each: the line methods before the child exists, then the child's own members
  const lazy = new Map<PropertyKey, unknown>();
  const bound = new Map<PropertyKey, unknown>();
  const fromChild = (prop: PropertyKey): unknown => {
    const child = real();
    const v: unknown = Reflect.get(child, prop, child);
    if (typeof v !== 'function') return v;
    let f = bound.get(prop);
    if (f === undefined) bound.set(prop, (f = (v as (...a: unknown[]) => unknown).bind(child)));
    return f;
  };
  const self: Logger = new Proxy({} as Logger, {
    get(_, prop) {
      if (made !== undefined) return fromChild(prop);
      if (prop === 'child') return (b: Bindings) => lazyChild(self, b);
      if (prop === 'isLevelEnabled') return (level: string) => parent.isLevelEnabled(level);
      if (!LINE_METHODS.has(prop)) return fromChild(prop);
      let m = lazy.get(prop);
      if (m === undefined) {
        const level = prop as 'info';
        m = (...args: Parameters<Logger['info']>) => {
          if (made !== undefined || parent.isLevelEnabled(level)) real()[level](...args);
        };
        lazy.set(prop, m);
      }
      return m;
    },
  });
  realOf.set(self, real);
  return self;
}
