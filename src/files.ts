// Small file-system helpers shared by the stores (state records, the CNI cache, plugin process-group records).
import { readdirSync } from 'node:fs';

/** The names in a directory; a directory that does not exist has none. Other errors are thrown. */
export function listDir(dir: string): string[] {
  try {
    return readdirSync(dir);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw e;
  }
}

export const errCode = (e: unknown): string | undefined => (e as NodeJS.ErrnoException | undefined)?.code;
