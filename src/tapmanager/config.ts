// tapmanager's configuration: flags over env over defaults, all in one table (pino's defaultOptions habit).
// Pure: parseConfig(argv, env) returns a config or a list of every problem found (argv through node:util parseArgs,
// src/cliargs.ts).
import { parseCli, parseListen, type OptionSpec } from '../cliargs.js';
import { isLogLevel } from '../log.js';
import { isIpv4 } from '../net/ip.js';
import type { LevelWithSilent } from 'pino';
import { BINDING_MODES, type BindingMode } from '../podnet/binding.js';

export interface TapmanagerConfig {
  socket: string;
  cniConfDir: string;
  cniBinDirs: string[];
  cniCacheDir: string;
  stateDir: string;
  logLevel: LevelWithSilent;
  /** extra group (name or gid) whose members may use the socket; the socket file gets this group */
  socketGroup?: string;
  /** per-plugin CNI timeout */
  cniTimeoutMs: number;
  /** IPv4 DNS servers DHCP serves when neither the pod nor its CNI result names one; empty: no DNS option */
  defaultDns: string[];
  enableSriov: boolean;
  sysfsRoot: string;
  /** a request must be complete this long after its first byte; idle connections are closed after as long */
  requestTimeoutMs: number;
  /** connections served at once */
  maxConnections: number;
  /** SIGTERM/SIGINT: how long running requests may take to finish before the daemon exits anyway (code 1) */
  stopTimeoutMs: number;
  /** pod netns kept made ahead of time while idle (0: none) */
  spareNetns: number;
  /** the optional HTTP listener (/healthz, /readyz, /metrics); absent = off */
  httpListen?: { host: string; port: number };
  /** how CNI interfaces are joined to the VM's taps (src/podnet/binding.ts) */
  binding: BindingMode;
  /** how old the last CNI STATUS answer may be (an add older asks again); also how often it is asked */
  cniStatusIntervalMs: number;
  /** CNI GC after the restore and then this often; 0: never (tapctl gc still runs one) */
  cniGcIntervalMs: number;
  /** --cni-gc plugins: GC goes to the plugins too (default: only the stale attachments' DEL) */
  cniGcPlugins: boolean;
  /** every ready pod checked this often; 0: never (tapctl check still runs one) */
  checkIntervalMs: number;
  help: boolean;
  /** --version: print the package version and exit */
  version: boolean;
}

interface FlagSpec {
  flag: string;
  env?: string;
  def: string;
  kind: 'string' | 'bool' | 'int';
  help: string;
}

/** Every flag, its env var and its default. README's table is written from this. */
export const FLAGS = {
  socket: {
    flag: '--socket',
    env: 'VIRTLET_FD_SERVER_SOCKET_PATH',
    def: '/var/lib/virtlet/tapfdserver.sock',
    kind: 'string',
    help: 'Unix socket to serve the fd protocol on (created with mode 0660)',
  },
  cniConfDir: {
    flag: '--cni-conf-dir',
    env: 'VIRTLET_CNI_CONFIG_DIR',
    def: '/etc/cni/net.d',
    kind: 'string',
    help: 'CNI config dir: the first .conf/.conflist/.json file in lexical order is used',
  },
  cniBinDirs: {
    flag: '--cni-bin-dir',
    env: 'VIRTLET_CNI_PLUGIN_DIR',
    def: '/opt/cni/bin',
    kind: 'string',
    help: 'CNI plugin dir(s), colon-separated, searched in order',
  },
  cniCacheDir: {
    flag: '--cni-cache-dir',
    env: 'VMPOD_CNI_CACHE_DIR',
    def: '/var/lib/cni',
    kind: 'string',
    help: 'CNI result cache dir (results/<net>-<id>-<if>, as libcni)',
  },
  stateDir: {
    flag: '--state-dir',
    env: 'VMPOD_STATE_DIR',
    def: '/var/lib/vmpod-node',
    kind: 'string',
    help: 'per-pod state records (survive a restart)',
  },
  logLevel: {
    flag: '--log-level',
    env: 'VMPOD_LOG_LEVEL',
    def: 'info',
    kind: 'string',
    help: 'fatal, error, warn, info, debug, trace or silent',
  },
  socketGroup: {
    flag: '--socket-group',
    env: 'VMPOD_SOCKET_GROUP',
    def: '',
    kind: 'string',
    help: 'group (name or gid) that owns the socket and whose members are served besides uid 0',
  },
  cniTimeoutMs: {
    flag: '--cni-timeout',
    env: 'VMPOD_CNI_TIMEOUT_MS',
    def: '60000',
    kind: 'int',
    help: 'per-plugin CNI timeout in ms; a plugin still running then is killed',
  },
  enableSriov: {
    flag: '--enable-sriov',
    env: 'VIRTLET_SRIOV_SUPPORT',
    def: 'false',
    kind: 'bool',
    help:
      'bind SR-IOV VFs found in the pod netns to vfio-pci (otherwise a VF is an error); --enable-sriov=false ' +
      'turns it off',
  },
  defaultDns: {
    flag: '--default-dns',
    env: 'VMPOD_DEFAULT_DNS',
    def: '',
    kind: 'string',
    help:
      'comma-separated IPv4 DNS servers DHCP serves when neither the pod nor its CNI result names one (default: ' +
      'none, no DNS option)',
  },
  sysfsRoot: {
    flag: '--sysfs-root',
    env: 'VMPOD_SYSFS_ROOT',
    def: '/sys',
    kind: 'string',
    help: 'where sysfs is read (tests point it at a fake tree)',
  },
  requestTimeoutMs: {
    flag: '--request-timeout',
    env: 'VMPOD_REQUEST_TIMEOUT_MS',
    def: '10000',
    kind: 'int',
    help: 'ms a request may take to arrive from its first byte; idle connections are closed after as long',
  },
  maxConnections: {
    flag: '--max-connections',
    env: 'VMPOD_MAX_CONNECTIONS',
    def: '256',
    kind: 'int',
    help: 'connections served at once; a new one beyond it gets an error reply and is closed',
  },
  stopTimeoutMs: {
    flag: '--stop-timeout',
    env: 'VMPOD_STOP_TIMEOUT_MS',
    def: '80000',
    kind: 'int',
    help: 'on SIGTERM/SIGINT, ms running requests may take to finish; then the daemon exits with code 1',
  },
  spareNetns: {
    flag: '--spare-netns',
    env: 'VMPOD_SPARE_NETNS',
    def: '1',
    kind: 'int',
    help:
      'pod netns (with their bridge and tap) made ahead of time once no add or release ran for 100 ms, for the ' +
      'next adds to take; 0 to 16, 0: none',
  },
  httpListen: {
    flag: '--http-listen',
    env: 'VMPOD_HTTP_LISTEN',
    def: '',
    kind: 'string',
    help: 'ADDR:PORT for /healthz, /readyz and /metrics over HTTP (e.g. 127.0.0.1:9731); off when empty',
  },
  binding: {
    flag: '--binding',
    env: 'VMPOD_BINDING',
    def: 'auto',
    kind: 'string',
    help:
      "how a CNI interface is joined to the VM's tap: bridge, tc-redirect, or auto (tc-redirect for macvlan and " +
      'ipvlan, whose MAC cannot move to the VM, and for a veth; bridge otherwise)',
  },
  cniStatusIntervalMs: {
    flag: '--cni-status-interval',
    env: 'VMPOD_CNI_STATUS_INTERVAL_MS',
    def: '10000',
    kind: 'int',
    help: 'ms between CNI STATUS runs of a cniVersion 1.1.0+ network; an add asks again when the last answer is older',
  },
  cniGcIntervalMs: {
    flag: '--cni-gc-interval',
    env: 'VMPOD_CNI_GC_INTERVAL_MS',
    def: '3600000',
    kind: 'int',
    help: 'ms between CNI GCs (the first right after the restore at start); 0: never',
  },
  cniGc: {
    flag: '--cni-gc',
    env: 'VMPOD_CNI_GC',
    def: '',
    kind: 'string',
    help:
      '"plugins": GC also sends CNI GC to the plugins with the live VM pods (never on a conflist shared with ' +
      "the node's container runtime); default: only DEL of stale cached attachments",
  },
  checkIntervalMs: {
    flag: '--check-interval',
    env: 'VMPOD_CHECK_INTERVAL_MS',
    def: '300000',
    kind: 'int',
    help: 'ms between checks of every ready pod (its links, MAC, DHCP server, CNI CHECK); 0: never',
  },
} as const satisfies Record<string, FlagSpec>;

type Key = keyof typeof FLAGS;

/**
 * The parseArgs options, from FLAGS: `--cni-timeout` is option `cni-timeout`; bool flags are switches that also take
 * `--flag=false` (or true, 0, 1, yes, no, on, off), which wins over the env var like any flag.
 */
const CLI_OPTIONS: Record<string, OptionSpec> = {
  ...Object.fromEntries(
    (Object.values(FLAGS) as FlagSpec[]).map((s) => [
      s.flag.slice(2),
      (s.kind === 'bool' ? { type: 'boolean', inlineValue: true } : { type: 'string' }) as OptionSpec,
    ]),
  ),
  help: { type: 'boolean', short: 'h' },
  version: { type: 'boolean' },
};
const BY_NAME = new Map<string, Key>((Object.keys(FLAGS) as Key[]).map((k) => [FLAGS[k].flag.slice(2), k]));

function parseBool(v: string): boolean | undefined {
  if (/^(1|true|yes|on)$/i.test(v)) return true;
  if (/^(0|false|no|off|)$/i.test(v)) return false;
  return undefined;
}

export type ParseResult = { ok: true; config: TapmanagerConfig } | { ok: false; errors: string[] };

/** Each flag's value as given (the flag over its env var) or its default, and the command line's errors. */
function readValues(
  argv: string[],
  env: Record<string, string | undefined>,
): { get: (k: Key) => string; errors: string[]; help: boolean; version: boolean } {
  const raw = new Map<Key, string>();
  for (const k of Object.keys(FLAGS) as Key[]) {
    const spec: FlagSpec = FLAGS[k];
    const v = spec.env ? env[spec.env] : undefined;
    if (v !== undefined && v !== '') raw.set(k, v);
  }
  const args = parseCli(argv, CLI_OPTIONS, false);
  const errors = args.errors;
  for (const [name, value] of args.values) {
    const k = BY_NAME.get(name);
    if (k) raw.set(k, value === true ? 'true' : value);
  }
  return {
    get: (k: Key): string => raw.get(k) ?? FLAGS[k].def,
    errors,
    help: args.values.has('help'),
    version: args.values.has('version'),
  };
}

/** The numeric flags, checked (each error said in `errors`). */
function readNumbers(get: (k: Key) => string, errors: string[]) {
  const timeout = Number(get('cniTimeoutMs'));
  if (!Number.isInteger(timeout) || timeout <= 0)
    errors.push(`--cni-timeout ${JSON.stringify(get('cniTimeoutMs'))} is not a positive integer (ms)`);
  const positive = (k: 'requestTimeoutMs' | 'maxConnections' | 'stopTimeoutMs'): number => {
    const v = Number(get(k));
    if (!Number.isInteger(v) || v <= 0)
      errors.push(`${FLAGS[k].flag} ${JSON.stringify(get(k))} is not a positive integer`);
    return v;
  };
  const spareNetns = Number(get('spareNetns'));
  if (!Number.isInteger(spareNetns) || spareNetns < 0 || spareNetns > 16)
    errors.push(`--spare-netns ${JSON.stringify(get('spareNetns'))} is not an integer from 0 to 16`);
  const statusInterval = Number(get('cniStatusIntervalMs'));
  if (!Number.isInteger(statusInterval) || statusInterval <= 0)
    errors.push(`--cni-status-interval ${JSON.stringify(get('cniStatusIntervalMs'))} is not a positive integer (ms)`);
  const zeroOrMore = (k: 'cniGcIntervalMs' | 'checkIntervalMs'): number => {
    const v = Number(get(k));
    if (!Number.isInteger(v) || v < 0)
      errors.push(`${FLAGS[k].flag} ${JSON.stringify(get(k))} is not a non-negative integer (ms; 0: never)`);
    return v;
  };
  return {
    cniTimeoutMs: timeout,
    requestTimeoutMs: positive('requestTimeoutMs'),
    maxConnections: positive('maxConnections'),
    stopTimeoutMs: positive('stopTimeoutMs'),
    spareNetns,
    cniStatusIntervalMs: statusInterval,
    cniGcIntervalMs: zeroOrMore('cniGcIntervalMs'),
    checkIntervalMs: zeroOrMore('checkIntervalMs'),
  };
}

export function parseConfig(argv: string[], env: Record<string, string | undefined>): ParseResult {
  const { get, errors, help, version } = readValues(argv, env);
  const numbers = readNumbers(get, errors);
  const logLevel = get('logLevel');
  if (!isLogLevel(logLevel))
    errors.push(`--log-level ${JSON.stringify(logLevel)} is not one of fatal, error, warn, info, debug, trace, silent`);
  const sriov = parseBool(get('enableSriov'));
  if (sriov === undefined)
    errors.push(`--enable-sriov / VIRTLET_SRIOV_SUPPORT ${JSON.stringify(get('enableSriov'))} is not a boolean`);
  for (const k of ['socket', 'cniConfDir', 'cniCacheDir', 'stateDir', 'sysfsRoot'] as const) {
    if (!get(k).startsWith('/')) errors.push(`${FLAGS[k].flag} ${JSON.stringify(get(k))} must be an absolute path`);
  }
  const binDirs = get('cniBinDirs')
    .split(':')
    .filter((d) => d !== '');
  if (binDirs.length === 0 || binDirs.some((d) => !d.startsWith('/'))) {
    errors.push(`--cni-bin-dir ${JSON.stringify(get('cniBinDirs'))} must be absolute paths separated by ':'`);
  }
  const defaultDns = get('defaultDns')
    .split(',')
    .map((d) => d.trim())
    .filter((d) => d !== '');
  for (const d of defaultDns) {
    if (!isIpv4(d)) errors.push(`--default-dns ${JSON.stringify(d)} is not an IPv4 address`);
  }
  const gcMode = get('cniGc');
  if (gcMode !== '' && gcMode !== 'plugins')
    errors.push(`--cni-gc / VMPOD_CNI_GC ${JSON.stringify(gcMode)} is not "plugins" (or empty)`);
  const httpRaw = get('httpListen');
  const http = httpRaw === '' ? undefined : parseListen(httpRaw);
  if (httpRaw !== '' && !http)
    errors.push(
      `--http-listen / VMPOD_HTTP_LISTEN ${JSON.stringify(httpRaw)} is not ADDR:PORT (e.g. 127.0.0.1:9731 or ` +
        `[::1]:9731)`,
    );
  const binding = BINDING_MODES.find((b) => b === get('binding'));
  if (binding === undefined)
    errors.push(
      `--binding / VMPOD_BINDING ${JSON.stringify(get('binding'))} is not one of ${BINDING_MODES.join(', ')}`,
    );
  if (errors.length > 0) return { ok: false, errors };
  const group = get('socketGroup');
  return {
    ok: true,
    config: {
      socket: get('socket'),
      cniConfDir: get('cniConfDir'),
      cniBinDirs: binDirs,
      cniCacheDir: get('cniCacheDir'),
      stateDir: get('stateDir'),
      logLevel: logLevel as LevelWithSilent,
      ...(group ? { socketGroup: group } : {}),
      ...numbers,
      enableSriov: sriov!,
      defaultDns,
      sysfsRoot: get('sysfsRoot'),
      ...(http ? { httpListen: http } : {}),
      binding: binding!,
      cniGcPlugins: gcMode === 'plugins',
      help,
      version,
    },
  };
}

export function usage(): string {
  const lines = [
    'Usage: tapmanager [flags]',
    '',
    'Serves the Virtlet fd protocol: sets up VM pod networks and hands over their tap fds.',
    '',
    'Flags (env var in brackets):',
  ];
  for (const spec of Object.values(FLAGS) as FlagSpec[]) {
    const env = spec.env ? ` [${spec.env}]` : '';
    const def = spec.def === '' ? '' : ` (default ${spec.def})`;
    lines.push(`  ${spec.flag.padEnd(16)} ${spec.help}${def}${env}`);
  }
  lines.push(`  ${'--help'.padEnd(16)} show this text`);
  lines.push(`  ${'--version'.padEnd(16)} print the package version`);
  return lines.join('\n');
}
