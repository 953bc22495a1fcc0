// The resources file: a list of resources (or an object whose `resources` is that list), YAML or JSON. Each resource
// names the PCI functions it advertises by selectors and says what one kubelet device is: a function or an IOMMU
// group. parseResources is pure and reports every problem, each on one line naming the entry.
import { readFileSync } from 'node:fs';
import { parsePciAddress, parseQualifiedName } from '../devices/index.js';
import { isObj } from '../guards.js';

export const Unit = { Function: 'function', Group: 'group' } as const;
export type Unit = (typeof Unit)[keyof typeof Unit];

export interface ResourceConfig {
  /** vendor-domain/name, as kubelet registers it */
  resourceName: string;
  /** PCI vendor IDs, 4 hex digits, lower case, no 0x */
  vendors: string[];
  /** PCI device IDs, same form */
  devices: string[];
  drivers: string[];
  /** full addresses, lower case */
  pciAddresses: string[];
  unit: Unit;
}

const FIELDS = new Set(['resourceName', 'vendors', 'devices', 'drivers', 'pciAddresses', 'unit']);
// kubelet's extended resource name: a DNS subdomain, "/", then a name part (alphanumerics, '-', '_', '.'; at most 63)
const DOMAIN_RE = /^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const NAME_RE = /^(?=.{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;
const PCI_ID_RE = /^(0x)?[0-9a-f]{4}$/i;
const DRIVER_RE = /^[A-Za-z0-9_.-]{1,64}$/;

/** One line per problem: "resources[i] (name): what is wrong". */
export function parseResources(
  doc: unknown,
  opts: { cdi: boolean },
): { resources: ResourceConfig[]; problems: string[] } {
  const problems: string[] = [];
  const list = Array.isArray(doc) ? doc : isObj(doc) && Array.isArray(doc['resources']) ? doc['resources'] : undefined;
  if (list === undefined)
    return { resources: [], problems: ['is not a list of resources (nor an object whose "resources" is one)'] };
  if (list.length === 0) return { resources: [], problems: ['names no resource'] };
  const resources: ResourceConfig[] = [];
  const seen = new Set<string>();
  list.forEach((e: unknown, i) => {
    const name = isObj(e) && typeof e['resourceName'] === 'string' ? e['resourceName'] : undefined;
    const where = `resources[${i}]${name !== undefined ? ` (${name})` : ''}`;
    const bad = (why: string) => problems.push(`${where}: ${why}`);
    if (!isObj(e)) return bad('is not an object');
    for (const k of Object.keys(e))
      if (!FIELDS.has(k)) bad(`unknown field ${JSON.stringify(k)} (known: ${[...FIELDS].join(', ')})`);
    if (name === undefined) bad('resourceName is missing (vendor-domain/name, e.g. vendor.example/qat)');
    else {
      const [domain, part, extra] = name.split('/');
      if (extra !== undefined || part === undefined || !DOMAIN_RE.test(domain!) || !NAME_RE.test(part))
        bad(
          `resourceName ${JSON.stringify(name)} is not vendor-domain/name (a DNS subdomain, "/", then at most 63 of ` +
            `A-Za-z0-9-_.)`,
        );
      else if (opts.cdi && parseQualifiedName(`${name}=x`) === undefined)
        bad(
          `resourceName ${JSON.stringify(name)} is not a CDI kind (vendor and class must start with a letter): ` +
            `rename it, or turn CDI off (--cdi-dir "")`,
        );
      if (seen.has(name)) bad(`resourceName ${JSON.stringify(name)} is named twice`);
      seen.add(name);
    }
    const strings = (key: string, check: (s: string) => string | undefined): string[] => {
      const v = e[key];
      if (v === undefined) return [];
      if (!Array.isArray(v)) {
        bad(`${key} is not a list`);
        return [];
      }
      const out: string[] = [];
      for (const s of v) {
        const ok = typeof s === 'string' ? check(s) : undefined;
        if (ok === undefined) bad(`${key}: ${JSON.stringify(s)} is ${KEY_WANTS[key]}`);
        else out.push(ok);
      }
      return out;
    };
    const pciId = (s: string) => (PCI_ID_RE.test(s) ? s.toLowerCase().replace(/^0x/, '') : undefined);
    const address = (s: string) => {
      try {
        return parsePciAddress(s);
      } catch {
        return undefined;
      }
    };
    const r: ResourceConfig = {
      resourceName: name ?? '',
      vendors: strings('vendors', pciId),
      devices: strings('devices', pciId),
      drivers: strings('drivers', (s) => (DRIVER_RE.test(s) ? s : undefined)),
      pciAddresses: strings('pciAddresses', address),
      unit: Unit.Function,
    };
    const unit = e['unit'];
    if (unit === Unit.Group || unit === Unit.Function) r.unit = unit;
    else if (unit !== undefined) bad(`unit ${JSON.stringify(unit)} is not "function" or "group"`);
    if (['vendors', 'devices', 'drivers', 'pciAddresses'].every((k) => e[k] === undefined))
      bad(
        'has no selector: give vendors, devices, drivers or pciAddresses (without one it would take every PCI ' +
          'function of the node)',
      );
    resources.push(r);
  });
  return { resources, problems };
}

const KEY_WANTS: Record<string, string> = {
  vendors: 'not a PCI vendor ID (4 hex digits, e.g. "8086")',
  devices: 'not a PCI device ID (4 hex digits, e.g. "4941")',
  drivers: 'not a driver name',
  pciAddresses: 'not a PCI address (0000:3b:02.1 or 3b:02.1)',
};

/**
 * Reads and checks the file: .json with JSON.parse, anything else as YAML (a superset of JSON). Every problem is
 * one line that starts with the file's path.
 */
export async function loadResources(
  file: string,
  opts: { cdi: boolean },
): Promise<{ resources: ResourceConfig[]; problems: string[] }> {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (e) {
    return {
      resources: [],
      problems: [`config ${file}: cannot read it (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`],
    };
  }
  let doc: unknown;
  try {
    doc = file.endsWith('.json') ? JSON.parse(text) : (await import('yaml')).parse(text);
  } catch (e) {
    return { resources: [], problems: [`config ${file}: does not parse: ${(e as Error).message.split('\n')[0]}`] };
  }
  const r = parseResources(doc, opts);
  return { resources: r.resources, problems: r.problems.map((p) => `config ${file}: ${p}`) };
}
