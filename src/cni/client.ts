// The CNI client (libcni api.go: AddNetworkList, CheckNetworkList, DelNetworkList, GetVersionInfo).
// One method per verb, all taking the network (NetworkConfigList) and the attachment (RuntimeConf).
// Inputs are validated before any plugin runs; plugins run through the injected PluginExec.
import { isAbsolute } from 'node:path';
import { performance } from 'node:perf_hooks';
import { ErrorCode, VmpodError } from '../errors.js';
import { silentLogger, type Logger } from '../log.js';
import {
  buildCacheRecord,
  cachedAttachments,
  cachedRecordsOf,
  cacheFilePath,
  readCacheRecord,
  removeCacheRecord,
  writeCacheRecord,
  type CacheRecord,
} from './cache.js';
import {
  buildEnv,
  buildOneConfig,
  CniVerb,
  parseConfList,
  validateNetworkName,
  validateRuntime,
  type NetworkConfigList,
  type PluginConf,
  type RuntimeConf,
} from './config.js';
import { CniError, CniPluginError, formatCniError, parseCniErrorJson } from './errors.js';
import { escapeOutput } from '../escape.js';
import { spawnPluginExec, findInPath, type PluginExec } from './exec.js';
import { compareVersions, convertResult, CURRENT_CNI_VERSION, normalizeResult } from './result.js';
import { CniErrorCode, type CniResult } from './types.js';

export interface CniClientOptions {
  /** where plugins are looked up, first match wins; also CNI_PATH (for delegation, e.g. to IPAM plugins) */
  binDirs: string[];
  /** libcni's /var/lib/cni: results are cached under <cacheDir>/results */
  cacheDir: string;
  exec?: PluginExec;
  /** per plugin run, default 60000 */
  timeoutMs?: number;
  log?: Logger;
}

/**
 * A plugin run started before its turn (addDeferred, del): its plugin is exec'd at once and given its config once
 * `until` resolves (a plugin reads its config to EOF before it does anything); should `until` reject, the plugin is
 * killed without its config, and the verb rejects with that reason. `onExec` is called when a plugin it holds is
 * exec'd, or its exec has failed (del holds every plugin of the list, so it may be called again): at the first call
 * the caller may go on with what the plugin's start should overlap.
 */
export interface ConfigHold {
  until: Promise<unknown>;
  onExec?: () => void;
}

/**
 * Starts a held run (`start`: addDeferred or del with the hold it is given): `execd` resolves at its first plugin's
 * exec, or once the run has settled without one (it failed before, or ran no plugin).
 */
export function startHeld<T>(
  until: Promise<unknown>,
  start: (hold: ConfigHold) => Promise<T>,
): { running: Promise<T>; execd: Promise<void> } {
  let onExec!: () => void;
  const execd = new Promise<void>((resolve) => (onExec = resolve));
  const running = (async () => start({ until, onExec }))();
  running.then(onExec, onExec);
  return { running, execd };
}

/** CHECK and a prevResult on DEL came with CNI 0.4.0 (libcni gates both on it). */
const PREV_RESULT_ON_DEL_AND_CHECK = '0.4.0';

export class CniClient {
  readonly #binDirs: string[];
  readonly #cacheDir: string;
  readonly #exec: PluginExec;
  readonly #timeoutMs: number;
  readonly #log: Logger;

  constructor(opts: CniClientOptions) {
    const problems: string[] = [];
    if (!Array.isArray(opts.binDirs) || opts.binDirs.length === 0) problems.push('binDirs is empty');
    else
      for (const d of opts.binDirs)
        if (!isAbsolute(d) || d.includes(':'))
          problems.push(`bin dir ${JSON.stringify(d)} is not an absolute path without ':'`);
    if (typeof opts.cacheDir !== 'string' || !isAbsolute(opts.cacheDir))
      problems.push(`cacheDir ${JSON.stringify(opts.cacheDir)} is not an absolute path`);
    const timeoutMs = opts.timeoutMs ?? 60_000;
    if (!Number.isSafeInteger(timeoutMs) || timeoutMs <= 0)
      problems.push(`timeoutMs ${JSON.stringify(opts.timeoutMs)} is not a positive integer`);
    if (problems.length > 0) throw new VmpodError(ErrorCode.Config, `CNI client options: ${problems.join('; ')}`);
    this.#binDirs = [...opts.binDirs];
    this.#cacheDir = opts.cacheDir;
    this.#exec = opts.exec ?? spawnPluginExec();
    this.#timeoutMs = timeoutMs;
    this.#log = opts.log ?? silentLogger();
  }

  /**
   * ADD: the plugins in order, each getting the previous one's result as prevResult (in the list's version).
   * The last result is cached and returned, normalised. On failure the error names the plugin; nothing is
   * undone here: the caller runs DEL (the spec asks for DEL after a failed ADD).
   */
  async add(list: NetworkConfigList, rt: RuntimeConf, signal?: AbortSignal): Promise<CniResult> {
    const { result, settled } = await this.addDeferred(list, rt, signal);
    await settled();
    return result;
  }

  /**
   * add, returning as soon as the last plugin has exited: the result's cache file and the runs' bookkeeping are
   * still being written, and `settled` waits for them (it rejects when the cache could not be written, which fails
   * the ADD as add would). The caller awaits it before it relies on the cache (and before a DEL it runs, in any case).
   * With hold, the first plugin is exec'd at once and given its config once hold.until resolves: what must come
   * before the ADD (the netns, a durable record) is finished while the plugin starts.
   */
  async addDeferred(
    list: NetworkConfigList,
    rt: RuntimeConf,
    signal?: AbortSignal,
    hold?: ConfigHold,
  ): Promise<{ result: CniResult; settled: () => Promise<void> }> {
    validateRuntime(list, rt, CniVerb.Add);
    const paths = await this.#findAll(list.plugins);
    const cleanups: Promise<void>[] = [];
    const settleRuns = (): Promise<unknown> => Promise.all(cleanups);
    let prev: CniResult | undefined;
    try {
      for (const [i, plugin] of list.plugins.entries()) {
        this.#checkAborted(signal, CniVerb.Add, list, plugin);
        const prevJson = prev === undefined ? undefined : this.#convertPrev(prev, list, plugin, CniVerb.Add);
        const conf = buildOneConfig(list, plugin, prevJson, rt.capabilityArgs);
        const { stdout, cleanup } = await this.#run(
          paths[i] as string,
          plugin,
          CniVerb.Add,
          list,
          rt,
          conf,
          signal,
          true,
          i === 0 ? hold : undefined,
        );
        if (cleanup) cleanups.push(cleanup);
        prev = parsePluginResult(plugin.type, CniVerb.Add, stdout, list.cniVersion);
      }
    } catch (e) {
      await settleRuns();
      throw e;
    }
    if (prev === undefined)
      throw new VmpodError(ErrorCode.Internal, `ADD network ${list.name}: the list has no plugins`);
    const path = cacheFilePath(this.#cacheDir, list.name, rt.containerId, rt.ifName);
    // written on the next turn of the event loop, once the caller has started what it does with the result (its
    // work on the pool runs meanwhile); the write resolves to its error, if any: nothing rejects before the caller asks
    const record = buildCacheRecord(list, rt, convertResult(prev, list.cniVersion));
    const cached = new Promise<VmpodError | undefined>((resolve) =>
      setImmediate(() => {
        try {
          writeCacheRecord(path, record);
          resolve(undefined);
        } catch (e) {
          resolve(
            new VmpodError(ErrorCode.Cni, `ADD network ${list.name}: cache the result in ${path}`, {
              cause: e,
              op: 'cache CNI result',
            }),
          );
        }
      }),
    );
    const result = prev;
    return {
      result,
      settled: async () => {
        const [err] = await Promise.all([cached, settleRuns()]);
        if (err !== undefined) throw err;
      },
    };
  }

  /**
   * CHECK (CNI 0.4.0+): every plugin in order, each with the cached ADD result as prevResult (or what
   * `opts.prevResult` makes of it: the runtime may know the attachment changed since, as tapmanager does). A list
   * with disableCheck skips it ('disabled'). Without a cached result there is nothing to check against: an error.
   */
  async check(
    list: NetworkConfigList,
    rt: RuntimeConf,
    opts: { signal?: AbortSignal; prevResult?: (cached: CniResult) => CniResult } = {},
  ): Promise<'checked' | 'disabled'> {
    validateRuntime(list, rt, CniVerb.Check);
    if (!supportsCheck(list)) {
      throw new CniError({
        code: CniErrorCode.IncompatibleVersion,
        msg: `configuration version "${list.cniVersion}" does not support the CHECK command`,
      });
    }
    if (list.disableCheck === true) return 'disabled';
    const paths = await this.#findAll(list.plugins);
    const cached = await this.#loadCached(list, rt);
    if (cached === undefined) {
      throw new VmpodError(
        ErrorCode.NotFound,
        `CHECK network ${list.name} for ${rt.containerId}/${rt.ifName}: no usable cached ADD result`,
      );
    }
    const prev = opts.prevResult ? opts.prevResult(cached) : cached;
    for (const [i, plugin] of list.plugins.entries()) {
      this.#checkAborted(opts.signal, CniVerb.Check, list, plugin);
      const conf = buildOneConfig(
        list,
        plugin,
        this.#convertPrev(prev, list, plugin, CniVerb.Check),
        rt.capabilityArgs,
      );
      await this.#run(paths[i] as string, plugin, CniVerb.Check, list, rt, conf, opts.signal);
    }
    return 'checked';
  }

  /**
   * STATUS (CNI 1.1.0; libcni GetStatusNetworkList): can the network take adds? Each plugin gets its own config
   * with the list's name and version, and no attachment. Unlike libcni, which stops at the first error, every
   * plugin is asked, so that each one's answer is known (the first failure is what an add is refused with).
   * A list below 1.1.0 is never asked: []. A plugin that cannot be run, or hangs past the timeout, counts as
   * error 50 (it cannot take adds either).
   */
  async status(list: NetworkConfigList, signal?: AbortSignal): Promise<PluginStatus[]> {
    if (!supportsStatusAndGc(list)) return [];
    const out: PluginStatus[] = [];
    for (const plugin of list.plugins) {
      try {
        const path = await this.#find(plugin.type);
        await this.#run(path, plugin, CniVerb.Status, list, undefined, buildOneConfig(list, plugin, undefined), signal);
        out.push({ plugin: plugin.type, code: 0, msg: '' });
      } catch (e) {
        out.push(statusOf(plugin.type, e));
      }
    }
    return out;
  }

  /**
   * GC (CNI 1.1.0; libcni GCNetworkList). First, every attachment the cache holds for this network that `valid`
   * does not name gets a DEL with the config and prevResult its record holds (libcni DELs with the list it is
   * given; the record's config is what the ADD ran with). `ifNames` narrows that to attachments of these
   * interface names (the runtime's own, in a cache dir other runtimes share); `stillHeld` spares an attachment the
   * runtime still holds though `valid` does not name it (tapmanager: a pod netns whose record was lost, which
   * recover re-attaches), and adds it to the valid ones. Then, with `plugins` and a list of 1.1.0 or later, every
   * plugin gets GC with `cni.dev/valid-attachments` (and the older `cni.dev/attachments`, which libcni sends too)
   * naming exactly those. A list with disableGC gets neither. A failure stops nothing: every one is in `errors`.
   */
  async gc(list: NetworkConfigList, valid: readonly GcAttachment[], opts: GcOptions): Promise<GcReport> {
    validateNetworkName(list.name);
    const report: GcReport = { network: list.name, removed: [], pluginsAsked: [], errors: [] };
    if (list.disableGC === true) return { ...report, disabled: true };
    const keep = new Set(valid.map((a) => `${a.containerId}\0${a.ifName}`));
    const live = [...valid];
    for (const rec of await cachedAttachments(this.#cacheDir, list.name)) {
      if (
        keep.has(`${rec.containerId}\0${rec.ifName}`) ||
        (opts.ifNames !== undefined && !opts.ifNames.includes(rec.ifName))
      )
        continue;
      if (opts.stillHeld?.({ containerId: rec.containerId, ifName: rec.ifName }) === true) {
        live.push({ containerId: rec.containerId, ifName: rec.ifName });
        continue;
      }
      try {
        await this.del(this.#recordList(rec, list), recordRuntime(rec), opts.signal);
        report.removed.push({ containerId: rec.containerId, ifName: rec.ifName });
      } catch (e) {
        report.errors.push(
          `DEL of the stale attachment ${rec.containerId}/${rec.ifName}: ${e instanceof Error ? e.message : String(e)}`,
        );
      }
    }
    if (!opts.plugins || !supportsStatusAndGc(list)) return report;
    const attachments = live.map((a) => ({ containerID: a.containerId, ifname: a.ifName }));
    for (const plugin of list.plugins) {
      const conf = {
        ...buildOneConfig(list, plugin, undefined),
        'cni.dev/valid-attachments': attachments,
        'cni.dev/attachments': attachments,
      };
      report.pluginsAsked.push(plugin.type);
      try {
        await this.#run(await this.#find(plugin.type), plugin, CniVerb.Gc, list, undefined, conf, opts.signal);
      } catch (e) {
        report.errors.push(`GC of plugin ${plugin.type}: ${e instanceof Error ? e.message : String(e)}`);
      }
    }
    return report;
  }

  /** The config a cache record's ADD ran with; the given list when the record has none (or it does not parse). */
  #recordList(rec: CacheRecord, list: NetworkConfigList): NetworkConfigList {
    if (rec.config === '') return list;
    try {
      return parseConfList(Buffer.from(rec.config, 'base64'), `CNI cache record of ${rec.containerId}/${rec.ifName}`);
    } catch (e) {
      this.#log.warn(
        { err: e, network: list.name, containerId: rec.containerId },
        'the config in a CNI cache record does not parse: DEL with the current one',
      );
      return list;
    }
  }

  /**
   * DEL: the plugins in reverse order, with the cached result as prevResult (0.4.0+); a missing or corrupt
   * cache just means no prevResult. It goes on past a failing plugin so the others still release what they
   * hold (the IPAM allocation above all), reports every failure, and keeps the cache for the retry; when all
   * succeed the cache record is removed. A second DEL succeeds (plugins must tolerate missing resources).
   * With hold, the first plugin to run is exec'd at once and given its config once hold.until resolves, as in
   * addDeferred; no plugin of the list gets its config before then (should it reject, none does).
   */
  async del(list: NetworkConfigList, rt: RuntimeConf, signal?: AbortSignal, hold?: ConfigHold): Promise<void> {
    validateRuntime(list, rt, CniVerb.Del);
    let prevJson: unknown;
    if (compareVersions(list.cniVersion, PREV_RESULT_ON_DEL_AND_CHECK) >= 0) {
      const cached = await this.#loadCached(list, rt);
      if (cached !== undefined) {
        try {
          prevJson = convertResult(cached, list.cniVersion);
        } catch (e) {
          this.#log.warn(
            { err: e, network: list.name, containerId: rt.containerId },
            'cached CNI result cannot be converted; DEL without prevResult',
          );
        }
      }
    }
    const failures: unknown[] = [];
    // each run's bookkeeping (its PID record's removal) goes on while the next plugin runs and the cache goes
    const cleanups: Promise<void>[] = [];
    for (const plugin of [...list.plugins].reverse()) {
      this.#checkAborted(signal, CniVerb.Del, list, plugin);
      try {
        const path = await this.#find(plugin.type);
        const { cleanup } = await this.#run(
          path,
          plugin,
          CniVerb.Del,
          list,
          rt,
          buildOneConfig(list, plugin, prevJson, rt.capabilityArgs),
          signal,
          true,
          // every plugin waits for it, and the first one exec'd calls onExec: the first in turn may fail before that
          hold,
        );
        if (cleanup) cleanups.push(cleanup);
      } catch (e) {
        this.#log.warn(
          { err: e, network: list.name, containerId: rt.containerId, plugin: plugin.type },
          'CNI DEL failed; continuing with the next plugin',
        );
        failures.push(e);
      }
    }
    try {
      await this.#delEnd(list, rt, failures);
    } finally {
      await Promise.all(cleanups);
    }
  }

  /** DEL's end: every failure reported, or (none) the cache record removed. */
  async #delEnd(list: NetworkConfigList, rt: RuntimeConf, failures: unknown[]): Promise<void> {
    if (failures.length === 1) throw failures[0];
    if (failures.length > 1) {
      const msgs = failures.map((f) => (f instanceof Error ? f.message : String(f)));
      throw new VmpodError(
        ErrorCode.Cni,
        `DEL network ${list.name}: ${failures.length} plugins failed: ${msgs.join('; ')}`,
        {
          cause: new AggregateError(failures, 'CNI DEL failures'),
        },
      );
    }
    removeCacheRecord(cacheFilePath(this.#cacheDir, list.name, rt.containerId, rt.ifName));
  }

  /** Every plugin of the list located (libcni FindInPath), or an error naming the first missing one. Runs nothing. */
  async locate(list: NetworkConfigList): Promise<string[]> {
    return this.#findAll(list.plugins);
  }

  /**
   * The networks this attachment has a cached ADD result for, as the config the ADD ran with (libcni keeps it in
   * the cache record): a DEL that nothing else can tell the network to. Unparsable configs are skipped (logged).
   */
  async cachedNetworks(containerId: string, ifName: string): Promise<NetworkConfigList[]> {
    const out: NetworkConfigList[] = [];
    for (const rec of await cachedRecordsOf(this.#cacheDir, containerId, ifName)) {
      try {
        out.push(parseConfList(Buffer.from(rec.config, 'base64'), `CNI cache record of ${rec.networkName}`));
      } catch (e) {
        this.#log.warn(
          { err: e, network: rec.networkName, containerId },
          'the config in a CNI cache record does not parse',
        );
      }
    }
    return out;
  }

  /** VERSION (libcni GetVersionInfo): what the plugin speaks. */
  async version(pluginType: string): Promise<{ cniVersion: string; supportedVersions: string[] }> {
    const path = await this.#find(pluginType);
    const { stdout } = await this.#exec.run({
      pluginPath: path,
      env: buildEnv(CniVerb.Version, undefined, this.#binDirs),
      stdin: Buffer.from(JSON.stringify({ cniVersion: CURRENT_CNI_VERSION })),
      timeoutMs: this.#timeoutMs,
    });
    const json = parseJson(pluginType, CniVerb.Version, stdout) as Record<string, unknown> | null;
    const sv = json?.supportedVersions;
    if (
      typeof json !== 'object' ||
      json === null ||
      typeof json.cniVersion !== 'string' ||
      !Array.isArray(sv) ||
      !sv.every((x) => typeof x === 'string')
    ) {
      throw new VmpodError(
        ErrorCode.Cni,
        `plugin ${pluginType} VERSION: the answer has no cniVersion and supportedVersions: ` +
          `${escapeOutput(stdout, 200)}`,
      );
    }
    return { cniVersion: json.cniVersion, supportedVersions: sv as string[] };
  }

  /** The cached ADD result of this attachment, normalised; undefined when missing or unreadable. */
  async cachedResult(list: NetworkConfigList, rt: RuntimeConf): Promise<CniResult | undefined> {
    validateRuntime(list, rt, CniVerb.Del);
    return this.#loadCached(list, rt);
  }

  async #loadCached(list: NetworkConfigList, rt: RuntimeConf): Promise<CniResult | undefined> {
    const path = cacheFilePath(this.#cacheDir, list.name, rt.containerId, rt.ifName);
    const read = readCacheRecord(path, {
      networkName: list.name,
      containerId: rt.containerId,
      ifName: rt.ifName,
    });
    switch (read.state) {
      case 'missing':
        return undefined;
      case 'corrupt':
        this.#log.warn({ path, reason: read.reason }, 'ignoring corrupt CNI result cache');
        return undefined;
      case 'ok':
        try {
          return normalizeResult(read.record.result, list.cniVersion);
        } catch (e) {
          this.#log.warn({ path, err: e }, 'ignoring unreadable result in the CNI cache');
          return undefined;
        }
      default: {
        const never: never = read;
        throw new VmpodError(ErrorCode.Internal, `unknown cache read state ${JSON.stringify(never)}`);
      }
    }
  }

  #find(type: string): Promise<string> {
    return this.#exec.findInPath !== undefined
      ? this.#exec.findInPath(type, this.#binDirs)
      : findInPath(type, this.#binDirs);
  }

  /** Every plugin of the list is located before the first one runs: a missing binary changes nothing. */
  async #findAll(plugins: readonly PluginConf[]): Promise<string[]> {
    const out: string[] = [];
    for (const p of plugins) out.push(await this.#find(p.type));
    return out;
  }

  #convertPrev(prev: CniResult, list: NetworkConfigList, plugin: PluginConf, verb: CniVerb): unknown {
    try {
      return convertResult(prev, list.cniVersion);
    } catch (e) {
      throw new VmpodError(
        ErrorCode.Cni,
        `${verb} network ${list.name}: prevResult for plugin ${plugin.type} cannot be written as ${list.cniVersion}`,
        { cause: e },
      );
    }
  }

  #checkAborted(signal: AbortSignal | undefined, verb: CniVerb, list: NetworkConfigList, plugin: PluginConf): void {
    if (signal?.aborted === true) {
      throw new VmpodError(ErrorCode.Cni, `${verb} network ${list.name} aborted before plugin ${plugin.type}`, {
        cause: signal.reason,
      });
    }
  }

  async #run(
    pluginPath: string,
    plugin: PluginConf,
    verb: CniVerb,
    list: NetworkConfigList,
    rt: RuntimeConf | undefined,
    conf: Record<string, unknown>,
    signal: AbortSignal | undefined,
    deferCleanup = false,
    hold?: ConfigHold,
  ): Promise<{ stdout: Buffer; stderr: Buffer; cleanup?: Promise<void> }> {
    const t0 = performance.now();
    let ok = false;
    const given = Buffer.from(JSON.stringify(conf));
    const stdin = hold ? hold.until.then(() => given) : given;
    // a run that ends before it waits for its config (its exec failed, an abort) leaves the rejection to hold's owner
    if (!Buffer.isBuffer(stdin)) stdin.catch(() => {});
    try {
      const out = await this.#exec.run({
        pluginPath,
        env: buildEnv(verb, rt, this.#binDirs),
        stdin,
        timeoutMs: this.#timeoutMs,
        ...(signal === undefined ? {} : { signal }),
        ...(deferCleanup ? { deferCleanup } : {}),
        ...(hold?.onExec ? { onExec: hold.onExec } : {}),
      });
      ok = true;
      return out;
    } finally {
      this.#log.debug(
        {
          plugin: plugin.type,
          verb,
          network: list.name,
          containerId: rt?.containerId,
          ifName: rt?.ifName,
          ok,
          durationMs: Math.round(performance.now() - t0),
        },
        'CNI plugin run',
      );
    }
  }
}

/** STATUS's answer for one plugin: 0, or the CNI error code it failed with (50: cannot take adds). */
export interface PluginStatus {
  plugin: string;
  code: number;
  msg: string;
}

/** One attachment, as CNI GC names it (spec: "cni.dev/valid-attachments": [{containerID, ifname}]). */
export interface GcAttachment {
  containerId: string;
  ifName: string;
}

export interface GcOptions {
  /** send GC to the plugins too (1.1.0 and later) */
  plugins: boolean;
  /** only attachments of these interface names are the runtime's to DEL */
  ifNames?: readonly string[];
  /** an attachment `valid` does not name that the runtime still holds: not stale */
  stillHeld?: (a: GcAttachment) => boolean;
  signal?: AbortSignal;
}

/** What a GC did: the stale attachments DEL'd, the plugins sent GC, and every failure. */
export interface GcReport {
  network: string;
  /** the list has disableGC: nothing was done */
  disabled?: true;
  removed: GcAttachment[];
  pluginsAsked: string[];
  errors: string[];
}

/** STATUS error 50 (spec): the plugin cannot take adds; 51: and existing attachments may be degraded. */
export const STATUS_CANNOT_ADD = 50;

/** CHECK came with 0.4.0 (libcni CheckNetworkList). */
export function supportsCheck(list: Pick<NetworkConfigList, 'cniVersion'>): boolean {
  return compareVersions(list.cniVersion, PREV_RESULT_ON_DEL_AND_CHECK) >= 0;
}

/** STATUS and GC came with 1.1.0; libcni runs neither for an older list. */
export function supportsStatusAndGc(list: Pick<NetworkConfigList, 'cniVersion'>): boolean {
  return compareVersions(list.cniVersion, '1.1.0') >= 0;
}

/** A failed STATUS run as its answer: the plugin's CNI error code, else 50 (a hang killed at the timeout, a crash). */
function statusOf(plugin: string, e: unknown): PluginStatus {
  if (e instanceof CniPluginError && !e.timedOut && e.cniError !== undefined) {
    const d = e.cniError.details !== undefined && e.cniError.details !== '' ? `: ${e.cniError.details}` : '';
    return { plugin, code: e.cniError.code, msg: `${e.cniError.msg}${d}` };
  }
  return { plugin, code: STATUS_CANNOT_ADD, msg: e instanceof Error ? e.message : String(e) };
}

/** The attachment a cache record names, as libcni's GCNetworkList rebuilds it for the DEL. */
function recordRuntime(rec: CacheRecord): RuntimeConf {
  return {
    containerId: rec.containerId,
    netns: rec.netns ?? '',
    ifName: rec.ifName,
    args: (rec.cniArgs ?? []).map(([k, v]) => [k, v]),
    ...(rec.capabilityArgs !== undefined ? { capabilityArgs: rec.capabilityArgs } : {}),
  };
}

function parseJson(plugin: string, verb: string, stdout: Buffer): unknown {
  try {
    return JSON.parse(stdout.toString('utf8'));
  } catch (e) {
    const shown = escapeOutput(stdout, 200);
    throw new VmpodError(
      ErrorCode.Cni,
      `plugin ${plugin} ${verb} returned a result that is not JSON: ${shown === '' ? '(empty output)' : shown}`,
      { cause: e },
    );
  }
}

/** A successful plugin's stdout as a normalised result (read as `confVersion` when it names no version). */
export function parsePluginResult(plugin: string, verb: string, stdout: Buffer, confVersion: string): CniResult {
  const json = parseJson(plugin, verb, stdout);
  // an error object on exit 0 (a plugin bug): the spec's error shape, not a result; say so rather than "unusable"
  const o = json as Record<string, unknown> | null;
  if (
    typeof o === 'object' &&
    o !== null &&
    !Array.isArray(o) &&
    o.interfaces === undefined &&
    o.ips === undefined &&
    o.ip4 === undefined
  ) {
    const err = parseCniErrorJson(stdout);
    if (err !== undefined)
      throw new VmpodError(
        ErrorCode.Cni,
        `plugin ${plugin} ${verb} exited 0 but printed a CNI error: ${formatCniError(err)}`,
      );
  }
  try {
    return normalizeResult(json, confVersion);
  } catch (e) {
    throw new VmpodError(
      ErrorCode.Cni,
      `plugin ${plugin} ${verb} returned an unusable result: ${e instanceof Error ? e.message : String(e)}`,
      { cause: e },
    );
  }
}
