// tapctl: a CLI over tapmanager's socket. Exit 0 on success, 1 on a server or runtime error, 2 on a usage error.
import { readFileSync, accessSync, constants } from 'node:fs';
import { delimiter, join } from 'node:path';
import { FdClient } from '../client/fdclient.js';
import { native } from '../native.js';
import { decodeCsn } from '../protocol/codec.js';
import { base64ToMac } from '../protocol/mac.js';
import type { PodNetworkDesc } from '../protocol/payloads.js';
import { errorChain } from '../errors.js';
import { DEFAULT_SOCKET, parsePortFlag, parseTapctlArgs, tapctlUsage, type TapctlArgs } from './tapctl-options.js';
import { collectDevices, hostRoot, Sysfs, sysfsRoot } from '../devices/index.js';
import { deviceReportJson, formatDeviceReport, parseEnvFile } from '../devices/report.js';
import { InterfaceType } from '../protocol/payloads.js';
import { buildQemuArgv } from '../qemu/index.js';
import { podTable } from '../client/podtable.js';
import type { PodSummary, StatusReport } from '../protocol/status.js';

const USAGE = tapctlUsage();

class UsageError extends Error {}

type Parsed = TapctlArgs;

function str(p: Parsed, name: string): string | undefined {
  const v = p.opts.get(name);
  return typeof v === 'string' ? v : undefined;
}

function need(p: Parsed, name: string): string {
  const v = str(p, name);
  if (v === undefined) throw new UsageError(`${name} is required`);
  return v;
}

function oneKey(p: Parsed): string {
  if (p.positional.length !== 2) throw new UsageError(`${p.positional[0]} takes exactly one KEY`);
  return p.positional[1]!;
}

function which(cmd: string): string {
  if (cmd.includes('/')) return cmd;
  for (const dir of (process.env.PATH ?? '/usr/bin:/bin').split(delimiter)) {
    const p = join(dir, cmd);
    try {
      accessSync(p, constants.X_OK);
      return p;
    } catch {
      /* next */
    }
  }
  throw new Error(`${cmd}: not found in PATH`);
}

function desc(p: Parsed, key: string, requireNames: boolean): PodNetworkDesc {
  const dns = str(p, '--dns');
  let DNS: PodNetworkDesc['DNS'] = null;
  if (dns !== undefined) {
    try {
      DNS = JSON.parse(dns) as PodNetworkDesc['DNS'];
    } catch (e) {
      throw new UsageError(`--dns is not JSON: ${(e as Error).message}`);
    }
  }
  const portMappings = (p.lists.get('--port') ?? []).map((s) => {
    const m = parsePortFlag(s);
    if (m === undefined)
      throw new UsageError(`--port ${JSON.stringify(s)} is not HOSTPORT:VMPORT[/tcp|udp] (ports 1 to 65535)`);
    return m;
  });
  const bw = str(p, '--bandwidth');
  let bandwidth: PodNetworkDesc['bandwidth'];
  if (bw !== undefined) {
    try {
      bandwidth = JSON.parse(bw) as PodNetworkDesc['bandwidth'];
    } catch (e) {
      throw new UsageError(`--bandwidth is not JSON: ${(e as Error).message}`);
    }
  }
  return {
    podId: str(p, '--pod-id') ?? key,
    podName: requireNames ? need(p, '--pod-name') : (str(p, '--pod-name') ?? ''),
    podNs: requireNames ? need(p, '--pod-namespace') : (str(p, '--pod-namespace') ?? ''),
    DNS,
    ...(portMappings.length > 0 ? { portMappings } : {}),
    ...(bandwidth !== undefined ? { bandwidth } : {}),
  };
}

/** `tapctl devices`: the same collection as vmwrapper's, printed. */
async function devices(p: Parsed, socket: string, timeout: number): Promise<number> {
  if (p.positional.length !== 1) throw new UsageError('devices takes no arguments');
  const file = str(p, '--env-file');
  const env: Record<string, string | undefined> =
    file === undefined ? process.env : parseEnvFile(readFileSync(file === '-' ? 0 : file, 'utf8'));
  const vfs: { address: string }[] = [];
  const key = env.VIRTLET_NET_KEY ?? '';
  if (key !== '') {
    const { infos, fds } = new FdClient(env.VIRTLET_FD_SERVER_SOCKET_PATH || socket, { timeoutMs: timeout }).get(key);
    for (const fd of fds) native().close(fd);
    for (const i of infos) if (i.type === InterfaceType.VF) vfs.push({ address: i.pciAddress });
  }
  const r = await collectDevices(env, { sysfs: new Sysfs(sysfsRoot(env)), hostRoot: hostRoot(env), vfs });
  const machine = str(p, '--machine');
  const libvirtArgs = machine !== undefined ? ['-machine', machine] : [];
  const j = deviceReportJson(r, buildQemuArgv(libvirtArgs, [], r.devices).slice(libvirtArgs.length));
  process.stdout.write(p.opts.has('--json') ? `${JSON.stringify(j, null, 2)}\n` : `${formatDeviceReport(j)}\n`);
  return j.refused.length > 0 || j.inputErrors.length > 0 ? 1 : 0;
}

/** What every command of the socket gets: its parsed args, the client, the socket's path. */
interface Run {
  p: Parsed;
  client: FdClient;
  socket: string;
}

const out = (v: unknown): void => void process.stdout.write(`${JSON.stringify(v, null, 2)}\n`);

function add({ p, client }: Run): number {
  const key = oneKey(p);
  out(client.add(key, desc(p, key, true)));
  return 0;
}

/** get: the interfaces printed; with --exec, the fds handed to a command (which replaces tapctl). */
function get({ p, client }: Run): number {
  const key = oneKey(p);
  if (p.opts.has('--exec')) {
    if (p.rest.length === 0) throw new UsageError('get --exec needs -- CMD [ARG...]');
    const { fds } = client.get(key);
    const args = p.rest.map((a) =>
      a.replace(/\{fd(\d+)\}/g, (m, i: string) => (fds[Number(i)] !== undefined ? String(fds[Number(i)]) : m)),
    );
    native().execve(
      which(args[0]!),
      args,
      Object.entries(process.env).map(([k, v]) => `${k}=${v}`),
      fds,
    );
  }
  const { infos, fds } = client.get(key);
  for (const fd of fds) native().close(fd);
  out(infos.map((i) => ({ ...i, macAddress: base64ToMac(i.mac) })));
  return 0;
}

function release({ p, client }: Run): number {
  if (p.opts.has('--force')) {
    const { leftovers } = client.releaseForce(oneKey(p));
    out({ released: true, leftovers });
    return 0;
  }
  client.release(oneKey(p));
  return 0;
}

function recover({ p, client }: Run): number {
  const key = oneKey(p);
  const file = need(p, '--csn');
  const csn = decodeCsn(readFileSync(file === '-' ? 0 : file));
  client.recover(key, { podNetworkDesc: desc(p, key, false), csn, HaveRunningContainers: p.opts.has('--running') });
  return 0;
}

function list({ p, client }: Run): number {
  if (p.positional.length !== 1) throw new UsageError('list takes no arguments');
  const pods = client.list() as PodSummary[];
  if (p.opts.has('--json')) out(pods);
  else process.stdout.write(`${podTable(pods)}\n`);
  return 0;
}

/** status; with --ready an exec probe: one line, exit 0 only when ready. */
function status({ p, client, socket }: Run): number {
  if (p.positional.length !== 1) throw new UsageError('status takes no arguments');
  if (!p.opts.has('--ready')) {
    out({ socket, answering: true, ...client.status() });
    return 0;
  }
  let st: StatusReport;
  try {
    st = client.status();
  } catch (e) {
    process.stdout.write(
      `not ready: tapmanager does not answer on ${socket}: ${errorChain(e).replace(/\s*\n\s*/g, ' ')}\n`,
    );
    return 1;
  }
  if (st.ready) {
    process.stdout.write(`ready: ${st.pods} pod networks, up ${st.uptimeSeconds}s\n`);
    return 0;
  }
  process.stdout.write(`not ready: ${st.reasons.join('; ')}\n`);
  return 1;
}

function gc({ p, client }: Run): number {
  if (p.positional.length !== 1) throw new UsageError('gc takes no arguments');
  const r = client.gc();
  out(r);
  return r.errors.length > 0 ? 1 : 0;
}

function check({ p, client }: Run): number {
  const r = client.check(oneKey(p));
  out(r);
  return r.ok ? 0 : 1;
}

const COMMANDS: Record<string, (r: Run) => number> = { add, get, release, recover, list, status, gc, check };

/** The args parsed, or the exit code of --help, --version or a usage error. */
async function parse(argv: string[]): Promise<Parsed | number> {
  let p: Parsed;
  try {
    p = parseTapctlArgs(argv);
    if (p.errors.length > 0) throw new UsageError(p.errors.join('; '));
  } catch (e) {
    process.stderr.write(`tapctl: ${(e as Error).message}\n${USAGE}\n`);
    return 2;
  }
  if (p.opts.has('--help')) {
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  if (p.opts.has('--version')) {
    process.stdout.write(`${(await import('../version.js')).packageVersion()}\n`);
    return 0;
  }
  return p;
}

async function main(argv: string[]): Promise<number> {
  const p = await parse(argv);
  if (typeof p === 'number') return p;
  const socket = str(p, '--socket') ?? (process.env.VIRTLET_FD_SERVER_SOCKET_PATH || DEFAULT_SOCKET);
  // a probe must answer within its own timeout: status --ready gives up after 5 s unless told otherwise
  const timeout = Number(str(p, '--timeout') ?? (p.opts.has('--ready') ? 5000 : 120000));
  try {
    if (!Number.isInteger(timeout) || timeout <= 0)
      throw new UsageError(`--timeout ${JSON.stringify(str(p, '--timeout'))} is not a positive integer`);
    const cmd = p.positional[0];
    if (cmd === 'devices') return await devices(p, socket, timeout);
    if (cmd === undefined) throw new UsageError('no command given');
    const run = Object.hasOwn(COMMANDS, cmd) ? COMMANDS[cmd] : undefined;
    if (run === undefined) throw new UsageError(`unknown command ${JSON.stringify(cmd)}`);
    return run({ p, client: new FdClient(socket, { timeoutMs: timeout }), socket });
  } catch (e) {
    if (e instanceof UsageError) {
      process.stderr.write(`tapctl: ${e.message}\n${USAGE}\n`);
      return 2;
    }
    process.stderr.write(`tapctl: ${errorChain(e)}\n`);
    return 1;
  }
}

process.exitCode = await main(process.argv.slice(2));
