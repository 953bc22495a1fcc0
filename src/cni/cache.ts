// The ADD result cache, in libcni's format and place (libcni api.go cacheAdd/getCachedResult/cacheDel):
// <cacheDir>/results/<network>-<containerId>-<ifName>, mode 0600, a JSON record of kind "cniCacheV1".
// Being libcni's own format, cnitool and other libcni users can read our records and we theirs.
import { randomBytes } from 'node:crypto';
import { closeSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, unlinkSync, writeSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { errCode, listDir } from '../files.js';
import { join } from 'node:path';
import type { NetworkConfigList, RuntimeConf } from './config.js';

/** libcni CNICacheV1 */
export const CACHE_KIND = 'cniCacheV1';

/** libcni cachedInfo, with its JSON field names. `config` is base64 (Go marshals []byte that way). */
export interface CacheRecord {
  kind: typeof CACHE_KIND;
  containerId: string;
  config: string;
  ifName: string;
  networkName: string;
  netns?: string;
  cniArgs?: [string, string][];
  capabilityArgs?: Record<string, unknown>;
  result: unknown;
}

/** A temporary file of writeCacheRecord: `<record path>.tmp-<pid>-<8 hex>`. */
const TMP_INFIX = '.tmp-';
const TMP_NAME = /\.tmp-\d+-[0-9a-f]{8}$/;

/**
 * Daemon start: removes the temporary files a killed writer left in `<cacheDir>/results` (a record is renamed
 * into place whole, so a temporary file is never a record). Returns the names removed.
 */
export function sweepCacheTemps(cacheDir: string): string[] {
  const dir = join(cacheDir, 'results');
  const gone = listDir(dir).filter((n) => TMP_NAME.test(n));
  for (const n of gone) rmSync(join(dir, n), { force: true });
  return gone;
}

/**
 * The records of every network this attachment (container id + ifName) has a cached ADD for, whatever the
 * config dir holds now: what a DEL needs when nothing else remembers the network (libcni keeps `config` in the
 * record for this). Unreadable files are skipped.
 */
export async function cachedRecordsOf(cacheDir: string, containerId: string, ifName: string): Promise<CacheRecord[]> {
  const dir = join(cacheDir, 'results');
  const out: CacheRecord[] = [];
  for (const n of listDir(dir)) {
    if (!n.endsWith(`-${containerId}-${ifName}`) || TMP_NAME.test(n)) continue;
    const networkName = n.slice(0, -`-${containerId}-${ifName}`.length);
    const read = await readCacheRecord(join(dir, n), { networkName, containerId, ifName });
    if (read.state === 'ok' && read.record.config !== '') out.push(read.record);
  }
  return out;
}

/**
 * Every attachment of one network the cache holds (libcni GetCachedAttachments, filtered by network as its
 * GCNetworkList does): records of kind cniCacheV1 naming this network, a container id and an ifName. Files that
 * do not read or parse, and temporary files, are skipped, as libcni skips them.
 */
export async function cachedAttachments(cacheDir: string, networkName: string): Promise<CacheRecord[]> {
  const dir = join(cacheDir, 'results');
  const out: CacheRecord[] = [];
  for (const n of listDir(dir).sort()) {
    if (!n.startsWith(`${networkName}-`) || TMP_NAME.test(n)) continue;
    let o: Record<string, unknown>;
    try {
      o = JSON.parse(await readFile(join(dir, n), 'utf8')) as Record<string, unknown>;
    } catch {
      continue;
    }
    if (typeof o !== 'object' || o === null || o.kind !== CACHE_KIND || o.networkName !== networkName) continue;
    if (typeof o.containerId !== 'string' || o.containerId === '' || typeof o.ifName !== 'string' || o.ifName === '')
      continue;
    out.push(o as unknown as CacheRecord);
  }
  return out;
}

/** The file name has no separator in it: network name, container id and ifName are validated first. */
export function cacheFilePath(cacheDir: string, networkName: string, containerId: string, ifName: string): string {
  return join(cacheDir, 'results', `${networkName}-${containerId}-${ifName}`);
}

export function buildCacheRecord(list: NetworkConfigList, rt: RuntimeConf, result: unknown): CacheRecord {
  const rec: CacheRecord = {
    kind: CACHE_KIND,
    containerId: rt.containerId,
    config: list.bytes.toString('base64'),
    ifName: rt.ifName,
    networkName: list.name,
    result,
  };
  if (rt.netns !== '') rec.netns = rt.netns;
  if (rt.args.length > 0) rec.cniArgs = rt.args.map(([k, v]) => [k, v]);
  if (rt.capabilityArgs !== undefined && Object.keys(rt.capabilityArgs).length > 0)
    rec.capabilityArgs = rt.capabilityArgs;
  return rec;
}

export type CacheRead =
  | { state: 'missing' }
  | { state: 'corrupt'; reason: string }
  | { state: 'ok'; record: CacheRecord };

/**
 * Parse a cache file. A record must be of kind cniCacheV1 and name this attachment; a file from before
 * libcni had records (a bare result with a cniVersion) is accepted as that result, as libcni does.
 */
export function parseCacheRecord(
  text: string,
  expect: { networkName: string; containerId: string; ifName: string },
): CacheRead {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (e) {
    return { state: 'corrupt', reason: `not JSON (${e instanceof Error ? e.message : String(e)})` };
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return { state: 'corrupt', reason: 'not a JSON object' };
  const o = v as Record<string, unknown>;
  if (o.kind === undefined && typeof o.cniVersion === 'string') {
    return {
      state: 'ok',
      record: {
        kind: CACHE_KIND,
        containerId: expect.containerId,
        ifName: expect.ifName,
        networkName: expect.networkName,
        config: '',
        result: o,
      },
    };
  }
  if (o.kind !== CACHE_KIND) return { state: 'corrupt', reason: `kind ${JSON.stringify(o.kind)} is not ${CACHE_KIND}` };
  for (const k of ['networkName', 'containerId', 'ifName'] as const) {
    if (o[k] !== expect[k])
      return { state: 'corrupt', reason: `${k} ${JSON.stringify(o[k])} is not ${JSON.stringify(expect[k])}` };
  }
  if (typeof o.result !== 'object' || o.result === null) return { state: 'corrupt', reason: 'no result in the record' };
  return { state: 'ok', record: o as unknown as CacheRecord };
}

/**
 * Synchronous, as the write is: a page-cache file of a few KB, which a release reads before its DEL; through the pool
 * its open, stat, read and close were four trips, each waiting for a turn of the event loop.
 */
export function readCacheRecord(
  path: string,
  expect: { networkName: string; containerId: string; ifName: string },
): CacheRead {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return { state: 'missing' };
    return { state: 'corrupt', reason: `cannot read: ${(e as NodeJS.ErrnoException).code ?? String(e)}` };
  }
  return parseCacheRecord(text, expect);
}

/**
 * Write atomically: a temporary file in the same directory (mode 0600: results hold the pod's addressing), rename over
 * the target. A reader sees the old record or the new one, never half. Not fsynced, as libcni does not: DEL after a
 * crash of the machine runs without prevResult, which the CNI spec allows (the state record keeps the config).
 * Synchronous: five or six syscalls on a page-cache file, cheaper than as many trips through the thread pool (each of
 * which waited for a turn of the event loop); the directory is made only when the open finds it missing.
 */
export function writeCacheRecord(path: string, rec: CacheRecord): void {
  const tmp = `${path}${TMP_INFIX}${process.pid}-${randomBytes(4).toString('hex')}`;
  const data = Buffer.from(JSON.stringify(rec));
  const openTmp = (): number => openSync(tmp, 'wx', 0o600);
  let fd: number;
  try {
    fd = openTmp();
  } catch (e) {
    if (errCode(e) !== 'ENOENT') throw e;
    mkdirSync(join(path, '..'), { recursive: true, mode: 0o700 });
    fd = openTmp();
  }
  try {
    try {
      writeSync(fd, data, 0, data.length, 0);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, path);
  } catch (e) {
    rmSync(tmp, { force: true });
    throw e;
  }
}

/** Remove the record; a missing one is fine (DEL must succeed twice). Synchronous: one unlink. */
export function removeCacheRecord(path: string): void {
  try {
    unlinkSync(path);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code !== 'ENOENT') throw e;
  }
}
