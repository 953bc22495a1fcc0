// Input: CDI device names (VMPOD_CDI_DEVICES, or a DRA claim's cdi_devices from PodResources), resolved through the
// CDI spec files to their /dev/vfio/<N> device nodes (docs/devices.md, CDI). Reads the spec dirs; no sysfs.
//
// Spec dirs are read in order (default /etc/cdi then /var/run/cdi); a device in a later dir replaces the same name
// from an earlier one; the same name in two files of one dir is a conflict. Only *.json and *.yaml files, no
// subdirectories. A file that does not parse or validate is reported with its path.
import { readFileSync, readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { isObj } from '../guards.js';
import { isPciAddress } from './pci.js';
import type { DeviceRequest } from './records.js';

export const CDI_DEVICES_ENV = 'VMPOD_CDI_DEVICES';
export const CDI_SPEC_DIRS_ENV = 'VMPOD_CDI_SPEC_DIRS';
export const DEFAULT_CDI_SPEC_DIRS = ['/etc/cdi', '/var/run/cdi'] as const;

export function cdiSpecDirs(env: Record<string, string | undefined>): string[] {
  const v = env[CDI_SPEC_DIRS_ENV];
  return v === undefined || v.trim() === '' ? [...DEFAULT_CDI_SPEC_DIRS] : v.split(':').filter((d) => d !== '');
}

const VENDOR_CLASS_RE = /^[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?$/;
const NAME_RE = /^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$/;
const GROUP_NODE_RE = /^\/dev\/vfio\/(noiommu-)?(\d+)$/;
const PCI_IN_TEXT_RE = /\b[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[01][0-9a-fA-F]\.[0-7]\b/g;

/** The CDI spec versions (the reference library reads 0.3.0 and later; a leading "v" is tolerated). */
const VERSIONS = ['0.3.0', '0.4.0', '0.5.0', '0.6.0', '0.7.0', '0.8.0', '1.0.0', '1.1.0'];

export interface QualifiedName {
  vendor: string;
  class: string;
  name: string;
  /** vendor/class */
  kind: string;
}

/** "vendor.com/class=name": split at the first "=", then the left part at the first "/". undefined when invalid. */
export function parseQualifiedName(s: string): QualifiedName | undefined {
  const eq = s.indexOf('=');
  if (eq < 0) return undefined;
  const left = s.slice(0, eq);
  const name = s.slice(eq + 1);
  const sl = left.indexOf('/');
  if (sl < 0) return undefined;
  const vendor = left.slice(0, sl);
  const cls = left.slice(sl + 1);
  if (!VENDOR_CLASS_RE.test(vendor) || !VENDOR_CLASS_RE.test(cls) || !NAME_RE.test(name)) return undefined;
  return { vendor, class: cls, name, kind: `${vendor}/${cls}` };
}

interface DeviceNode {
  path: string;
  hostPath?: string;
}
interface Edits {
  env?: string[];
  deviceNodes?: DeviceNode[];
}
interface SpecDevice {
  name: string;
  annotations?: Record<string, string>;
  containerEdits: Edits;
}
export interface CdiSpec {
  cdiVersion: string;
  kind: string;
  annotations?: Record<string, string>;
  devices: SpecDevice[];
  containerEdits?: Edits;
}

function cmpVersion(a: string, b: string): number {
  const pa = a.split('.').map(Number);
  const pb = b.split('.').map(Number);
  for (let i = 0; i < 3; i++) if (pa[i] !== pb[i]) return (pa[i] ?? 0) - (pb[i] ?? 0);
  return 0;
}

const TOP_FIELDS = new Set(['cdiVersion', 'kind', 'annotations', 'devices', 'containerEdits']);
const DEVICE_FIELDS = new Set(['name', 'annotations', 'containerEdits']);
const EDIT_FIELDS = new Set(['env', 'deviceNodes', 'mounts', 'hooks', 'intelRdt', 'additionalGids', 'netDevices']);
const NODE_FIELDS = new Set(['path', 'hostPath', 'type', 'major', 'minor', 'fileMode', 'permissions', 'uid', 'gid']);

/** Checks a parsed spec against the CDI spec (fields, names, the version its features need). Problems, or []. */
export function validateSpec(v: unknown): string[] {
  const p: string[] = [];
  if (!isObj(v)) return ['is not an object'];
  for (const k of Object.keys(v)) if (!TOP_FIELDS.has(k)) p.push(`unknown field ${JSON.stringify(k)}`);
  const rawVersion = v['cdiVersion'];
  const version = typeof rawVersion === 'string' ? rawVersion.replace(/^v/, '') : '';
  if (!VERSIONS.includes(version))
    p.push(`cdiVersion ${JSON.stringify(rawVersion)} is not one of ${VERSIONS.join(', ')}`);
  const needs = (min: string, what: string) => {
    if (version !== '' && VERSIONS.includes(version) && cmpVersion(version, min) < 0)
      p.push(`${what} needs cdiVersion ${min} or later (the file says ${version})`);
  };
  const kind = v['kind'];
  const kindParts = typeof kind === 'string' ? kind.split('/') : [];
  if (kindParts.length !== 2 || !VENDOR_CLASS_RE.test(kindParts[0]!) || !VENDOR_CLASS_RE.test(kindParts[1]!))
    p.push(`kind ${JSON.stringify(kind)} is not <vendor>/<class>`);
  else if (kindParts[1]!.includes('.')) needs('0.6.0', `a "." in the class (${JSON.stringify(kind)})`);
  if (v['annotations'] !== undefined) needs('0.6.0', 'annotations');
  const edits = (e: unknown, where: string, required: boolean) => {
    if (e === undefined) {
      if (required) p.push(`${where}: containerEdits is missing`);
      return;
    }
    if (!isObj(e)) {
      p.push(`${where}: containerEdits is not an object`);
      return;
    }
    if (required && Object.keys(e).length === 0) p.push(`${where}: containerEdits is empty`);
    for (const k of Object.keys(e))
      if (!EDIT_FIELDS.has(k)) p.push(`${where}: unknown containerEdits field ${JSON.stringify(k)}`);
    if (
      e['env'] !== undefined &&
      (!Array.isArray(e['env']) || !e['env'].every((x) => typeof x === 'string' && x.includes('=')))
    )
      p.push(`${where}: env is not a list of "K=V"`);
    if (e['intelRdt'] !== undefined) needs('0.7.0', 'intelRdt');
    if (e['additionalGids'] !== undefined) needs('0.7.0', 'additionalGids');
    if (e['netDevices'] !== undefined) needs('1.1.0', 'netDevices');
    const nodes = e['deviceNodes'];
    if (nodes === undefined) return;
    if (!Array.isArray(nodes)) {
      p.push(`${where}: deviceNodes is not a list`);
      return;
    }
    nodes.forEach((n: unknown, i) => {
      if (!isObj(n) || typeof n['path'] !== 'string' || n['path'] === '') {
        p.push(`${where}: deviceNodes[${i}] has no path`);
        return;
      }
      for (const k of Object.keys(n))
        if (!NODE_FIELDS.has(k)) p.push(`${where}: deviceNodes[${i}]: unknown field ${JSON.stringify(k)}`);
      if (n['hostPath'] !== undefined) {
        if (typeof n['hostPath'] !== 'string') p.push(`${where}: deviceNodes[${i}].hostPath is not a string`);
        needs('0.5.0', `${where}: deviceNodes[${i}].hostPath`);
      }
    });
  };
  edits(v['containerEdits'], 'containerEdits', false);
  const devices = v['devices'];
  if (!Array.isArray(devices) || devices.length === 0) p.push('devices is not a non-empty list');
  else {
    const names = new Set<string>();
    devices.forEach((d: unknown, i) => {
      if (!isObj(d) || typeof d['name'] !== 'string' || !NAME_RE.test(d['name'])) {
        p.push(`devices[${i}]: name ${JSON.stringify(isObj(d) ? d['name'] : d)} is not a valid device name`);
        return;
      }
      const where = `device ${JSON.stringify(d['name'])}`;
      for (const k of Object.keys(d)) if (!DEVICE_FIELDS.has(k)) p.push(`${where}: unknown field ${JSON.stringify(k)}`);
      if (names.has(d['name'])) p.push(`${where} is defined twice`);
      names.add(d['name']);
      if (/^\d/.test(d['name'])) needs('0.5.0', `${where} (a name that starts with a digit)`);
      if (d['annotations'] !== undefined) needs('0.6.0', `${where}: annotations`);
      edits(d['containerEdits'], where, true);
    });
  }
  return p;
}

/** Parses a spec file's text: JSON with JSON.parse, YAML with the yaml package (loaded only when a .yaml is read). */
export type YamlParse = (text: string) => unknown;

interface Entry {
  file: string;
  spec: CdiSpec;
  device: SpecDevice;
}

export interface CdiRegistry {
  dirs: string[];
  devices: Map<string, Entry>;
  /** qualified name -> the files of one dir that both define it */
  conflicts: Map<string, string[]>;
  /** files that did not parse or validate, with the kind they declare where readable */
  bad: { file: string; kind?: string; problem: string }[];
}

/** Reads every spec dir (a missing dir is empty). `parseYaml` is called for .yaml files only. */
export function loadCdiRegistry(dirs: readonly string[], parseYaml: YamlParse): CdiRegistry {
  const reg: CdiRegistry = { dirs: [...dirs], devices: new Map(), conflicts: new Map(), bad: [] };
  for (const dir of dirs) {
    let files: string[];
    try {
      files = readdirSync(dir)
        .filter((f) => f.endsWith('.json') || f.endsWith('.yaml'))
        .sort();
    } catch {
      continue;
    }
    const here = new Map<string, Entry>();
    const hereConflicts = new Map<string, string[]>();
    for (const f of files) {
      const file = join(dir, f);
      let v: unknown;
      try {
        if (!statSync(file).isFile()) continue;
        const text = readFileSync(file, 'utf8');
        v = f.endsWith('.json') ? JSON.parse(text) : parseYaml(text);
      } catch (e) {
        reg.bad.push({ file, problem: `does not parse: ${(e as Error).message.split('\n')[0]}` });
        continue;
      }
      const problems = validateSpec(v);
      const kind = isObj(v) && typeof v['kind'] === 'string' ? v['kind'] : undefined;
      if (problems.length > 0) {
        reg.bad.push({ file, ...(kind !== undefined ? { kind } : {}), problem: problems.join('; ') });
        continue;
      }
      const spec = v as CdiSpec;
      for (const device of spec.devices) {
        const qn = `${spec.kind}=${device.name}`;
        const prev = here.get(qn);
        if (prev !== undefined) hereConflicts.set(qn, [...(hereConflicts.get(qn) ?? [prev.file]), file]);
        else here.set(qn, { file, spec, device });
      }
    }
    for (const [qn, e] of here) {
      reg.devices.set(qn, e);
      reg.conflicts.delete(qn); // a later dir replaces the name, conflict included
    }
    for (const [qn, files] of hereConflicts) {
      reg.devices.delete(qn);
      reg.conflicts.set(qn, files);
    }
  }
  return reg;
}

/** "a,b, c" -> names; invalid ones go to problems. */
export function parseCdiNames(value: string, what: string, problems: string[]): string[] {
  const out: string[] = [];
  for (const s of value
    .split(',')
    .map((x) => x.trim())
    .filter((x) => x !== '')) {
    if (parseQualifiedName(s) === undefined)
      problems.push(`${what}: ${JSON.stringify(s)} is not a CDI device name (<vendor>/<class>=<name>)`);
    else out.push(s);
  }
  return out;
}

/**
 * Each name as DeviceRequests: one per /dev/vfio/<N> node of the device's (and its file's) containerEdits,
 * limited to the PCI functions the device's env or annotations name, where they name any.
 */
export function cdiRequests(
  names: readonly string[],
  reg: CdiRegistry,
  problems: string[],
  sourcePrefix = 'cdi',
): DeviceRequest[] {
  const out: DeviceRequest[] = [];
  for (const name of names) {
    const qn = parseQualifiedName(name)!;
    const conflict = reg.conflicts.get(name);
    if (conflict !== undefined) {
      problems.push(
        `CDI device ${name} is ambiguous: defined in both ${conflict.join(' and ')} (one directory); remove one of ` +
          `them`,
      );
      continue;
    }
    const e = reg.devices.get(name);
    if (e === undefined) {
      const bad = reg.bad.filter((b) => b.kind === undefined || b.kind === qn.kind);
      if (bad.length > 0)
        problems.push(
          `CDI device ${name} is not defined by any valid spec; ${bad.map((b) => `${b.file} ${b.problem}`).join('; ')}`,
        );
      else problems.push(`unknown CDI device ${name}: no spec file in ${reg.dirs.join(', ')} defines it`);
      continue;
    }
    const source = `${sourcePrefix} ${name}`;
    const nodes = [...(e.device.containerEdits.deviceNodes ?? []), ...(e.spec.containerEdits?.deviceNodes ?? [])];
    const groups: { group: string; path: string; noiommu: boolean }[] = [];
    for (const n of nodes) {
      const p = n.hostPath ?? n.path;
      const m = GROUP_NODE_RE.exec(p);
      if (m && !groups.some((g) => g.group === m[2]))
        groups.push({ group: m[2]!, path: p, noiommu: m[1] !== undefined });
    }
    if (groups.length === 0) {
      problems.push(`CDI device ${name} (${e.file}) has no /dev/vfio/<group> device node: it is not a VFIO device`);
      continue;
    }
    const texts = [
      ...(e.device.containerEdits.env ?? []).map((kv) => kv.slice(kv.indexOf('=') + 1)),
      ...Object.values(e.device.annotations ?? {}),
    ];
    const named = [...new Set(texts.flatMap((t) => t.match(PCI_IN_TEXT_RE) ?? []).map((a) => a.toLowerCase()))].filter(
      isPciAddress,
    );
    for (const g of groups)
      out.push({
        kind: 'group',
        group: g.group,
        source,
        origin: e.file,
        path: g.path,
        noiommu: g.noiommu,
        ...(named.length > 0 ? { only: named } : {}),
      });
  }
  return out;
}
