// `tapctl devices`: the DeviceReport as people and scripts read it. Pure.
import type { CollectedDevices } from './collect.js';

/**
 * An env file: K=V lines (blank lines and # comments skipped, an optional "export ", values optionally quoted), or
 * NUL-separated like /proc/<pid>/environ, so the environment of a running emulator can be read as it is.
 */
export function parseEnvFile(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  const nul = text.includes('\0');
  for (const raw of text.split(nul ? '\0' : '\n')) {
    const line = nul ? raw : raw.trim();
    if (line === '' || (!nul && line.startsWith('#'))) continue;
    const l = !nul && line.startsWith('export ') ? line.slice(7).trimStart() : line;
    const eq = l.indexOf('=');
    if (eq <= 0) continue;
    let v = l.slice(eq + 1);
    if (!nul && v.length >= 2 && ((v.startsWith("'") && v.endsWith("'")) || (v.startsWith('"') && v.endsWith('"'))))
      v = v.slice(1, -1);
    out[l.slice(0, eq)] = v;
  }
  return out;
}

export interface DeviceReportJson {
  devices: { address: string; sysfsdev?: string; group?: string; driver?: string; source: string }[];
  qemuArgs: string[];
  refused: string[];
  inputErrors: string[];
  skipped: string[];
  podResourcesVia?: 'Get' | 'List';
}

export function deviceReportJson(r: CollectedDevices, qemuArgs: string[]): DeviceReportJson {
  return {
    devices: r.devices.map((d) => ({ ...d })),
    qemuArgs,
    refused: r.problems,
    inputErrors: r.inputErrors,
    skipped: r.skipped,
    ...(r.podResourcesVia !== undefined ? { podResourcesVia: r.podResourcesVia } : {}),
  };
}

/** A table of the functions, then the qemu arguments, then every refusal, input error and skipped resource. */
export function formatDeviceReport(j: DeviceReportJson): string {
  const rows = [
    ['FUNCTION', 'GROUP', 'DRIVER', 'SOURCE'],
    ...j.devices.map((d) => [d.sysfsdev ?? d.address, d.group ?? '-', d.driver ?? '-', d.source]),
  ];
  const w = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  const lines =
    j.devices.length === 0
      ? ['no VFIO devices']
      : rows.map((r) => r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(w[i]!))).join('  '));
  if (j.qemuArgs.length > 0) {
    lines.push('', 'qemu arguments:');
    for (let i = 0; i < j.qemuArgs.length; i += 2) lines.push(`  ${j.qemuArgs.slice(i, i + 2).join(' ')}`);
  }
  if (j.podResourcesVia !== undefined) lines.push('', `kubelet PodResources answered with ${j.podResourcesVia}`);
  const section = (title: string, xs: string[]) => {
    if (xs.length > 0) lines.push('', `${title}:`, ...xs.map((x) => `  - ${x}`));
  };
  section('input errors', j.inputErrors);
  section('refused', j.refused);
  section('skipped', j.skipped);
  return lines.join('\n');
}
