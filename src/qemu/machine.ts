// Facts about libvirt's part of the argv: machine type and the PCIe chassis/port numbers already in use.
import { optionPairs, parseQemuOptValue } from './ids.js';

/** -machine pc-q35-7.2 | q35 | type=q35,... | {"type":"pc-q35-7.2",...}; also -M. */
export function isQ35(argv: readonly string[]): boolean {
  for (const [opt, val] of optionPairs(argv)) {
    if (opt !== '-machine' && opt !== '-M') continue;
    const rec = parseQemuOptValue(val);
    const type = rec?.['type'] ?? rec?.[''];
    if (typeof type === 'string' && (type === 'q35' || type.startsWith('pc-q35-'))) return true;
  }
  return false;
}

function num(v: unknown): number | undefined {
  if (typeof v === 'number' && Number.isInteger(v)) return v;
  if (typeof v === 'string' && /^(0x[0-9a-fA-F]+|\d+)$/.test(v)) return Number(v);
  return undefined;
}

/**
 * Chassis and port numbers of every PCIe port / PCI bridge in the argv (pcie-root-port, ioh3420, xio3130-downstream,
 * pcie-downstream-port use chassis=; pci-bridge uses chassis_nr=), in both key=value and JSON form.
 */
export function usedPcieNumbers(argv: readonly string[]): { chassis: Set<number>; ports: Set<number> } {
  const chassis = new Set<number>();
  const ports = new Set<number>();
  for (const [opt, val] of optionPairs(argv)) {
    if (opt !== '-device') continue;
    const rec = parseQemuOptValue(val);
    if (rec === undefined) continue;
    for (const k of ['chassis', 'chassis_nr']) {
      const c = num(rec[k]);
      if (c !== undefined) chassis.add(c);
    }
    const p = num(rec['port']);
    if (p !== undefined) ports.add(p);
  }
  return { chassis, ports };
}
