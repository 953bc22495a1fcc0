// What a call threw, for tests that check the error's code and message rather than only that it threw.
import { isVmpodError, type VmpodError } from '../../src/errors.js';

/** The VmpodError f throws, as { code, message }; anything else f throws is rethrown; fails if f does not throw. */
export function errOf(f: () => unknown): { code: string; message: string } {
  try {
    f();
  } catch (e) {
    if (isVmpodError(e)) return { code: e.code, message: e.message };
    throw e;
  }
  throw new Error('did not throw');
}

/** The VmpodError f throws; anything else f throws is rethrown; fails if f does not throw. */
export function thrownVmpodError(f: () => unknown): VmpodError {
  try {
    f();
  } catch (e) {
    if (isVmpodError(e)) return e;
    throw e;
  }
  throw new Error('did not throw');
}

/** Whatever f throws (with its code, where it has one); fails if f does not throw. */
export function thrownError(f: () => unknown): Error & { code?: string } {
  try {
    f();
  } catch (e) {
    return e as Error & { code?: string };
  }
  throw new Error('did not throw');
}
