// vmwrapper's one log line, written by hand (it runs on every VM start: no logger library). The same shape as the
// daemon's pino lines (level 30 = info, ISO time, pid, name, msg), so one log pipeline reads both.
export function logLine(fields: Record<string, unknown>, msg: string, pid: number, now: Date): string {
  return `${JSON.stringify({ level: 30, time: now.toISOString(), pid, name: 'vmwrapper', ...fields, msg })}\n`;
}
