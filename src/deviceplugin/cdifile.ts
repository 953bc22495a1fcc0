// A resource's CDI spec file under --cdi-dir: written whole (a temporary file renamed over it, so a runtime never
// reads half a spec), again only when its text changes, and removed when the resource has no device (a spec must
// name one).
import { mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { CdiSpecOut } from './allocate.js';

/** vendor.example/qat -> <dir>/vmpod-vfio_vendor.example_qat.json (CDI reads *.json and *.yaml of the dir). */
export function cdiSpecFile(dir: string, resourceName: string): string {
  return join(dir, `vmpod-vfio_${resourceName.replace(/[^A-Za-z0-9_.-]/g, '_')}.json`);
}

export class CdiWriter {
  #written = new Map<string, string>();

  constructor(readonly dir: string) {}

  /** true when the file changed. */
  update(resourceName: string, spec: CdiSpecOut | undefined): boolean {
    const file = cdiSpecFile(this.dir, resourceName);
    const text = spec === undefined ? '' : `${JSON.stringify(spec, null, 2)}\n`;
    if (this.#written.get(file) === text) return false;
    if (spec === undefined) rmSync(file, { force: true });
    else {
      mkdirSync(this.dir, { recursive: true });
      const tmp = `${file}.${process.pid}.tmp`;
      writeFileSync(tmp, text, { mode: 0o644 });
      renameSync(tmp, file);
    }
    this.#written.set(file, text);
    return true;
  }
}
