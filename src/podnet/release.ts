// The release of one pod network: its taps closed, the record's undo ops run in reverse (steps.ts; the CNI DEL with
// the config the ADD ran with, then the netns removal, which takes the bridge, the tap and the filter with it), the
// record removed; when the undo cannot finish, the record stays quarantined.
import { existsSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { ErrorCode, VmpodError, errorChain, isVmpodError } from '../errors.js';
import { lazyChild, type Logger } from '../log.js';
import { parseConfList, type ConfigHold, type NetworkConfigList } from '../cni/index.js';
import { Phase, type PodRecord } from '../state/record.js';
import { startUndo } from './steps.js';
import { closeFds } from './fds.js';
import { conventionRecord } from './recover.js';
import { quarantine, readRecord } from './quarantine.js';
import { runtimeConf, type PodEnv, type PodNetworkState } from './podenv.js';

/** What release left undone with force (each step's error), empty when everything was undone. */
export interface Released {
  leftovers: string[];
}

/**
 * Releases the pod network of `key` (st: its live state, if any). force (tapctl release --force): the record goes
 * even when undo steps fail; what could not be undone is returned (and logged) instead of thrown.
 */
export async function releasePodNetwork(
  env: PodEnv,
  key: string,
  nsPath: string,
  st: PodNetworkState | undefined,
  force: boolean,
): Promise<Released> {
  const log = lazyChild(env.log, { key, op: 'release' });
  // the taps close on the pool while the undo runs: each waits for a grace period (closeFds offLoop)
  const t0 = performance.now();
  const closing = st
    ? closeFds(st.fds, log, { offLoop: true }).then(() =>
        log.debug({ ms: Math.round((performance.now() - t0) * 10) / 10 }, 'taps closed'),
      )
    : undefined;
  try {
    return await releaseRecorded(env, key, nsPath, st, log, force);
  } finally {
    await closing;
  }
}

async function releaseRecorded(
  env: PodEnv,
  key: string,
  nsPath: string,
  st: PodNetworkState | undefined,
  log: Logger,
  force: boolean,
): Promise<Released> {
  const t0 = performance.now();
  const rec = recordToRelease(env, key, nsPath, st, log);
  // the CNI DEL's plugin exec'd before the phase's write and the undo: it gets its config once the undo reaches it
  const undo = startUndo(env.deps, rec, log);
  await undo.started;
  rec.phase = Phase.Releasing;
  try {
    env.store.write(rec, false);
  } catch (e) {
    await undo.cancel(e);
    throw e;
  }
  const errors = await undo.run();
  if (errors.length > 0 && force) {
    const leftovers = errors.map((x) => errorChain(x));
    log.error(
      { leftovers },
      'release --force: undo steps failed, the record is removed anyway: what they held may remain on the node',
    );
    env.store.remove(key);
    return { leftovers };
  }
  if (errors.length > 0) {
    quarantine(env.store, rec, errors, log);
    const first = errors[0]!;
    throw new VmpodError(
      isVmpodError(first) ? first.code : ErrorCode.Internal,
      `release ${key}: ${errors.length} undo step(s) failed, the record stays quarantined for a retry (or "tapctl ` +
        `release --force ${key}"): ${errors.map((x) => errorChain(x)).join('; ')}`,
      {
        cause: new AggregateError(errors, `release ${key}`),
        key,
        op: 'release',
      },
    );
  }
  // not durable: a record that comes back after a crash of the machine is undone again, and every undo op
  // tolerates "already undone"
  log.debug({ ms: Math.round((performance.now() - t0) * 10) / 10 }, 'undone');
  await env.store.removeAsync(key);
  // the request's line says so at info; a quarantine finished here is worth one of its own
  log[rec.quarantine ? 'info' : 'debug'](
    { durationMs: Math.round(performance.now() - t0), ...(rec.quarantine ? { quarantineFinished: true } : {}) },
    'pod network released',
  );
  return { leftovers: [] };
}

/**
 * The record to undo: the key's, or for a netns without a (readable) record (an older daemon's, or a record lost) one
 * by convention: the container side cannot be restored without it, but CNI DEL frees the IPAM allocation and the
 * netns goes.
 */
function recordToRelease(
  env: PodEnv,
  key: string,
  nsPath: string,
  st: PodNetworkState | undefined,
  log: Logger,
): PodRecord {
  const { rec, corrupt } = readRecord(env.store, key);
  if (corrupt) log.error({ err: corrupt }, 'state record unreadable: releasing by convention (CNI DEL, netns removal)');
  if (rec) return rec;
  if (!existsSync(nsPath)) {
    if (corrupt) throw corrupt;
    throw new VmpodError(ErrorCode.NotFound, `no pod network for key ${key}`, { key, op: 'release' });
  }
  return conventionRecord(key, nsPath, env.ifName, st?.desc ?? { podId: key, podNs: '', podName: '' });
}

/**
 * The CNI DEL of an undo: with the cached ADD result as prevResult (the CNI client reads its cache), against the
 * network(s) the ADD used (networksForDel). With hold, the first plugin is exec'd at once and given its config once
 * hold.until resolves (CniClient.del).
 */
export function cniDel(
  env: Pick<PodEnv, 'cni' | 'loadConfList' | 'log'>,
): (rec: PodRecord, ifName: string, config?: string, hold?: ConfigHold) => Promise<void> {
  return async (rec, ifName, config, hold) => {
    for (const [i, list] of (await networksForDel(env, rec, ifName, config)).entries())
      await env.cni.del(list, runtimeConf(rec, ifName), undefined, i === 0 ? hold : undefined);
  };
}

/**
 * The network(s) a DEL runs against: the config recorded with the ADD; for a record without one (a record lost,
 * or written before configs were recorded), those the CNI cache holds for this attachment (libcni keeps the
 * config beside the result); else the config dir as it is now. A config dir that cannot be read does not stop
 * the release: the DEL is skipped, loudly (there is nothing to tell the network by).
 */
export async function networksForDel(
  env: Pick<PodEnv, 'cni' | 'loadConfList' | 'log'>,
  rec: PodRecord,
  ifName: string,
  config: string | undefined,
): Promise<NetworkConfigList[]> {
  if (config !== undefined)
    return [parseConfList(Buffer.from(config, 'base64'), `the CNI config recorded for ${rec.key}`)];
  const cached = await env.cni.cachedNetworks(rec.key, ifName);
  if (cached.length > 0) return cached;
  try {
    return [await env.loadConfList()];
  } catch (e) {
    env.log.error(
      { key: rec.key, op: 'release', err: e },
      'CNI DEL skipped: no config recorded or cached for this pod and the config dir fails; IPAM allocations of the ' +
        'pod may remain',
    );
    return [];
  }
}
