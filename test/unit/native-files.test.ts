// The addon stays split by job (docs/decisions.md): each C file states its job in its first line, none passes 700
// lines, binding.gyp builds every .c file and vmpod.c's header names every file.
import { describe, expect, it } from 'vitest';
import { readFileSync, readdirSync } from 'node:fs';
import { join } from 'node:path';

const NATIVE = join(import.meta.dirname, '../../native');
const files = readdirSync(NATIVE).filter((f) => f.endsWith('.c') || f.endsWith('.h'));
const text = (f: string): string => readFileSync(join(NATIVE, f), 'utf8');

describe('native/', () => {
  it.each(files)('%s opens with a comment stating its job and stays within 700 lines', (f) => {
    expect(text(f)).toMatch(/^\/\/ \S.{20,}/);
    expect(text(f).split('\n').length).toBeLessThanOrEqual(700);
  });

  it('binding.gyp builds every .c file, and vmpod.c names each in its list of files', () => {
    const gyp = JSON.parse(readFileSync(join(NATIVE, '../binding.gyp'), 'utf8')) as {
      targets: { sources: string[] }[];
    };
    const sources = gyp.targets[0]!.sources.map((s) => s.replace('native/', ''));
    const cFiles = files.filter((f) => f.endsWith('.c'));
    expect([...sources].sort()).toEqual([...cFiles].sort());
    const head = text('vmpod.c').split('\n\n')[0]!;
    for (const f of cFiles.filter((c) => c !== 'vmpod.c'))
      expect(head, f).toMatch(new RegExp(`^//   ${f.replace('.', '\\.')} `, 'm'));
  });
});
