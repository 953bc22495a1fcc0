// vfio-device-plugin's flags: flags over env over defaults, in one table (README's table and --help are written from
// it). Pure: parseOptions(argv, env) returns the options or every problem found.
import { parseCli, parseListen, type OptionSpec } from '../cliargs.js';
import { hostRoot, sysfsRoot } from '../devices/index.js';
import { isLogLevel } from '../log.js';
import type { LevelWithSilent } from 'pino';

export interface PluginOptions {
  /** the resources file (YAML or JSON) */
  config: string;
  /** kubelet's device-plugins dir: its kubelet.sock, and our sockets */
  kubeletDir: string;
  /** where CDI spec files are written; undefined: CDI off */
  cdiDir?: string;
  httpListen?: { host: string; port: number };
  logLevel: LevelWithSilent;
  /** from VMPOD_SYSFS_ROOT and VMPOD_DEV_ROOT, as vmwrapper reads them */
  sysfsRoot: string;
  devRoot: string;
  help: boolean;
  /** --version: print the package version and exit */
  version: boolean;
  /** --probe PATH: GET PATH of the running plugin's --http-listen address, exit 0 on 200 (exec probes) */
  probe?: string;
}

interface FlagSpec {
  flag: string;
  env: string;
  def: string;
  help: string;
}

/** Every flag, its env var and its default. */
export const DP_FLAGS = {
  config: {
    flag: '--config',
    env: 'VMPOD_DP_CONFIG',
    def: '',
    help: 'the resources to advertise: a YAML or JSON file (docs/device-plugin.md); required',
  },
  kubeletDir: {
    flag: '--kubelet-dir',
    env: 'VMPOD_DP_KUBELET_DIR',
    def: '/var/lib/kubelet/device-plugins',
    help: "kubelet's device-plugins dir: its kubelet.sock is there, and this plugin's sockets go there",
  },
  cdiDir: {
    flag: '--cdi-dir',
    env: 'VMPOD_DP_CDI_DIR',
    def: '/var/run/cdi',
    help: 'where a CDI spec file per resource is written; empty: no CDI',
  },
  httpListen: {
    flag: '--http-listen',
    env: 'VMPOD_HTTP_LISTEN',
    def: '',
    help: 'ADDR:PORT for /healthz, /readyz and /metrics over HTTP; off when empty',
  },
  logLevel: {
    flag: '--log-level',
    env: 'VMPOD_LOG_LEVEL',
    def: 'info',
    help: 'fatal, error, warn, info, debug, trace or silent',
  },
} as const satisfies Record<string, FlagSpec>;

type Key = keyof typeof DP_FLAGS;

const CLI_OPTIONS: Record<string, OptionSpec> = {
  ...Object.fromEntries(
    (Object.values(DP_FLAGS) as FlagSpec[]).map((s) => [s.flag.slice(2), { type: 'string' } as OptionSpec]),
  ),
  help: { type: 'boolean', short: 'h' },
  version: { type: 'boolean' },
  probe: { type: 'string' },
};
const BY_NAME = new Map<string, Key>((Object.keys(DP_FLAGS) as Key[]).map((k) => [DP_FLAGS[k].flag.slice(2), k]));

export type ParseResult = { ok: true; options: PluginOptions } | { ok: false; errors: string[] };

export function parseOptions(argv: string[], env: Record<string, string | undefined>): ParseResult {
  // an env var that is set counts, even when empty (VMPOD_DP_CDI_DIR="" turns CDI off)
  const raw = new Map<Key, string>();
  for (const k of Object.keys(DP_FLAGS) as Key[]) {
    const v = env[DP_FLAGS[k].env];
    if (v !== undefined) raw.set(k, v);
  }
  const args = parseCli(argv, CLI_OPTIONS, false);
  const errors = args.errors;
  for (const [name, value] of args.values) {
    const k = BY_NAME.get(name);
    if (k) raw.set(k, value === true ? 'true' : value);
  }
  const help = args.values.has('help');
  const version = args.values.has('version');
  const probe = args.values.get('probe');
  const get = (k: Key): string => raw.get(k) ?? DP_FLAGS[k].def;
  const logLevel = get('logLevel') || DP_FLAGS.logLevel.def;
  if (!isLogLevel(logLevel))
    errors.push(`--log-level ${JSON.stringify(logLevel)} is not one of fatal, error, warn, info, debug, trace, silent`);
  if (probe !== undefined && !/^\/[\w./-]*$/.test(String(probe)))
    errors.push(`--probe ${JSON.stringify(probe)} is not an HTTP path (/healthz, /readyz)`);
  if (get('config') === '' && !help && !version && probe === undefined)
    errors.push('--config (or VMPOD_DP_CONFIG) is required: the file naming the resources to advertise');
  const kubeletDir = get('kubeletDir') || DP_FLAGS.kubeletDir.def;
  if (!kubeletDir.startsWith('/')) errors.push(`--kubelet-dir ${JSON.stringify(kubeletDir)} must be an absolute path`);
  const cdiDir = get('cdiDir');
  if (cdiDir !== '' && !cdiDir.startsWith('/'))
    errors.push(`--cdi-dir ${JSON.stringify(cdiDir)} must be an absolute path (or empty: no CDI)`);
  const httpRaw = get('httpListen');
  const http = httpRaw === '' ? undefined : parseListen(httpRaw);
  if (probe !== undefined && http === undefined)
    errors.push('--probe needs --http-listen (or VMPOD_HTTP_LISTEN): the address the plugin listens on');
  if (httpRaw !== '' && !http)
    errors.push(
      `--http-listen / VMPOD_HTTP_LISTEN ${JSON.stringify(httpRaw)} is not ADDR:PORT (e.g. 127.0.0.1:9732 or ` +
        `[::1]:9732)`,
    );
  if (errors.length > 0) return { ok: false, errors };
  return {
    ok: true,
    options: {
      config: get('config'),
      kubeletDir,
      ...(cdiDir !== '' ? { cdiDir } : {}),
      ...(http ? { httpListen: http } : {}),
      logLevel: logLevel as LevelWithSilent,
      sysfsRoot: sysfsRoot(env),
      devRoot: hostRoot(env),
      help,
      version,
      ...(typeof probe === 'string' ? { probe } : {}),
    },
  };
}

/** The env vars read besides the flags' own (README's table lists them too). */
export const DP_ENV_ONLY = {
  VMPOD_SYSFS_ROOT: 'where sysfs is read (default /sys; tests use fake trees)',
  VMPOD_DEV_ROOT:
    'where /dev and /proc are read: iommufd nodes, the holders of a group (default /; tests use fake trees)',
} as const;

export function dpUsage(): string {
  const lines = [
    'Usage: vfio-device-plugin --config FILE [flags]',
    '',
    'The kubelet device plugin for VFIO PCI functions, IOMMU-group aware: one gRPC socket per resource of FILE.',
    '',
    'Flags (env var in brackets):',
  ];
  for (const s of Object.values(DP_FLAGS) as FlagSpec[])
    lines.push(`  ${s.flag.padEnd(14)} ${s.help}${s.def === '' ? '' : ` (default ${s.def})`} [${s.env}]`);
  lines.push(
    `  ${'--probe PATH'.padEnd(14)} GET PATH (/healthz, /readyz) of the plugin listening on --http-listen; exit 0 ` +
      `on 200 (exec probes)`,
    `  ${'--help'.padEnd(14)} show this text`,
    `  ${'--version'.padEnd(14)} print the package version`,
    '',
    'Env only:',
  );
  for (const [k, v] of Object.entries(DP_ENV_ONLY)) lines.push(`  ${k.padEnd(18)} ${v}`);
  return lines.join('\n');
}
