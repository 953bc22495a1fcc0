// Command-line parsing for tapmanager, tapctl and vfio-device-plugin: node:util parseArgs over one option table per
// program, strict in effect (an unknown option, a missing value, a value given to a switch are errors) but reporting
// every problem at once instead of the first, so a usage error lists all that is wrong. Pure.
import { parseArgs } from 'node:util';

export interface OptionSpec {
  type: 'string' | 'boolean';
  short?: string;
  /** a switch that also takes an inline value, `--name=false`, so a flag can turn off what an env var turned on */
  inlineValue?: boolean;
  /** a string option that may be given more than once: every value is kept, in order (ParsedArgs.lists) */
  multiple?: boolean;
}

export interface ParsedArgs {
  /** options given, by name without dashes: a string option's value, or true for a switch */
  values: Map<string, string | true>;
  /** every value of each `multiple` option, in argv order */
  lists: Map<string, string[]>;
  /** positional arguments before `--` */
  positionals: string[];
  /** everything after `--` */
  rest: string[];
  /** every usage problem found, in argv order */
  errors: string[];
}

export function parseCli(argv: string[], options: Record<string, OptionSpec>, allowPositionals: boolean): ParsedArgs {
  const { tokens } = parseArgs({ args: argv, options, strict: false, allowPositionals: true, tokens: true });
  const out: ParsedArgs = { values: new Map(), lists: new Map(), positionals: [], rest: [], errors: [] };
  let terminator = argv.length;
  for (const t of tokens) {
    if (t.kind === 'option-terminator') {
      terminator = t.index;
      continue;
    }
    if (t.kind === 'positional') {
      if (t.index > terminator) out.rest.push(t.value);
      else if (allowPositionals) out.positionals.push(t.value);
      else out.errors.push(`unknown argument ${JSON.stringify(t.value)}`);
      continue;
    }
    const spec = Object.hasOwn(options, t.name) ? options[t.name] : undefined;
    if (!spec) out.errors.push(`unknown argument ${JSON.stringify(argv[t.index])}`);
    else if (spec.type === 'string' && t.value === undefined) out.errors.push(`${t.rawName} needs a value`);
    else if (spec.type === 'boolean' && t.value !== undefined && !(spec.inlineValue && t.inlineValue))
      out.errors.push(`${t.rawName} takes no value`);
    else {
      out.values.set(t.name, t.value ?? true);
      if (spec.multiple === true && t.value !== undefined)
        out.lists.set(t.name, [...(out.lists.get(t.name) ?? []), t.value]);
    }
  }
  return out;
}

/** --http-listen: "ADDR:PORT" or "[v6]:PORT" to host and port (pure); undefined when malformed. */
export function parseListen(s: string): { host: string; port: number } | undefined {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^\s:[\]]+)):(\d{1,5})$/.exec(s);
  if (!m) return undefined;
  const port = Number(m[3]);
  if (port > 65535) return undefined;
  return { host: (m[1] ?? m[2])!, port };
}
