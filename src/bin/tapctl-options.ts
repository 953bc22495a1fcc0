// tapctl's commands and options: one table each. --help is generated from them and README's tapctl tables match
// them (test/unit/cli-usage.test.ts). Parsing: node:util parseArgs through src/cliargs.ts.
import { parseCli, type OptionSpec } from '../cliargs.js';
import type { PortMapping } from '../protocol/payloads.js';

export const DEFAULT_SOCKET = '/var/lib/virtlet/tapfdserver.sock';

interface TapctlOption extends OptionSpec {
  /** the value's placeholder in the usage text (string options) */
  arg?: string;
  help: string;
}

export const TAPCTL_OPTIONS = {
  socket: {
    type: 'string',
    arg: 'PATH',
    help: `tapmanager's socket (default $VIRTLET_FD_SERVER_SOCKET_PATH or ${DEFAULT_SOCKET})`,
  },
  timeout: {
    type: 'string',
    arg: 'MS',
    help: 'give up on a reply after MS milliseconds (default 120000; 5000 for status --ready)',
  },
  'pod-name': { type: 'string', arg: 'NAME', help: 'the pod name (add, recover)' },
  'pod-namespace': { type: 'string', arg: 'NS', help: 'the pod namespace (add, recover)' },
  'pod-id': { type: 'string', arg: 'ID', help: 'the pod id (add, recover)' },
  dns: {
    type: 'string',
    arg: 'JSON',
    help: 'the pod DNS, as the add request carries it: {"nameservers":[..],"search":[..],"options":[..]}',
  },
  port: {
    type: 'string',
    multiple: true,
    arg: 'HOST:VM[/tcp|udp]',
    help: 'add: a hostPort of the node forwarded to a port of the VM (runtimeConfig portMappings); repeatable',
  },
  bandwidth: {
    type: 'string',
    arg: 'JSON',
    help:
      'add: the pod bandwidth (runtimeConfig bandwidth): ' +
      '{"ingressRate":bps,"ingressBurst":bits,"egressRate":bps,"egressBurst":bits}',
  },
  csn: { type: 'string', arg: 'FILE', help: 'recover: the ContainerSideNetwork JSON of an earlier add (- for stdin)' },
  running: { type: 'boolean', help: 'recover: the pod has running containers' },
  exec: { type: 'boolean', help: 'get: run the command after -- with the tap fds inherited' },
  force: { type: 'boolean', help: 'release: forget the pod even when undo steps fail; print what is left' },
  json: {
    type: 'boolean',
    help: 'list, devices: JSON for scripts instead of a table (list: a degraded pod with its check failures)',
  },
  ready: { type: 'boolean', help: 'status: one line, exit 0 only when tapmanager has restored its pods and serves' },
  'env-file': {
    type: 'string',
    arg: 'FILE',
    help: "devices: K=V lines or NUL-separated (/proc/<pid>/environ), read instead of tapctl's environment",
  },
  machine: { type: 'string', arg: 'TYPE', help: 'devices: the qemu machine type the arguments are for' },
  help: { type: 'boolean', short: 'h', help: 'show this text' },
  version: { type: 'boolean', help: 'print the package version' },
} as const satisfies Record<string, TapctlOption>;

export type TapctlOptionName = keyof typeof TAPCTL_OPTIONS;

export const TAPCTL_COMMANDS: { synopsis: string; help: string }[] = [
  {
    synopsis:
      'add KEY --pod-name NAME --pod-namespace NS [--pod-id ID] [--dns JSON] [--port HOST:VM[/tcp|udp]]... ' +
      '[--bandwidth JSON]',
    help: 'set up the pod network; prints the ContainerSideNetwork JSON',
  },
  { synopsis: 'get KEY', help: 'prints the interface descriptions (fds are received and closed)' },
  {
    synopsis: 'get KEY --exec -- CMD [ARG...]',
    help: 'runs CMD with the tap fds inherited; {fd0}, {fd1}... in ARGs become their numbers',
  },
  { synopsis: 'release KEY', help: 'tears the pod network down' },
  {
    synopsis: 'release --force KEY',
    help:
      'the same, and forgets the pod even when undo steps fail (a quarantined key); prints what could not be ' +
      'undone',
  },
  {
    synopsis: 'recover KEY --csn FILE [--pod-name NAME] [--pod-namespace NS] [--pod-id ID] [--running]',
    help: 're-attaches to an existing pod network',
  },
  {
    synopsis: 'list [--json]',
    help: 'a table of every pod network tapmanager holds (key, pod, namespace, IPs, MAC, state, age, last DHCP lease)',
  },
  {
    synopsis: 'status [--ready]',
    help:
      'says whether tapmanager answers and is ready (JSON); --ready: an exec probe (not ready also while a CNI ' +
      'plugin answers STATUS with an error)',
  },
  {
    synopsis: 'gc',
    help:
      'runs one CNI GC now (never beside an add or release); prints what it removed and every error (exit 1 on ' +
      'an error)',
  },
  {
    synopsis: 'check KEY',
    help:
      "checks the pod now: its netns, links, the VM's MAC, DHCP server, CNI CHECK; prints the failures (exit 1 " +
      'when it fails); repairs nothing',
  },
  {
    synopsis: 'devices [--env-file FILE] [--json] [--machine TYPE]',
    help:
      'what a VM started with this environment would get: each VFIO function, its IOMMU group, driver and ' +
      'source, the qemu arguments, and every refusal (exit 1 when anything is refused)',
  },
];

export function tapctlUsage(): string {
  const lines = ['Usage: tapctl [--socket PATH] [--timeout MS] COMMAND ...', '', 'Commands:'];
  for (const c of TAPCTL_COMMANDS) lines.push(`  ${c.synopsis}`, `      ${c.help}`);
  lines.push('', 'Options:');
  for (const [name, o] of Object.entries(TAPCTL_OPTIONS) as [string, TapctlOption][]) {
    lines.push(`  ${`--${name}${o.arg ? ` ${o.arg}` : ''}`.padEnd(22)} ${o.help}`);
  }
  lines.push('', 'Exit 0 on success, 1 on a server error (or not ready, or a refused device), 2 on a usage error.');
  return lines.join('\n');
}

export interface TapctlArgs {
  positional: string[];
  opts: Map<string, string | true>;
  /** every value of a repeatable option (keyed `--name`) */
  lists: Map<string, string[]>;
  rest: string[];
  errors: string[];
}

/** argv -> options (keyed `--name`), positionals, what follows `--`, and every usage problem. */
export function parseTapctlArgs(argv: string[]): TapctlArgs {
  const p = parseCli(argv, TAPCTL_OPTIONS, true);
  return {
    positional: p.positionals,
    opts: new Map([...p.values].map(([k, v]) => [`--${k}`, v])),
    lists: new Map([...p.lists].map(([k, v]) => [`--${k}`, v])),
    rest: p.rest,
    errors: p.errors,
  };
}

/** `--port HOSTPORT:VMPORT[/tcp|udp]` as a port mapping on all node addresses; undefined when malformed. Pure. */
export function parsePortFlag(s: string): PortMapping | undefined {
  const m = /^(\d{1,5}):(\d{1,5})(?:\/(tcp|udp))?$/.exec(s);
  if (!m) return undefined;
  const [hostPort, containerPort] = [Number(m[1]), Number(m[2])];
  if (hostPort < 1 || hostPort > 65535 || containerPort < 1 || containerPort > 65535) return undefined;
  return { hostPort, containerPort, protocol: m[3] === 'udp' ? 'udp' : 'tcp', hostIP: '' };
}
