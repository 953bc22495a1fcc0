// `tapctl list`'s table (pure): one row per pod network, columns an operator reads at a glance.
import type { PodSummary } from '../protocol/status.js';

/** "45s", "12m", "3h", "5d": kubectl's habit of one unit, rounded down. */
export function shortAge(ms: number): string {
  if (!Number.isFinite(ms) || ms < 0) return '-';
  const s = Math.floor(ms / 1000);
  if (s < 120) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 120) return `${m}m`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h}h`;
  return `${Math.floor(h / 24)}d`;
}

function age(iso: string | null, now: number): string {
  if (!iso) return '-';
  const t = Date.parse(iso);
  return Number.isNaN(t) ? '-' : shortAge(now - t);
}

const HEADERS = ['KEY', 'POD', 'NAMESPACE', 'IPS', 'MAC', 'STATE', 'AGE', 'LAST LEASE'] as const;

export function podTable(pods: PodSummary[], now = Date.now()): string {
  const rows = pods.map((p) => [
    p.key,
    p.podName || '-',
    p.podNs || '-',
    p.interfaces
      .map((i) => i.ip)
      .filter(Boolean)
      .join(',') || '-',
    p.interfaces.map((i) => i.mac).join(',') || '-',
    p.state,
    age(p.createdAt, now),
    p.lastLease ? `${age(p.lastLease, now)} ago` : '-',
  ]);
  const all = [[...HEADERS], ...rows];
  const widths = HEADERS.map((_, c) => Math.max(...all.map((r) => r[c]!.length)));
  return all.map((r) => r.map((v, c) => (c === r.length - 1 ? v : v.padEnd(widths[c]!))).join('   ')).join('\n');
}
