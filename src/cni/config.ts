// Network configuration (CNI spec "Configuration format"; libcni conf.go) and the pure steps that turn a
// network plus an attachment into what one plugin run receives (libcni api.go buildOneConfig,
// injectRuntimeConfig, pkg/invoke Args.AsEnv; pkg/utils ValidateContainerID/ValidateInterfaceName).
import { CNI_VALID_NAME } from '../identity.js';
import { readdir, readFile, stat } from 'node:fs/promises';
import { readdirSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { ErrorCode, VmpodError } from '../errors.js';
import { isObj, type Obj } from '../guards.js';
import { CniError } from './errors.js';
import { CNI_VERSIONS, compareVersions, isCniVersion } from './result.js';
import { CniErrorCode } from './types.js';

export interface PluginConf {
  type: string;
  capabilities?: Record<string, boolean>;
  [k: string]: unknown;
}

export interface NetworkConfigList {
  name: string;
  /** the version every plugin of the list is run with (the highest known one of cniVersions when given) */
  cniVersion: string;
  cniVersions?: string[];
  disableCheck?: boolean;
  /** CNI 1.1.0 (libcni GCNetworkList): no GC at all, neither the stale attachments' DEL nor the plugins' GC */
  disableGC?: boolean;
  plugins: PluginConf[];
  /** the list as JSON (the file's bytes; for a single-plugin .conf, the list built from it) */
  bytes: Buffer;
  file: string;
}

export interface RuntimeConf {
  containerId: string;
  netns: string;
  ifName: string;
  /** CNI_ARGS pairs, e.g. IgnoreUnknown=1, K8S_POD_NAMESPACE, K8S_POD_NAME, K8S_POD_INFRA_CONTAINER_ID */
  args: [string, string][];
  capabilityArgs?: Record<string, unknown>;
}

/** The CNI commands (spec "Parameters": CNI_COMMAND); STATUS and GC came with 1.1.0. */
export const CniVerb = {
  Add: 'ADD',
  Del: 'DEL',
  Check: 'CHECK',
  Status: 'STATUS',
  Gc: 'GC',
  Version: 'VERSION',
} as const;
export type CniVerb = (typeof CniVerb)[keyof typeof CniVerb];

/** Extensions libcni (and the CRI runtimes) read from a config directory. */
export const CONF_EXTENSIONS = ['.conf', '.conflist', '.json'] as const;

// ---- loading ---------------------------------------------------------------------------------------

/** libcni utils cniValidNameChars: container ids and network names become file names (the result cache). */
const VALID_NAME = CNI_VALID_NAME;

function configError(file: string, problem: string, cause?: unknown): VmpodError {
  return new VmpodError(ErrorCode.Config, `CNI config ${file}: ${problem}`, {
    op: 'load CNI config',
    ...(cause === undefined ? {} : { cause }),
  });
}

function readPlugin(v: unknown, where: string, problems: string[]): PluginConf | undefined {
  if (!isObj(v)) {
    problems.push(`${where} is not an object`);
    return undefined;
  }
  if (typeof v.type !== 'string' || v.type === '') {
    problems.push(`${where} has no "type"`);
    return undefined;
  }
  // libcni FindInPath refuses a plugin name with a path separator: "type" names a file in the bin dirs.
  if (v.type.includes('/') || v.type === '.' || v.type === '..')
    problems.push(`${where} type ${JSON.stringify(v.type)} is not a plain file name`);
  if (
    v.capabilities !== undefined &&
    (!isObj(v.capabilities) || !Object.values(v.capabilities).every((c) => typeof c === 'boolean'))
  ) {
    problems.push(`${where} "capabilities" is not an object of booleans`);
  }
  return v as PluginConf;
}

/** libcni: cniVersions (1.1.0) wins over cniVersion; the highest version in it that we support is used. */
function pickVersion(o: Obj, problems: string[]): { cniVersion: string; cniVersions?: string[] } {
  let cniVersions: string[] | undefined;
  if (o.cniVersions !== undefined) {
    if (!Array.isArray(o.cniVersions) || !o.cniVersions.every((x) => typeof x === 'string')) {
      problems.push('"cniVersions" is not an array of strings');
    } else {
      cniVersions = o.cniVersions as string[];
      const known = cniVersions.filter(isCniVersion).sort(compareVersions);
      const best = known[known.length - 1];
      if (best !== undefined) return { cniVersion: best, cniVersions };
      if (o.cniVersion === undefined)
        problems.push(`none of "cniVersions" ${JSON.stringify(cniVersions)} is supported (${CNI_VERSIONS.join(', ')})`);
    }
  }
  if (o.cniVersion === undefined) {
    if (cniVersions === undefined) problems.push('no "cniVersion"');
    return { cniVersion: '', ...(cniVersions === undefined ? {} : { cniVersions }) };
  }
  if (!isCniVersion(o.cniVersion))
    problems.push(`"cniVersion" ${JSON.stringify(o.cniVersion)} is not one of ${CNI_VERSIONS.join(', ')}`);
  return { cniVersion: String(o.cniVersion), ...(cniVersions === undefined ? {} : { cniVersions }) };
}

function readName(o: Obj, problems: string[]): string {
  if (typeof o.name !== 'string' || o.name === '') {
    problems.push('no "name"');
    return '';
  }
  if (!VALID_NAME.test(o.name)) problems.push(`"name" ${JSON.stringify(o.name)} must match ${VALID_NAME.source}`);
  return o.name;
}

/** disableCheck, disableGC: libcni accepts a bool, and since 1.1 also the strings "true"/"false". */
function readSwitch(o: Obj, key: 'disableCheck' | 'disableGC', problems: string[]): boolean | undefined {
  const v = o[key];
  if (v === undefined) return undefined;
  if (typeof v === 'boolean') return v;
  if (v === 'true' || v === 'false') return v === 'true';
  problems.push(`"${key}" ${JSON.stringify(v)} is not a boolean`);
  return undefined;
}

/**
 * Parse a network configuration list (.conflist), or a single plugin configuration (.conf/.json, which
 * libcni's ConfListFromConf turns into a one-plugin list). A .conf/.json that has "plugins" and no "type"
 * is read as a list. Every problem is reported at once, with the file name.
 */
export function parseConfList(bytes: Buffer, file: string): NetworkConfigList {
  let json: unknown;
  try {
    json = JSON.parse(bytes.toString('utf8'));
  } catch (e) {
    throw configError(file, `not valid JSON (${e instanceof Error ? e.message : String(e)})`, e);
  }
  if (!isObj(json)) throw configError(file, 'not a JSON object');
  const problems: string[] = [];
  const isList = file.endsWith('.conflist') || (json.plugins !== undefined && json.type === undefined);

  const name = readName(json, problems);
  const { cniVersion, cniVersions } = pickVersion(json, problems);
  let plugins: PluginConf[] = [];
  let listBytes = bytes;
  if (isList) {
    if (!Array.isArray(json.plugins)) problems.push('"plugins" is missing or not an array');
    else if (json.plugins.length === 0) problems.push('"plugins" is empty');
    else
      json.plugins.forEach((p, i) => {
        const pc = readPlugin(p, `plugins[${i}]`, problems);
        if (pc !== undefined) plugins.push(pc);
      });
  } else {
    const pc = readPlugin(json, 'the plugin', problems);
    if (pc !== undefined) plugins = [pc];
    // ConfListFromConf: the list carries the conf's name and version; its bytes are that list.
    listBytes = Buffer.from(JSON.stringify({ cniVersion: json.cniVersion, name: json.name, plugins: [json] }));
  }
  const disableCheck = readSwitch(json, 'disableCheck', problems);
  const disableGC = readSwitch(json, 'disableGC', problems);
  if (problems.length > 0) throw configError(file, problems.join('; '));

  const list: NetworkConfigList = { name, cniVersion, plugins, bytes: listBytes, file };
  if (cniVersions !== undefined) list.cniVersions = cniVersions;
  if (disableCheck !== undefined) list.disableCheck = disableCheck;
  if (disableGC !== undefined) list.disableGC = disableGC;
  return list;
}

/** The config files of a directory that libcni would consider, in lexical order. */
export async function confFiles(confDir: string): Promise<string[]> {
  let entries: string[];
  try {
    entries = await readdir(confDir);
  } catch (e) {
    throw new VmpodError(
      ErrorCode.Config,
      `read CNI config dir ${confDir}: ${(e as NodeJS.ErrnoException).code ?? String(e)}`,
      { cause: e, op: 'load CNI config' },
    );
  }
  const names = entries.filter((n) => CONF_EXTENSIONS.some((ext) => n.endsWith(ext))).sort();
  const files: string[] = [];
  for (const n of names) {
    const p = join(confDir, n);
    if ((await stat(p).catch(() => undefined))?.isFile() === true) files.push(p);
  }
  return files;
}

/** The network of a node: the first config file in lexical order (libcni/CRI behaviour). */
export async function loadConfList(confDir: string): Promise<NetworkConfigList> {
  const files = await confFiles(confDir);
  const file = files[0];
  if (file === undefined) {
    throw new VmpodError(
      ErrorCode.Config,
      `no CNI network config in ${confDir} (looked for ${CONF_EXTENSIONS.join(', ')})`,
      { op: 'load CNI config' },
    );
  }
  let bytes: Buffer;
  try {
    bytes = await readFile(file);
  } catch (e) {
    throw configError(file, `cannot read: ${(e as NodeJS.ErrnoException).code ?? String(e)}`, e);
  }
  return parseConfList(bytes, file);
}

/**
 * loadConfList that keeps the parsed network while nothing it depends on changed: the dir's entries and, through
 * symlinks, each candidate file's inode, size, mtime and ctime (a kubelet configMap swapping its ..data link changes
 * the dir). Checking costs a readdir and a stat per candidate; reading and parsing are what an add then saves.
 */
export function confListLoader(confDir: string): () => Promise<NetworkConfigList> {
  let cached: { sig: string; list: NetworkConfigList } | undefined;
  return async () => {
    // taken before the load: a change while it reads makes the next call load again
    const sig = confSignature(confDir);
    if (sig !== undefined && cached?.sig === sig) return cached.list;
    const list = await loadConfList(confDir);
    cached = sig === undefined ? undefined : { sig, list };
    return list;
  };
}

/** What the chosen config depends on, as a string; undefined when the dir cannot be read (no caching then). */
function confSignature(confDir: string): string | undefined {
  try {
    const d = statSync(confDir, { bigint: true });
    const parts = [`${d.ino}:${d.mtimeNs}`];
    for (const n of readdirSync(confDir)
      .filter((x) => CONF_EXTENSIONS.some((ext) => x.endsWith(ext)))
      .sort()) {
      const st = statSync(join(confDir, n), { bigint: true, throwIfNoEntry: false });
      parts.push(
        st === undefined
          ? `${n}:-`
          : `${n}:${st.ino}:${st.size}:${st.mtimeNs}:${st.ctimeNs}:${st.isFile() ? 'f' : 'o'}`,
      );
    }
    return parts.join('/');
  } catch {
    return undefined;
  }
}

// ---- validating the attachment (before anything runs) ------------------------------------------------

/** libcni ValidateContainerID; a CNI error code 4 (invalid environment variables), like libcni's. */
export function validateContainerId(id: string): void {
  if (id === '') throw new CniError({ code: CniErrorCode.InvalidEnv, msg: 'missing containerID' });
  if (!VALID_NAME.test(id)) {
    throw new CniError({
      code: CniErrorCode.InvalidEnv,
      msg: 'invalid characters in containerID',
      details: JSON.stringify(id),
    });
  }
}

/** IFNAMSIZ is 16 with the NUL, so a Linux interface name is 1..15 bytes (libcni ValidateInterfaceName). */
export const MAX_IFNAME_BYTES = 15;

export function validateIfName(ifName: string): void {
  const bad = (msg: string, details?: string): CniError =>
    new CniError({ code: CniErrorCode.InvalidEnv, msg, details: details ?? JSON.stringify(ifName) });
  if (ifName === '') throw bad('interface name is empty', '');
  if (Buffer.byteLength(ifName) > MAX_IFNAME_BYTES)
    throw bad(
      'interface name is too long',
      `${JSON.stringify(ifName)} has ${Buffer.byteLength(ifName)} bytes, at most ${MAX_IFNAME_BYTES} allowed`,
    );
  if (ifName === '.' || ifName === '..') throw bad('interface name is . or ..');
  // The kernel's dev_valid_name() refuses '/', ':' and whitespace (libcni checks unicode.IsSpace).
  if (/[/:\s]/u.test(ifName)) throw bad('interface name contains / or : or whitespace characters');
}

/** CNI_ARGS is "K=V;K=V": a key may not hold '=' or ';', a value may not hold ';'. */
export function validateCniArgs(args: readonly (readonly [string, string])[]): void {
  const problems = args.flatMap(([k, v]) => {
    const p: string[] = [];
    if (k === '' || /[=;]/.test(k)) p.push(`key ${JSON.stringify(k)}`);
    if (v.includes(';')) p.push(`value ${JSON.stringify(v)} of ${k}`);
    return p;
  });
  if (problems.length > 0) {
    throw new CniError({
      code: CniErrorCode.InvalidEnv,
      msg: 'invalid CNI_ARGS',
      details: `${problems.join(', ')} cannot be written as K=V;K=V`,
    });
  }
}

export function validateNetworkName(name: string): void {
  if (!VALID_NAME.test(name)) {
    throw new CniError({
      code: CniErrorCode.InvalidNetworkConfig,
      msg: 'invalid network name',
      details: `${JSON.stringify(name)} must match ${VALID_NAME.source}`,
    });
  }
}

/** All checks libcni makes before it runs a plugin for an attachment. netns is required unless DEL. */
export function validateRuntime(list: NetworkConfigList, rt: RuntimeConf, verb: CniVerb): void {
  validateNetworkName(list.name);
  validateContainerId(rt.containerId);
  validateIfName(rt.ifName);
  validateCniArgs(rt.args);
  if (verb !== CniVerb.Del && rt.netns === '') {
    throw new CniError({
      code: CniErrorCode.InvalidEnv,
      msg: 'missing network namespace path',
      details: `${verb} needs CNI_NETNS`,
    });
  }
}

// ---- what one plugin receives -----------------------------------------------------------------------

/**
 * libcni injectRuntimeConfig: runtimeConfig carries only the capability args this plugin declares
 * (capabilities.X === true) and the runtime supplies. undefined when there are none.
 */
export function runtimeConfigFor(
  plugin: PluginConf,
  capabilityArgs: Record<string, unknown> | undefined,
): Record<string, unknown> | undefined {
  if (capabilityArgs === undefined || plugin.capabilities === undefined) return undefined;
  const rc: Record<string, unknown> = {};
  for (const [cap, on] of Object.entries(plugin.capabilities)) {
    if (on === true && Object.hasOwn(capabilityArgs, cap)) rc[cap] = capabilityArgs[cap];
  }
  return Object.keys(rc).length > 0 ? rc : undefined;
}

/**
 * libcni buildOneConfig: the plugin's own conf with the list's `name` and `cniVersion`, the previous
 * result (already in the list's version) as `prevResult`, and `runtimeConfig` from the declared capabilities.
 */
export function buildOneConfig(
  list: Pick<NetworkConfigList, 'name' | 'cniVersion'>,
  plugin: PluginConf,
  prevResult: unknown,
  capabilityArgs?: Record<string, unknown>,
): Record<string, unknown> {
  const conf: Record<string, unknown> = { ...plugin, name: list.name, cniVersion: list.cniVersion };
  if (prevResult !== undefined) conf.prevResult = prevResult;
  const rc = runtimeConfigFor(plugin, capabilityArgs);
  if (rc !== undefined) conf.runtimeConfig = rc;
  return conf;
}

/** "K=V;K=V" (libcni Args.AsEnv). */
export function formatCniArgs(args: readonly (readonly [string, string])[]): string {
  return args.map(([k, v]) => `${k}=${v}`).join(';');
}

/** A PATH for plugins that run other programs (portmap and firewall run iptables). */
export const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

/** The whole environment of one plugin run: the six CNI variables and PATH, nothing inherited. */
export function buildEnv(
  verb: CniVerb,
  rt: RuntimeConf | undefined,
  binDirs: readonly string[],
  path = process.env.PATH ?? DEFAULT_PATH,
): Record<string, string> {
  return {
    CNI_COMMAND: verb,
    CNI_CONTAINERID: rt?.containerId ?? '',
    CNI_NETNS: rt?.netns ?? '',
    CNI_IFNAME: rt?.ifName ?? '',
    CNI_ARGS: rt === undefined ? '' : formatCniArgs(rt.args),
    CNI_PATH: binDirs.join(':'),
    PATH: path,
  };
}
