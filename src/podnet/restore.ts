// A pod network taken up again: at daemon start from its record (restoreRecord: a ready one gets its taps reopened,
// one left adding or releasing is undone), on get after a restart (attach), and on the runtime's recover from its csn
// when no ready record is there (recoverPodNetwork, as Virtlet's recover).
import { existsSync } from 'node:fs';
import { ErrorCode, VmpodError } from '../errors.js';
import { lazyChild } from '../log.js';
import type { RecoverPayload } from '../protocol/payloads.js';
import { Phase, type PodRecord } from '../state/record.js';
import { observeNetns } from './exec.js';
import { undoRecord } from './steps.js';
import { isBusy, openFds } from './fds.js';
import { checkRecoverCsn, checkSameCsn, recoverRecord } from './recover.js';
import { quarantine, readRecord, safeWrite } from './quarantine.js';
import type { PodEnv, PodNetworkState } from './podenv.js';

/** What a restore did with a key: 'kept' when the record stays as it is (unreadable, or its taps would not open). */
export type RestoreOutcome = 'restored' | 'rolledBack' | 'netnsMissing' | 'quarantined' | 'kept' | 'none';

/**
 * The state of a ready record, taps reopened (a VF's fd is /dev/null again: the VF is not touched). A tap with queues
 * attached is held by a running VM (openFds exclusive: EBUSY; a single-queue tap takes one open file at a time anyway,
 * and on a multi-queue tap ours would be one more queue, which nobody reads and which takes its share of the VM's
 * packets): the pod is attached without fds if `tolerateBusy` (restore, recover: DHCP and release work, get says the
 * tap is in use). The taps open on a pool thread: a restore attaches every pod at once, its parallel slots then open
 * taps while the loop reads the next records and answers gets.
 */
export async function attach(env: PodEnv, rec: PodRecord, tolerateBusy = false): Promise<PodNetworkState> {
  let fds: number[] = [];
  try {
    fds = await openFds(rec.nsPath, rec.interfaces, env.log, { exclusive: true, offLoop: true });
  } catch (e) {
    if (!(tolerateBusy && isBusy(e))) throw e;
    env.log.warn(
      { key: rec.key, op: 'attach', err: e },
      'a tap is in use (a running VM holds it): attached without fds',
    );
  }
  return { key: rec.key, nsPath: rec.nsPath, csn: rec.csn!, interfaces: rec.interfaces, fds, desc: rec.desc };
}

/**
 * Restores one key at daemon start: a ready record gets its taps reopened (st); a record left adding or releasing (an
 * add or release cut off by kill -9 or a crash) is undone, with the config its ADD used, and goes.
 */
export async function restoreRecord(
  env: PodEnv,
  key: string,
): Promise<{ outcome: RestoreOutcome; st?: PodNetworkState }> {
  const log = lazyChild(env.log, { key, op: 'restore' });
  const { rec, corrupt } = readRecord(env.store, key);
  if (corrupt) log.error({ err: corrupt }, 'state record unreadable: left as it is (release the key to clean up)');
  if (!rec) return { outcome: corrupt ? 'kept' : 'none' };
  if (rec.phase === Phase.Ready && existsSync(rec.nsPath)) {
    try {
      return { outcome: 'restored', st: await attach(env, rec, true) };
    } catch (e) {
      log.error({ err: e }, 'reopening the taps failed: the record stays');
      return { outcome: 'kept' };
    }
  }
  if (rec.phase === Phase.Ready) {
    // the netns is gone (a node reboot, or someone deleted it): no guessing what else went with it; the
    // record stays, so that the runtime's release runs the CNI DEL that frees the pod's IP
    log.error(
      { nsPath: rec.nsPath },
      'pod network is recorded ready but its netns is missing: kept for release (not torn down)',
    );
    return { outcome: 'netnsMissing' };
  }
  log.warn({ phase: rec.phase, netnsExists: existsSync(rec.nsPath) }, 'undoing a pod network left halfway');
  rec.phase = Phase.Releasing;
  safeWrite(env.store, rec, log);
  const errors = await undoRecord(env.deps, rec, log);
  if (errors.length === 0) {
    env.store.remove(key);
    return { outcome: 'rolledBack' };
  }
  quarantine(env.store, rec, errors, log);
  return { outcome: 'quarantined' };
}

/**
 * Re-attaches to an existing pod network (after a restart), without CNI ADD: from its ready record, or else rebuilt
 * from the runtime's csn and the live netns. `have`: the key's live state (the same csn again is a no-op).
 */
export async function recoverPodNetwork(
  env: PodEnv,
  key: string,
  nsPath: string,
  have: PodNetworkState | undefined,
  payload: RecoverPayload,
): Promise<PodNetworkState> {
  const log = lazyChild(env.log, { key, op: 'recover' });
  // a live key: the same csn again is a no-op (the runtime retried), another one is an error
  if (have) {
    checkSameCsn(key, have.csn, payload.csn);
    if (have.fds.length === have.interfaces.length) return have;
  }
  if (!existsSync(nsPath))
    throw new VmpodError(ErrorCode.NotFound, `recover ${key}: netns ${nsPath} does not exist: nothing to recover`, {
      key,
      op: 'recover',
    });
  const { rec, corrupt } = readRecord(env.store, key);
  if (corrupt) log.warn({ err: corrupt }, 'state record unreadable: rebuilding it from the netns and the csn');
  if (rec && rec.phase === Phase.Ready && rec.csn) {
    checkSameCsn(key, rec.csn, payload.csn);
    return attach(env, rec, true);
  }
  if (rec && rec.phase !== Phase.Ready) {
    throw new VmpodError(
      ErrorCode.State,
      `recover ${key}: the pod network was left in phase "${rec.phase}"; release it`,
      { key, op: 'recover' },
    );
  }
  const csn = payload.csn;
  checkRecoverCsn(key, csn, env.enableSriov);
  const live = await observeNetns(nsPath);
  const newRec = recoverRecord({ key, nsPath, ifName: env.ifName, desc: payload.podNetworkDesc, csn, live });
  env.store.write(newRec);
  const st = await attach(env, newRec, true);
  log.info({ interfaces: newRec.interfaces.map((i) => i.tapName) }, 'pod network recovered');
  return st;
}
