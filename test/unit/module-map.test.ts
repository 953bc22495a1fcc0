// The module map in docs/architecture.md is the rule for imports: every import in src/ (static, dynamic or type-only)
// that crosses from one module to another must go to a module that the importer's row names.
import { readFileSync, readdirSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

const SRC = resolve('src');

function sourceFiles(dir: string): string[] {
  return readdirSync(dir).flatMap((f) => {
    const p = join(dir, f);
    return statSync(p).isDirectory() ? sourceFiles(p) : p.endsWith('.ts') ? [p] : [];
  });
}

/** The module a file of src/ belongs to: its top-level directory, or its own name for a top-level file. */
function moduleOf(file: string): string {
  const parts = relative(SRC, file).split('/');
  return parts.length > 1 ? parts[0] : parts[0].replace(/\.(ts|js)$/, '');
}

/** The rows of the "Module map" table: module -> the modules it may import ('*' for any). */
function readMap(): Map<string, Set<string>> {
  const doc = readFileSync('docs/architecture.md', 'utf8');
  const section = doc.split('## Module map')[1]?.split('\n## ')[0] ?? '';
  const map = new Map<string, Set<string>>();
  for (const line of section.split('\n')) {
    const m = /^\| `([a-z0-9]+)` \|([^|]*)\|/.exec(line);
    if (m)
      map.set(
        m[1],
        new Set(
          m[2]
            .split(',')
            .map((s) => s.trim())
            .filter(Boolean),
        ),
      );
  }
  return map;
}

/** Relative imports of a file: `from '...'`, `import('...')` and `export ... from '...'`. */
function importsOf(file: string): string[] {
  const text = readFileSync(file, 'utf8');
  return [...text.matchAll(/(?:\bfrom\s+|\bimport\s*\(\s*|^import\s+)'(\.{1,2}\/[^']+)'/gm)].map((m) => m[1]);
}

describe('the module map in docs/architecture.md', () => {
  const map = readMap();
  const files = sourceFiles(SRC);

  it('names every module of src/, and only those', () => {
    const modules = new Set(files.map(moduleOf));
    expect([...map.keys()].sort()).toEqual([...modules].sort());
    for (const allowed of map.values()) for (const m of allowed) if (m !== '*') expect(modules).toContain(m);
  });

  it('every import between modules goes where the map allows', () => {
    const against: string[] = [];
    for (const file of files) {
      const from = moduleOf(file);
      for (const spec of importsOf(file)) {
        const to = moduleOf(resolve(dirname(file), spec));
        const allowed = map.get(from);
        if (to === from || allowed?.has('*') || allowed?.has(to)) continue;
        against.push(`${relative(SRC, file)} imports ${spec} (${from} -> ${to})`);
      }
    }
    expect(against).toEqual([]);
  });

  it('the map has no cycle: the arrows go one way', () => {
    const state = new Map<string, 'visiting' | 'done'>();
    const visit = (m: string, path: string[]): void => {
      if (state.get(m) === 'done') return;
      if (state.get(m) === 'visiting') throw new Error(`cycle: ${[...path, m].join(' -> ')}`);
      state.set(m, 'visiting');
      for (const n of map.get(m) ?? []) if (n !== '*') visit(n, [...path, m]);
      state.set(m, 'done');
    };
    for (const m of map.keys()) expect(() => visit(m, [])).not.toThrow();
  });

  it('the check sees a wrong import (a file under src/ importing the daemon from a codec)', () => {
    const from = moduleOf(join(SRC, 'protocol', 'x.ts'));
    const to = moduleOf(resolve(join(SRC, 'protocol'), '../tapmanager/service.js'));
    expect([from, to]).toEqual(['protocol', 'tapmanager']);
    expect(map.get(from)?.has(to)).toBe(false);
  });
});
