// The CLIs' option tables are the one source: --help is generated from them, README's tables say the same, and
// parsing (node:util parseArgs) reports every usage problem at once.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { parseCli } from '../../src/cliargs.js';
import { FLAGS, usage } from '../../src/tapmanager/config.js';
import { TAPCTL_COMMANDS, TAPCTL_OPTIONS, parseTapctlArgs, tapctlUsage } from '../../src/bin/tapctl-options.js';

const readme = readFileSync('README.md', 'utf8');

/** The rows of the first table after a heading: cells, backticks stripped. */
function tableAfter(heading: string): string[][] {
  const rest = readme.split(heading)[1] ?? '';
  const lines = rest.split('\n');
  const start = lines.findIndex((l) => l.startsWith('|'));
  const rows: string[][] = [];
  for (const l of lines.slice(start + 2)) {
    if (!l.startsWith('|')) break;
    rows.push(
      l
        .split('|')
        .slice(1, -1)
        .map((c) => c.trim().replace(/`/g, '')),
    );
  }
  return rows;
}

describe('tapmanager: README table = FLAGS = --help', () => {
  const rows = tableAfter('### tapmanager').filter((r) => r[0] !== '');
  it('every flag once, with its env var and default', () => {
    const specs = Object.values(FLAGS) as { flag: string; env?: string; def: string }[];
    expect(rows.map((r) => r[0]).sort()).toEqual([...specs.map((s) => s.flag), '--help', '--version'].sort());
    for (const s of specs) {
      const row = rows.find((r) => r[0] === s.flag)!;
      expect(row[1], s.flag).toBe(s.env ?? '');
      if (s.def !== '') expect(row[2], s.flag).toBe(s.def);
      else expect(['none', 'off'], s.flag).toContain(row[2]);
      expect(usage()).toContain(s.flag);
    }
  });
});

describe('tapctl: README table = TAPCTL_OPTIONS = --help', () => {
  it('every option once, and every command in --help and the README synopsis', () => {
    const rows = tableAfter('### tapctl');
    expect(rows.map((r) => r[0].split(' ')[0]).sort()).toEqual(
      Object.keys(TAPCTL_OPTIONS)
        .map((n) => `--${n}`)
        .sort(),
    );
    for (const n of Object.keys(TAPCTL_OPTIONS)) expect(tapctlUsage()).toContain(`--${n}`);
    for (const c of TAPCTL_COMMANDS) {
      expect(tapctlUsage()).toContain(c.synopsis);
      expect(readme).toContain(`tapctl ${c.synopsis.split(' ')[0]}`);
    }
  });

  it('parses options, positionals and what follows --', () => {
    const p = parseTapctlArgs(['get', 'k1', '--exec', '--socket=/s', '--', 'cat', '--json', '{fd0}']);
    expect(p.errors).toEqual([]);
    expect(p.positional).toEqual(['get', 'k1']);
    expect(p.rest).toEqual(['cat', '--json', '{fd0}']);
    expect(p.opts).toEqual(
      new Map<string, string | true>([
        ['--exec', true],
        ['--socket', '/s'],
      ]),
    );
  });

  it('names every usage problem at once', () => {
    expect(parseTapctlArgs(['list', '--bogus', '--json=yes', '-x', '--socket']).errors).toEqual([
      'unknown argument "--bogus"',
      '--json takes no value',
      'unknown argument "-x"',
      '--socket needs a value',
    ]);
  });
});

describe('parseCli', () => {
  it('refuses positionals where the program takes none', () => {
    expect(parseCli(['a', '--v', '1'], { v: { type: 'string' } }, false)).toEqual({
      values: new Map([['v', '1']]),
      lists: new Map(),
      positionals: [],
      rest: [],
      errors: ['unknown argument "a"'],
    });
  });

  it('takes -h for --help where the table says so', () => {
    expect(parseCli(['-h'], { help: { type: 'boolean', short: 'h' } }, false).values.get('help')).toBe(true);
  });
});
