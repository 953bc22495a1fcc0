// What a failed undo leaves: the record marked quarantined (phase releasing, with the errors), until the next add or
// release of the key finishes it (finishLeftover) or `tapctl release --force` drops it.
import { ErrorCode, VmpodError, errorChain } from '../errors.js';
import type { Logger } from '../log.js';
import { Phase, type PodRecord } from '../state/record.js';
import type { StateStore } from '../state/store.js';
import { undoRecord } from './steps.js';
import type { PodEnv } from './podenv.js';

/** Marks the record as what a failed undo left (phase releasing, the errors), and writes it. */
export function quarantine(store: StateStore, rec: PodRecord, errors: Error[], log: Logger): void {
  rec.phase = Phase.Releasing;
  rec.quarantine = { at: new Date().toISOString(), errors: errors.map((x) => errorChain(x)) };
  log.error(
    { errors: rec.quarantine.errors },
    'undo incomplete: what is left is quarantined until the next add or release of the key',
  );
  safeWrite(store, rec, log);
}

/**
 * A record not ready (left by a failed add or release, or a crash) found by `op`: undone now; when that fails
 * again the key stays quarantined and `op` fails saying so.
 */
export async function finishLeftover(env: PodEnv, rec: PodRecord, log: Logger, op: string): Promise<void> {
  log.warn({ phase: rec.phase, quarantine: rec.quarantine }, 'finishing what an earlier operation on this key left');
  rec.phase = Phase.Releasing;
  safeWrite(env.store, rec, log);
  const errors = await undoRecord(env.deps, rec, log);
  if (errors.length > 0) {
    quarantine(env.store, rec, errors, log);
    throw new VmpodError(
      ErrorCode.Conflict,
      `${op} ${rec.key}: what an earlier failed operation left is quarantined and still cannot be undone: ` +
        `${rec.quarantine!.errors.join('; ')}; fix the cause, or run "tapctl release --force ${rec.key}"`,
      {
        key: rec.key,
        op,
      },
    );
  }
  env.store.remove(rec.key);
  log.info('quarantine finished');
}

/** Writes the record; a failure is logged (the undo it announces goes on). */
export function safeWrite(store: StateStore, rec: PodRecord, log: Logger): void {
  try {
    store.write(rec);
  } catch (e) {
    log.error({ err: e }, 'writing the state record failed');
  }
}

/** The record (undefined when there is none), or the error that makes it unreadable (corrupt). */
export function readRecord(store: StateStore, key: string): { rec?: PodRecord; corrupt?: unknown } {
  try {
    const rec = store.read(key);
    return rec ? { rec } : {};
  } catch (e) {
    return { corrupt: e };
  }
}
