// JSON logs (pino) on stderr. Every request line carries key, op and durationMs (the daemon adds them).
import { pino, type Logger, type LevelWithSilent } from 'pino';

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
