// JSON codecs for Virtlet's payloads (docs/protocol.md, field names as Go marshals them).
// Decoders check everything and report every problem at once, each with its path and the bad value.
// Unknown fields are ignored, as Go's encoding/json does. MACs are accepted as base64 or colon-hex and
// normalised: HardwareAddr / mac become Go base64, and NetIf gets our extra colon-hex `mac`.
import { ErrorCode, VmpodError } from '../errors.js';
import { isObj, type Obj } from '../guards.js';
import { isCidr, isIp } from '../net/ip.js';
import { podDescProblems } from '../identity.js';
import { domainNameProblems } from '../net/dns.js';
import type { CniDns } from '../cni/types.js';
import { macToBase64, parseMac } from './mac.js';
import {
  InterfaceType,
  type Bandwidth,
  type CniResultV031,
  type ContainerSideNetwork,
  type GetFDPayload,
  MAX_TAP_QUEUES,
  type GetInfo,
  type GetRequest,
  type NetIf,
  type PodNetworkDesc,
  type PortMapping,
  type RecoverPayload,
} from './payloads.js';

/** Collects "path: problem (got value)" lines. */
class Problems {
  readonly list: string[] = [];
  add(path: string, what: string, value: unknown): void {
    this.list.push(`${path} ${what} (got ${show(value)})`);
  }
}

function show(v: unknown): string {
  if (v === undefined) return 'nothing';
  const s = JSON.stringify(v);
  return s.length > 80 ? `${s.slice(0, 77)}...` : s;
}

function parseJson(buf: Buffer, what: string): unknown {
  try {
    return JSON.parse(buf.toString('utf8'));
  } catch (e) {
    throw new VmpodError(ErrorCode.BadRequest, `${what} is not JSON: ${(e as Error).message}`, { cause: e });
  }
}

function fail(what: string, p: Problems): never {
  throw new VmpodError(ErrorCode.BadRequest, `${what} is invalid: ${p.list.join('; ')}`);
}

// ---- field readers: each reports its own problem and returns a usable default ----

function reqStr(o: Obj, f: string, path: string, p: Problems): string {
  const v = o[f];
  if (isString(v)) return v;
  p.add(`${path}${f}`, 'must be a string', v);
  return '';
}

/** A field that may be missing or null (Go's zero value): undefined then; a value `is` accepts; else a problem. */
function optional<T>(
  o: Obj,
  f: string,
  path: string,
  p: Problems,
  is: (v: unknown) => v is T,
  must: string,
): T | undefined {
  const v = o[f];
  if (v === undefined || v === null) return undefined;
  if (is(v)) return v;
  p.add(`${path}${f}`, must, v);
  return undefined;
}

const isString = (v: unknown): v is string => typeof v === 'string';

/** Go zero value "" when missing or null. */
function optStr(o: Obj, f: string, path: string, p: Problems): string | undefined {
  return optional(o, f, path, p, isString, 'must be a string');
}

function optInt(o: Obj, f: string, path: string, p: Problems, min: number, max: number): number | undefined {
  const inRange = (v: unknown): v is number => typeof v === 'number' && Number.isInteger(v) && v >= min && v <= max;
  return optional(o, f, path, p, inRange, `must be an integer in ${min}..${max}`);
}

function optBool(o: Obj, f: string, path: string, p: Problems): boolean | undefined {
  return optional(o, f, path, p, (v): v is boolean => typeof v === 'boolean', 'must be a boolean');
}

/** An array or null/missing (Go marshals a nil slice as null). */
function optArr(o: Obj, f: string, path: string, p: Problems): unknown[] | undefined {
  return optional(o, f, path, p, Array.isArray, 'must be an array');
}

function optStrArr(o: Obj, f: string, path: string, p: Problems): string[] | undefined {
  const a = optArr(o, f, path, p);
  if (!a) return undefined;
  const out: string[] = [];
  a.forEach((v, i) => {
    if (isString(v)) out.push(v);
    else p.add(`${path}${f}[${i}]`, 'must be a string', v);
  });
  return out;
}

/** An optional array field whose items are objects: each built with its path prefix, a non-object is a problem. */
function objArr<T>(
  o: Obj,
  f: string,
  pre: string,
  p: Problems,
  empty: T,
  build: (e: Obj, itemPre: string) => T,
): T[] | undefined {
  return optArr(o, f, pre, p)?.map((e, i) => {
    const path = `${pre}${f}[${i}]`;
    if (isObj(e)) return build(e, `${path}.`);
    p.add(path, 'must be an object', e);
    return empty;
  });
}

function interfaceType(o: Obj, f: string, path: string, p: Problems): InterfaceType {
  const v = o[f];
  if (v === undefined || v === null) return InterfaceType.Tap;
  if (v === InterfaceType.Tap || v === InterfaceType.VF) return v;
  p.add(`${path}${f}`, `must be ${InterfaceType.Tap} (tap) or ${InterfaceType.VF} (VF)`, v);
  return InterfaceType.Tap;
}

/** A MAC in base64 or colon-hex; returns lower-case colon-hex, or '' after reporting. */
function macField(o: Obj, f: string, path: string, p: Problems): string {
  const v = o[f];
  if (typeof v !== 'string') {
    p.add(`${path}${f}`, 'must be a MAC (base64 of 6 bytes or colon-hex)', v);
    return '';
  }
  try {
    return parseMac(v);
  } catch {
    p.add(`${path}${f}`, 'must be a MAC (base64 of 6 bytes or colon-hex)', v);
    return '';
  }
}

/** PCI address with or without the domain: [dddd:]bb:dd.f (lspci -D form). Empty = none. */
const PCI_ADDR = /^([0-9a-f]{4}:)?[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$/i;

function pciField(o: Obj, f: string, path: string, p: Problems): string {
  const v = optStr(o, f, path, p) ?? '';
  if (v !== '' && !PCI_ADDR.test(v)) p.add(`${path}${f}`, 'must be a PCI address like 0000:03:00.1 or ""', v);
  return v;
}

function checkCidr(s: string, path: string, p: Problems): void {
  if (!isCidr(s)) p.add(path, 'must be an address with prefix length (CIDR)', s);
}

function checkIp(s: string | undefined, path: string, p: Problems): void {
  if (s !== undefined && !isIp(s)) p.add(path, 'must be an IP address', s);
}

// ---- structures ----

function dns(v: unknown, path: string, p: Problems): CniDns {
  if (!isObj(v)) {
    p.add(path, 'must be an object', v);
    return {};
  }
  const out: CniDns = {};
  const nameservers = optStrArr(v, 'nameservers', `${path}.`, p);
  nameservers?.forEach((s, i) => checkIp(s, `${path}.nameservers[${i}]`, p));
  const domain = optStr(v, 'domain', `${path}.`, p);
  const search = optStrArr(v, 'search', `${path}.`, p);
  const options = optStrArr(v, 'options', `${path}.`, p);
  // the same rule the DHCP lease applies later, checked at the door so a bad name fails before anything is built
  search?.forEach((s, i) =>
    domainNameProblems(s, 'search domain').forEach((why) => p.add(`${path}.search[${i}]`, why, s)),
  );
  if (domain !== undefined && domain !== '')
    domainNameProblems(domain, 'domain name').forEach((why) => p.add(`${path}.domain`, why, domain));
  if (nameservers) out.nameservers = nameservers;
  if (domain !== undefined) out.domain = domain;
  if (search) out.search = search;
  if (options) out.options = options;
  return out;
}

const PROTOCOLS: readonly PortMapping['protocol'][] = ['tcp', 'udp', 'sctp'];

function portMapping(e: Obj, pre: string, p: Problems): PortMapping {
  const port = (f: string): number => {
    const v = optInt(e, f, pre, p, 1, 65535);
    if (v === undefined && (e[f] === undefined || e[f] === null)) p.add(`${pre}${f}`, 'is required', e[f]);
    return v ?? 0;
  };
  const hostPort = port('hostPort');
  const containerPort = port('containerPort');
  // CRI names them in upper case (TCP), CNI plugins in lower case, as containerd passes them
  const proto = (optStr(e, 'protocol', pre, p) ?? 'tcp').toLowerCase();
  const protocol = PROTOCOLS.find((x) => x === proto);
  if (protocol === undefined) p.add(`${pre}protocol`, `must be one of ${PROTOCOLS.join(', ')}`, e.protocol);
  const hostIP = optStr(e, 'hostIP', pre, p) ?? '';
  if (hostIP !== '') checkIp(hostIP, `${pre}hostIP`, p);
  return { hostPort, containerPort, protocol: protocol ?? 'tcp', hostIP };
}

function bandwidth(v: unknown, path: string, p: Problems): Bandwidth {
  if (!isObj(v)) {
    p.add(path, 'must be an object', v);
    return {};
  }
  const out: Bandwidth = {};
  for (const f of ['ingressRate', 'ingressBurst', 'egressRate', 'egressBurst'] as const) {
    const n = optInt(v, f, `${path}.`, p, 0, Number.MAX_SAFE_INTEGER);
    if (n !== undefined) out[f] = n;
  }
  return out;
}

function podNetworkDesc(v: unknown, path: string, p: Problems): PodNetworkDesc {
  if (!isObj(v)) {
    p.add(path, 'must be an object', v);
    return { podId: '', podNs: '', podName: '', DNS: null };
  }
  const pre = `${path}.`;
  const desc: PodNetworkDesc = {
    podId: reqStr(v, 'podId', pre, p),
    podNs: reqStr(v, 'podNs', pre, p),
    podName: reqStr(v, 'podName', pre, p),
    DNS: v.DNS === undefined || v.DNS === null ? null : dns(v.DNS, `${pre}DNS`, p),
  };
  const ports = objArr(
    v,
    'portMappings',
    pre,
    p,
    { hostPort: 0, containerPort: 0, protocol: 'tcp' as const, hostIP: '' },
    (e, itemPre) => portMapping(e, itemPre, p),
  );
  if (ports !== undefined && ports.length > 0) desc.portMappings = ports;
  if (v.bandwidth !== undefined && v.bandwidth !== null) desc.bandwidth = bandwidth(v.bandwidth, `${pre}bandwidth`, p);
  // the one identity rule, up front: these names go into CNI_ARGS, the state record and DHCP
  for (const { field, problem } of podDescProblems(desc)) p.add(`${pre}${field}`, problem, desc[field]);
  return desc;
}

function cniResult(v: unknown, path: string, p: Problems): CniResultV031 {
  if (!isObj(v)) {
    p.add(path, 'must be an object or null', v);
    return {};
  }
  const pre = `${path}.`;
  const out: CniResultV031 = {};
  const cniVersion = optStr(v, 'cniVersion', pre, p);
  if (cniVersion !== undefined) out.cniVersion = cniVersion;

  const ifs = objArr(v, 'interfaces', pre, p, { name: '' }, (e, ip) => {
    const r: { name: string; mac?: string; sandbox?: string } = { name: reqStr(e, 'name', ip, p) };
    const mac = optStr(e, 'mac', ip, p);
    if (mac) r.mac = macField(e, 'mac', ip, p);
    const sandbox = optStr(e, 'sandbox', ip, p);
    if (sandbox !== undefined) r.sandbox = sandbox;
    return r;
  });
  if (ifs) out.interfaces = ifs;

  const ips = objArr(v, 'ips', pre, p, { version: '4' as const, address: '' }, (e, ip) => {
    let version: '4' | '6' = '4';
    if (e.version === '4' || e.version === '6') version = e.version;
    else p.add(`${ip}version`, 'must be "4" or "6"', e.version);
    const iface = optInt(e, 'interface', ip, p, 0, 0xffff);
    const address = reqStr(e, 'address', ip, p);
    if (typeof e.address === 'string') checkCidr(address, `${ip}address`, p);
    const gateway = optStr(e, 'gateway', ip, p);
    checkIp(gateway, `${ip}gateway`, p);
    // Go's field order: version, interface, address, gateway
    return {
      version,
      ...(iface !== undefined ? { interface: iface } : {}),
      address,
      ...(gateway !== undefined ? { gateway } : {}),
    };
  });
  if (ips) out.ips = ips;

  const routes = objArr(v, 'routes', pre, p, { dst: '' } as { dst: string; gw?: string }, (e, rp) => {
    const dst = reqStr(e, 'dst', rp, p);
    if (typeof e.dst === 'string') checkCidr(dst, `${rp}dst`, p);
    const gw = optStr(e, 'gw', rp, p);
    checkIp(gw, `${rp}gw`, p);
    return gw !== undefined ? { dst, gw } : { dst };
  });
  if (routes) out.routes = routes;

  if (v.dns !== undefined && v.dns !== null) out.dns = dns(v.dns, `${pre}dns`, p);
  return out;
}

function netIf(v: unknown, path: string, p: Problems): NetIf {
  if (!isObj(v)) {
    p.add(path, 'must be an object', v);
    return { Type: InterfaceType.Tap, Name: '', HardwareAddr: '', PCIAddress: '', MTU: 0, VlanID: 0 };
  }
  const pre = `${path}.`;
  const Type = interfaceType(v, 'Type', pre, p);
  const Name = reqStr(v, 'Name', pre, p);
  const mac = macField(v, 'HardwareAddr', pre, p);
  const PCIAddress = pciField(v, 'PCIAddress', pre, p);
  const MTU = optInt(v, 'MTU', pre, p, 0, 65535) ?? 0;
  // 802.1Q VLAN ids are 12 bits; 0 = untagged
  const VlanID = optInt(v, 'VlanID', pre, p, 0, 4094) ?? 0;
  return { Type, Name, HardwareAddr: mac ? macToBase64(mac) : '', PCIAddress, MTU, VlanID, mac };
}

function csn(v: unknown, path: string, p: Problems): ContainerSideNetwork {
  if (!isObj(v)) {
    p.add(path, 'must be an object', v);
    return { Result: null, NsPath: '', Interfaces: [] };
  }
  const pre = path ? `${path}.` : '';
  const Result = v.Result === undefined || v.Result === null ? null : cniResult(v.Result, `${pre}Result`, p);
  const NsPath = reqStr(v, 'NsPath', pre, p);
  const Interfaces = (optArr(v, 'Interfaces', pre, p) ?? []).map((e, i) => netIf(e, `${pre}Interfaces[${i}]`, p));
  return { Result, NsPath, Interfaces };
}

// ---- public decoders ----

/** Parses a JSON object payload, builds the result from it, and throws once with every problem found. */
function decodeObject<T>(buf: Buffer, what: string, build: (v: Obj, p: Problems) => T): T {
  const v = parseJson(buf, what);
  const p = new Problems();
  if (!isObj(v)) {
    p.add('payload', 'must be an object', v);
    fail(what, p);
  }
  const out = build(v, p);
  if (p.list.length) fail(what, p);
  return out;
}

/** add (0) request payload: {"podNetworkDesc": {...}}. */
export function decodeGetFDPayload(buf: Buffer): GetFDPayload {
  return decodeObject(buf, 'add payload', (v, p) => ({
    podNetworkDesc: podNetworkDesc(v.podNetworkDesc, 'podNetworkDesc', p),
  }));
}

/** recover (3) request payload: {"podNetworkDesc", "csn", "HaveRunningContainers"}. */
export function decodeRecoverPayload(buf: Buffer): RecoverPayload {
  return decodeObject(buf, 'recover payload', (v, p) => ({
    podNetworkDesc: podNetworkDesc(v.podNetworkDesc, 'podNetworkDesc', p),
    csn: csn(v.csn, 'csn', p),
    HaveRunningContainers: optBool(v, 'HaveRunningContainers', '', p) ?? false,
  }));
}

/** A ContainerSideNetwork (add's response payload). */
export function decodeCsn(buf: Buffer): ContainerSideNetwork {
  const what = 'container side network';
  const v = parseJson(buf, what);
  const p = new Problems();
  const out = csn(v, '', p);
  if (p.list.length) fail(what, p);
  return out;
}

/** The fd indices an element of get's info claims: its queueFdIndices when it is an array, else its fdIndex. */
function claimedIndices(e: unknown): unknown[] {
  if (!isObj(e)) return [];
  return Array.isArray(e.queueFdIndices) ? e.queueFdIndices : [e.fdIndex];
}

/**
 * get's (2) response payload: [{"type","mac","fdIndex","pciAddress"[,"mtu","queueFdIndices"]}]; mac normalised to
 * base64. The fds the reply carries are every index claimed (fdIndex, or each tap's queueFdIndices), each once.
 */
export function decodeGetInfo(buf: Buffer): GetInfo[] {
  const what = 'get info';
  const v = parseJson(buf, what);
  const p = new Problems();
  if (v !== null && !Array.isArray(v)) {
    p.add('get info', 'must be an array', v);
    fail(what, p);
  }
  const arr: unknown[] = Array.isArray(v) ? v : [];
  const nfds = arr.reduce<number>((n, e) => n + Math.max(1, claimedIndices(e).length), 0);
  const seen = new Map<number, number>();
  const index = (x: unknown, path: string, i: number): number => {
    if (!(typeof x === 'number' && Number.isInteger(x) && x >= 0 && x < nfds)) {
      p.add(path, `must be an integer in 0..${nfds - 1}`, x);
      return 0;
    }
    const prev = seen.get(x);
    if (prev !== undefined) p.add(path, `repeats an fd index of [${prev}]`, x);
    else seen.set(x, i);
    return x;
  };
  const out = arr.map((e, i): GetInfo => {
    const path = `[${i}]`;
    if (!isObj(e)) {
      p.add(path, 'must be an object', e);
      return { type: InterfaceType.Tap, mac: '', fdIndex: 0, pciAddress: '' };
    }
    const pre = `${path}.`;
    const type = interfaceType(e, 'type', pre, p);
    const mac = macField(e, 'mac', pre, p);
    const fdIndex = index(e.fdIndex, `${pre}fdIndex`, i);
    const pciAddress = pciField(e, 'pciAddress', pre, p);
    const info: GetInfo = { type, mac: mac ? macToBase64(mac) : '', fdIndex, pciAddress };
    if (e.mtu !== undefined) {
      if (typeof e.mtu === 'number' && Number.isInteger(e.mtu) && e.mtu >= 68 && e.mtu <= 65535) info.mtu = e.mtu;
      else p.add(`${pre}mtu`, 'must be an integer in 68..65535', e.mtu);
    }
    const q = optArr(e, 'queueFdIndices', pre, p);
    if (q !== undefined)
      info.queueFdIndices = queueIndices(q, fdIndex, `${pre}queueFdIndices`, p, (x, qp) => index(x, qp, i));
    return info;
  });
  if (p.list.length) fail(what, p);
  return out;
}

/** queueFdIndices: 1..MAX_TAP_QUEUES indices, the first one fdIndex (which `index` has counted already). */
function queueIndices(
  q: unknown[],
  fdIndex: number,
  path: string,
  p: Problems,
  index: (x: unknown, path: string) => number,
): number[] {
  if (q.length === 0 || q.length > MAX_TAP_QUEUES) p.add(path, `must hold 1..${MAX_TAP_QUEUES} fd indices`, q);
  else if (q[0] !== fdIndex) p.add(`${path}[0]`, 'must be fdIndex', q[0]);
  return q.map((x, k) => (k === 0 ? fdIndex : index(x, `${path}[${k}]`)));
}

/** get (2) request payload, ours: {"queues": N}; none (Virtlet's client) asks for one queue. */
export function decodeGetRequest(buf: Buffer): GetRequest {
  if (buf.length === 0) return { queues: 1 };
  return decodeObject(buf, 'get payload', (v, p) => ({ queues: optInt(v, 'queues', '', p, 1, MAX_TAP_QUEUES) ?? 1 }));
}

/** get (2) request payload; none for one queue, so that the request is Virtlet's own byte for byte. */
export function encodeGetRequest(r: GetRequest): Buffer | null {
  return r.queues === 1 ? null : Buffer.from(JSON.stringify({ queues: r.queues }), 'utf8');
}

// ---- encoders (Go's field order and omitempty rules, so the bytes match what Virtlet sends) ----

function encodeDns(d: CniDns | undefined): CniDns {
  const out: CniDns = {};
  if (d?.nameservers?.length) out.nameservers = d.nameservers;
  if (d?.domain) out.domain = d.domain;
  if (d?.search?.length) out.search = d.search;
  if (d?.options?.length) out.options = d.options;
  return out;
}

/** CNI 0.3.1 types/current.Result: everything omitempty except dns (a struct value, always present). */
function encodeResult(r: CniResultV031): unknown {
  const out: Obj = {};
  if (r.cniVersion) out.cniVersion = r.cniVersion;
  if (r.interfaces?.length) {
    out.interfaces = r.interfaces.map((i) => ({
      name: i.name,
      ...(i.mac ? { mac: i.mac } : {}),
      ...(i.sandbox ? { sandbox: i.sandbox } : {}),
    }));
  }
  if (r.ips?.length) {
    out.ips = r.ips.map((ip) => ({
      version: ip.version,
      ...(ip.interface !== undefined ? { interface: ip.interface } : {}),
      address: ip.address,
      ...(ip.gateway ? { gateway: ip.gateway } : {}),
    }));
  }
  if (r.routes?.length) out.routes = r.routes.map((rt) => (rt.gw ? { dst: rt.dst, gw: rt.gw } : { dst: rt.dst }));
  out.dns = encodeDns(r.dns);
  return out;
}

export interface EncodeCsnOptions {
  /** add our colon-hex `mac` beside each HardwareAddr (default true; Go ignores it) */
  withMac?: boolean;
}

function csnObject(c: ContainerSideNetwork, opts: EncodeCsnOptions = {}): unknown {
  const withMac = opts.withMac ?? true;
  return {
    Result: c.Result === null ? null : encodeResult(c.Result),
    NsPath: c.NsPath,
    Interfaces: c.Interfaces.map((i) => {
      const hex = parseMac(i.HardwareAddr);
      return {
        Type: i.Type,
        Name: i.Name,
        HardwareAddr: macToBase64(hex),
        PCIAddress: i.PCIAddress,
        MTU: i.MTU,
        VlanID: i.VlanID,
        ...(withMac ? { mac: hex } : {}),
      };
    }),
  };
}

/** ContainerSideNetwork JSON: HardwareAddr as Go base64 (accepts base64 or colon-hex in), plus `mac` colon-hex. */
export function encodeCsn(c: ContainerSideNetwork, opts: EncodeCsnOptions = {}): Buffer {
  return Buffer.from(JSON.stringify(csnObject(c, opts)), 'utf8');
}

function descObject(d: PodNetworkDesc): unknown {
  // the runtimeConfig fields only when there are any: Virtlet's own requests stay as they were
  return {
    podId: d.podId,
    podNs: d.podNs,
    podName: d.podName,
    DNS: d.DNS ? encodeDns(d.DNS) : null,
    ...(d.portMappings && d.portMappings.length > 0
      ? {
          portMappings: d.portMappings.map((m) => ({
            hostPort: m.hostPort,
            containerPort: m.containerPort,
            protocol: m.protocol,
            hostIP: m.hostIP,
          })),
        }
      : {}),
    ...(d.bandwidth ? { bandwidth: { ...d.bandwidth } } : {}),
  };
}

/** add (0) request payload. */
export function encodeGetFDPayload(p: GetFDPayload): Buffer {
  return Buffer.from(JSON.stringify({ podNetworkDesc: descObject(p.podNetworkDesc) }), 'utf8');
}

/** recover (3) request payload. */
export function encodeRecoverPayload(p: RecoverPayload): Buffer {
  return Buffer.from(
    JSON.stringify({
      podNetworkDesc: descObject(p.podNetworkDesc),
      csn: csnObject(p.csn),
      HaveRunningContainers: p.HaveRunningContainers,
    }),
    'utf8',
  );
}

/** get's response payload; mac emitted as Go base64 whatever form it is given in. */
export function encodeGetInfo(infos: GetInfo[]): Buffer {
  return Buffer.from(
    JSON.stringify(
      infos.map((i) => ({
        type: i.type,
        mac: macToBase64(parseMac(i.mac)),
        fdIndex: i.fdIndex,
        pciAddress: i.pciAddress,
        ...(i.mtu !== undefined ? { mtu: i.mtu } : {}),
        ...(i.queueFdIndices !== undefined ? { queueFdIndices: i.queueFdIndices } : {}),
      })),
    ),
    'utf8',
  );
}
