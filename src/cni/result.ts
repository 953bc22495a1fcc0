// CNI result versions (CNI spec "Result" section; libcni pkg/types/{020,040,100} and internal/convert).
// In memory a result is one shape, CniResult (1.0.0 plus the optional 1.1.0 fields); these pure functions
// read every published version into it and write it back out in any of them.
//
//   0.1.0, 0.2.0  {ip4: {ip, gateway, routes}, ip6: {...}, dns}       one address per family, no interfaces
//   0.3.0..0.4.0  {interfaces, ips: [{version, interface, address, gateway}], routes, dns}
//   1.0.0         as 0.4.0 without ips[].version
//   1.1.0         1.0.0 plus interfaces[].mtu/socketPath/pciID and routes[].mtu/advmss/priority/table/scope
import { isObj, type Obj } from '../guards.js';
import { ipFamily, isCidr, isIp } from '../net/ip.js';
import { CniError } from './errors.js';
import {
  CniErrorCode,
  type CniDns,
  type CniInterface,
  type CniIpConfig,
  type CniResult,
  type CniRoute,
} from './types.js';

/** Every CNI version this client reads and writes, oldest first. */
export const CNI_VERSIONS = ['0.1.0', '0.2.0', '0.3.0', '0.3.1', '0.4.0', '1.0.0', '1.1.0'] as const;
export type CniVersion = (typeof CNI_VERSIONS)[number];
/** The newest version we speak (what VERSION requests carry, like libcni's version.Current()). */
export const CURRENT_CNI_VERSION: CniVersion = '1.1.0';

export function isCniVersion(v: unknown): v is CniVersion {
  return typeof v === 'string' && (CNI_VERSIONS as readonly string[]).includes(v);
}

/** Numeric comparison of dotted versions ("0.10.0" > "0.4.0"); NaN parts compare as 0. */
export function compareVersions(a: string, b: string): number {
  const pa = a.split('.').map((x) => Number.parseInt(x, 10) || 0);
  const pb = b.split('.').map((x) => Number.parseInt(x, 10) || 0);
  for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
    const d = (pa[i] ?? 0) - (pb[i] ?? 0);
    if (d !== 0) return d;
  }
  return 0;
}

function incompatible(version: unknown, what: string): CniError {
  return new CniError({
    code: CniErrorCode.IncompatibleVersion,
    msg: 'incompatible CNI versions',
    details: `${what} version ${JSON.stringify(version)} is not one of ${CNI_VERSIONS.join(', ')}`,
  });
}

// ---- reading ---------------------------------------------------------------------------------------

/** Collects every problem of one result, so the error names them all at once. */
class Reader {
  readonly problems: string[] = [];

  bad(path: string, v: unknown, want: string): void {
    this.problems.push(`${path} ${JSON.stringify(v) ?? 'undefined'} is not ${want}`);
  }

  array(o: Obj, key: string, path: string): unknown[] {
    const v = o[key];
    if (v === undefined || v === null) return [];
    if (!Array.isArray(v)) {
      this.bad(`${path}${key}`, v, 'an array');
      return [];
    }
    return v;
  }

  optString(o: Obj, key: string, path: string, check?: (s: string) => boolean, want = 'a string'): string | undefined {
    const v = o[key];
    if (v === undefined || v === null || v === '') return undefined;
    if (typeof v !== 'string' || (check !== undefined && !check(v))) {
      this.bad(`${path}${key}`, v, want);
      return undefined;
    }
    return v;
  }

  optInt(o: Obj, key: string, path: string): number | undefined {
    const v = o[key];
    if (v === undefined || v === null) return undefined;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) {
      this.bad(`${path}${key}`, v, 'a non-negative integer');
      return undefined;
    }
    return v;
  }

  strings(o: Obj, key: string, path: string): string[] | undefined {
    const v = o[key];
    if (v === undefined || v === null) return undefined;
    if (!Array.isArray(v) || !v.every((x) => typeof x === 'string')) {
      this.bad(`${path}${key}`, v, 'an array of strings');
      return undefined;
    }
    return [...(v as string[])];
  }

  interface(v: unknown, path: string): CniInterface | undefined {
    if (!isObj(v)) return void this.bad(path, v, 'an object');
    const name = this.optString(v, 'name', `${path}.`);
    if (v.name === undefined || v.name === null || v.name === '') this.problems.push(`${path}.name is missing`);
    const out: CniInterface = { name: name ?? '' };
    const mac = this.optString(v, 'mac', `${path}.`);
    if (mac !== undefined) out.mac = mac;
    const sandbox = this.optString(v, 'sandbox', `${path}.`);
    if (sandbox !== undefined) out.sandbox = sandbox;
    const mtu = this.optInt(v, 'mtu', `${path}.`);
    if (mtu !== undefined && mtu !== 0) out.mtu = mtu;
    const pciID = this.optString(v, 'pciID', `${path}.`);
    if (pciID !== undefined) out.pciID = pciID;
    const socketPath = this.optString(v, 'socketPath', `${path}.`);
    if (socketPath !== undefined) out.socketPath = socketPath;
    return name === undefined ? undefined : out;
  }

  ip(v: unknown, path: string): CniIpConfig | undefined {
    if (!isObj(v)) return void this.bad(path, v, 'an object');
    const address = this.optString(v, 'address', `${path}.`, isCidr, 'an address in CIDR form');
    if (v.address === undefined || v.address === null || v.address === '')
      this.problems.push(`${path}.address is missing`);
    const gateway = this.optString(v, 'gateway', `${path}.`, isIp, 'an IP address');
    const iface = this.optInt(v, 'interface', `${path}.`);
    if (address === undefined) return undefined;
    const out: CniIpConfig = { address };
    if (gateway !== undefined) out.gateway = gateway;
    if (iface !== undefined) out.interface = iface;
    return out;
  }

  route(v: unknown, path: string): CniRoute | undefined {
    if (!isObj(v)) return void this.bad(path, v, 'an object');
    const dst = this.optString(v, 'dst', `${path}.`, isCidr, 'a destination in CIDR form');
    if (v.dst === undefined || v.dst === null || v.dst === '') this.problems.push(`${path}.dst is missing`);
    const out: CniRoute = { dst: dst ?? '' };
    const gw = this.optString(v, 'gw', `${path}.`, isIp, 'an IP address');
    if (gw !== undefined) out.gw = gw;
    for (const k of ['mtu', 'advmss', 'priority', 'table', 'scope'] as const) {
      const n = this.optInt(v, k, `${path}.`);
      if (n !== undefined && n !== 0) out[k] = n;
    }
    return dst === undefined ? undefined : out;
  }

  dns(v: unknown, path: string): CniDns {
    if (v === undefined || v === null) return {};
    if (!isObj(v)) {
      this.bad(path, v, 'an object');
      return {};
    }
    const out: CniDns = {};
    const nameservers = this.strings(v, 'nameservers', `${path}.`);
    if (nameservers !== undefined && nameservers.length > 0) out.nameservers = nameservers;
    const domain = this.optString(v, 'domain', `${path}.`);
    if (domain !== undefined) out.domain = domain;
    const search = this.strings(v, 'search', `${path}.`);
    if (search !== undefined && search.length > 0) out.search = search;
    const options = this.strings(v, 'options', `${path}.`);
    if (options !== undefined && options.length > 0) out.options = options;
    return out;
  }
}

function collect<T>(items: unknown[], path: string, read: (v: unknown, p: string) => T | undefined): T[] {
  const out: T[] = [];
  items.forEach((v, i) => {
    const x = read(v, `${path}[${i}]`);
    if (x !== undefined) out.push(x);
  });
  return out;
}

/** 0.1.0/0.2.0: ip4/ip6 become ips[] (no interface index), their routes are concatenated (libcni convertFrom02x). */
function read02x(r: Reader, o: Obj): Pick<CniResult, 'interfaces' | 'ips' | 'routes'> {
  const ips: CniIpConfig[] = [];
  const routes: CniRoute[] = [];
  for (const fam of ['ip4', 'ip6'] as const) {
    const v = o[fam];
    if (v === undefined || v === null) continue;
    if (!isObj(v)) {
      r.bad(fam, v, 'an object');
      continue;
    }
    const ip = r.optString(v, 'ip', `${fam}.`, isCidr, 'an address in CIDR form');
    if (v.ip === undefined || v.ip === null || v.ip === '') r.problems.push(`${fam}.ip is missing`);
    const gateway = r.optString(v, 'gateway', `${fam}.`, isIp, 'an IP address');
    if (ip !== undefined) ips.push(gateway === undefined ? { address: ip } : { address: ip, gateway });
    routes.push(...collect(r.array(v, 'routes', `${fam}.`), `${fam}.routes`, (x, p) => r.route(x, p)));
  }
  return { interfaces: [], ips, routes };
}

/** 0.3.0 and later: ips[].version (0.3.x/0.4.0 only) is dropped, the family is in the address. */
function readCurrent(r: Reader, o: Obj): Pick<CniResult, 'interfaces' | 'ips' | 'routes'> {
  return {
    interfaces: collect(r.array(o, 'interfaces', ''), 'interfaces', (v, p) => r.interface(v, p)),
    ips: collect(r.array(o, 'ips', ''), 'ips', (v, p) => r.ip(v, p)),
    routes: collect(r.array(o, 'routes', ''), 'routes', (v, p) => r.route(v, p)),
  };
}

/**
 * Read a plugin result of any supported version into the normalised shape. `cniVersion` of the answer keeps
 * the version the plugin spoke. A result without cniVersion is read as `defaultVersion` (libcni reads a
 * plugin's result in the version of the config it was given); unknown versions are a CNI error code 1,
 * malformed fields a CNI error code 6 that lists every problem.
 */
export function normalizeResult(json: unknown, defaultVersion?: string): CniResult {
  if (!isObj(json)) {
    throw new CniError({
      code: CniErrorCode.DecodeFailure,
      msg: 'invalid CNI result',
      details: 'the result is not a JSON object',
    });
  }
  const version = json.cniVersion ?? defaultVersion;
  if (!isCniVersion(version)) throw incompatible(version, 'result');
  const r = new Reader();
  let body: Pick<CniResult, 'interfaces' | 'ips' | 'routes'>;
  switch (version) {
    case '0.1.0':
    case '0.2.0':
      body = read02x(r, json);
      break;
    case '0.3.0':
    case '0.3.1':
    case '0.4.0':
    case '1.0.0':
    case '1.1.0':
      body = readCurrent(r, json);
      break;
    default: {
      const never: never = version;
      throw incompatible(never, 'result');
    }
  }
  const dns = r.dns(json.dns, 'dns');
  if (r.problems.length > 0) {
    throw new CniError({
      code: CniErrorCode.DecodeFailure,
      msg: `invalid CNI ${version} result`,
      details: r.problems.join('; '),
    });
  }
  return { cniVersion: version, ...body, dns };
}

// ---- writing ---------------------------------------------------------------------------------------

/** The address family of an address or CIDR, as 0.3.x results write it in ips[].version. */
export const family = (cidrOrIp: string): '4' | '6' => (ipFamily(cidrOrIp.split('/')[0] ?? '') === 6 ? '6' : '4');

export function copyDns(d: CniDns): CniDns {
  const out: CniDns = {};
  if (d.nameservers !== undefined && d.nameservers.length > 0) out.nameservers = [...d.nameservers];
  if (d.domain !== undefined && d.domain !== '') out.domain = d.domain;
  if (d.search !== undefined && d.search.length > 0) out.search = [...d.search];
  if (d.options !== undefined && d.options.length > 0) out.options = [...d.options];
  return out;
}

export function basicInterface(i: CniInterface): { name: string; mac?: string; sandbox?: string } {
  const out: { name: string; mac?: string; sandbox?: string } = { name: i.name };
  if (i.mac !== undefined) out.mac = i.mac;
  if (i.sandbox !== undefined) out.sandbox = i.sandbox;
  return out;
}

export function basicRoute(rt: CniRoute): { dst: string; gw?: string } {
  return rt.gw === undefined ? { dst: rt.dst } : { dst: rt.dst, gw: rt.gw };
}

/**
 * libcni convertTo02x: the first address of each family becomes ip4/ip6, routes go to the family of their
 * dst; 0.2.0 requires at least one address, so a result without any cannot be written.
 */
function to02x(r: CniResult, v: '0.1.0' | '0.2.0'): unknown {
  type Ip02 = { ip: string; gateway?: string; routes?: { dst: string; gw?: string }[] };
  const out: { cniVersion: string; ip4?: Ip02; ip6?: Ip02; dns: CniDns } = { cniVersion: v, dns: copyDns(r.dns) };
  for (const ip of r.ips) {
    const key = family(ip.address) === '4' ? 'ip4' : 'ip6';
    if (out[key] === undefined)
      out[key] = ip.gateway === undefined ? { ip: ip.address } : { ip: ip.address, gateway: ip.gateway };
  }
  for (const rt of r.routes) {
    const target = out[family(rt.dst) === '4' ? 'ip4' : 'ip6'];
    if (target !== undefined) (target.routes ??= []).push(basicRoute(rt));
  }
  if (out.ip4 === undefined && out.ip6 === undefined) {
    throw new CniError({
      code: CniErrorCode.IncompatibleVersion,
      msg: `cannot convert result to ${v}`,
      details: `${v} requires at least one IP address`,
    });
  }
  return out;
}

/** 0.3.0, 0.3.1, 0.4.0: ips carry "version"; interfaces and routes have their original fields only. */
function to04x(r: CniResult, v: '0.3.0' | '0.3.1' | '0.4.0'): unknown {
  const out: Obj = { cniVersion: v };
  if (r.interfaces.length > 0) out.interfaces = r.interfaces.map(basicInterface);
  if (r.ips.length > 0) {
    out.ips = r.ips.map((ip) => {
      const o: Obj = { version: family(ip.address) };
      if (ip.interface !== undefined) o.interface = ip.interface;
      o.address = ip.address;
      if (ip.gateway !== undefined) o.gateway = ip.gateway;
      return o;
    });
  }
  if (r.routes.length > 0) out.routes = r.routes.map(basicRoute);
  out.dns = copyDns(r.dns);
  return out;
}

function to1x(r: CniResult, v: '1.0.0' | '1.1.0'): unknown {
  const v11 = v === '1.1.0';
  const out: Obj = { cniVersion: v };
  if (r.interfaces.length > 0) {
    out.interfaces = r.interfaces.map((i) => {
      const o: Obj = basicInterface(i);
      if (v11) {
        if (i.mtu !== undefined) o.mtu = i.mtu;
        if (i.socketPath !== undefined) o.socketPath = i.socketPath;
        if (i.pciID !== undefined) o.pciID = i.pciID;
      }
      return o;
    });
  }
  if (r.ips.length > 0) {
    out.ips = r.ips.map((ip) => {
      const o: Obj = {};
      if (ip.interface !== undefined) o.interface = ip.interface;
      o.address = ip.address;
      if (ip.gateway !== undefined) o.gateway = ip.gateway;
      return o;
    });
  }
  if (r.routes.length > 0) {
    out.routes = r.routes.map((rt) => {
      const o: Obj = basicRoute(rt);
      if (v11)
        for (const k of ['mtu', 'advmss', 'priority', 'table', 'scope'] as const) if (rt[k] !== undefined) o[k] = rt[k];
      return o;
    });
  }
  out.dns = copyDns(r.dns);
  return out;
}

/**
 * The result as JSON of `toVersion` (what a plugin of a list at that version expects as prevResult, and
 * what the cache stores). Fields a version does not define are left out; an unknown version is CNI error 1.
 */
export function convertResult(r: CniResult, toVersion: string): unknown {
  if (!isCniVersion(toVersion)) throw incompatible(toVersion, 'target');
  switch (toVersion) {
    case '0.1.0':
    case '0.2.0':
      return to02x(r, toVersion);
    case '0.3.0':
    case '0.3.1':
    case '0.4.0':
      return to04x(r, toVersion);
    case '1.0.0':
    case '1.1.0':
      return to1x(r, toVersion);
    default: {
      const never: never = toVersion;
      throw incompatible(never, 'target');
    }
  }
}
