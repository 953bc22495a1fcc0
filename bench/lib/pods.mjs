// The world of the pod benchmarks: a throwaway bridge + host-local CNI network (a /22, room for 500 pods and the
// baseline's; with `ipv6: 'dual'` a second range, a unique ULA /64 with an IPv6 default route; `'only'`: that alone),
// tapmanager from dist/bundle as a child process at its default log level, the C client (bench/c/vmpod-client.c) for
// our side and bare-cni (bench/c/bare-cni.c) for the baseline. Every netns, link, file and process made here has a
// unique name or a PID we keep, and goes in cleanup(), also on error or Ctrl-C.
import { spawn, execFileSync } from 'node:child_process';
import {
  mkdtempSync,
  writeFileSync,
  readFileSync,
  readdirSync,
  rmSync,
  existsSync,
  openSync,
  closeSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { connect } from 'node:net';
import { repo } from './dist.mjs';
import { helper } from './cc.mjs';
import { mustRun, run } from './cleanup.mjs';

export const CNI_BIN = '/usr/lib/cni';
export const IFNAME = 'virtlet-eth0';
const TAPMANAGER = join(repo, 'dist', 'bundle', 'tapmanager.js');

/** a free 10.200-249.x.0/22 (no host route into it) */
async function freeSubnet() {
  const routes =
    (await mustRun('ip', ['-4', 'route', 'show', 'table', 'all'])) + (await mustRun('ip', ['-4', 'addr', 'show']));
  for (let i = 0; i < 100; i++) {
    const b = randomBytes(2);
    const a = 200 + (b[0] % 50);
    const c = b[1] & 0xfc;
    if ([0, 1, 2, 3].every((d) => !routes.includes(`10.${a}.${c + d}.`)))
      return { prefix: `10.${a}.${c}`, subnet: `10.${a}.${c}.0/22` };
  }
  throw new Error('no free 10.200-249.x.0/22 subnet');
}

/** a ULA /64 (fd + 40 random bits, RFC 4193) that no route or address of the host is in: its prefix text `fdXX:X:X:` */
async function freeSubnet6() {
  const taken =
    (await mustRun('ip', ['-6', 'route', 'show', 'table', 'all'])) + (await mustRun('ip', ['-6', 'addr', 'show']));
  const group = (b) => b.readUInt16BE(0).toString(16);
  for (let i = 0; i < 100; i++) {
    const b = randomBytes(5);
    const prefix = `fd${b[0].toString(16).padStart(2, '0')}:${group(b.subarray(1, 3))}:${group(b.subarray(3, 5))}:`;
    if (!taken.includes(prefix)) return { prefix6: prefix, subnet6: `${prefix}:/64` };
  }
  throw new Error('no free ULA /64');
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** RSS (kB) and open fds of a process */
export function procMem(pid) {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const rssKb = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1]);
  return { rssMb: Math.round(rssKb / 102.4) / 10, fds: readdirSync(`/proc/${pid}/fd`).length };
}

/**
 * CPU seconds its live threads have run so far: the sum of /proc/PID/task/TID/schedstat's first field, in ns (stat's
 * user + system time counts 10 ms ticks: a round of 1600 gets is 2 or 3 of them). A thread that exits takes its time
 * with it, so the figure is for processes whose threads last (a node daemon's loop, pool and V8 threads do).
 */
export function procCpuS(pid) {
  let ns = 0;
  for (const tid of readdirSync(`/proc/${pid}/task`)) {
    try {
      ns += Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ')[0]);
    } catch {
      // the thread exited meanwhile
    }
  }
  return ns / 1e9;
}

/** opts.ipv6: 'dual' | 'only' (default: IPv4 alone) */
export async function podWorld(cleanup, { ipv6 } = {}) {
  const id = randomBytes(3).toString('hex');
  const dir = mkdtempSync(join(tmpdir(), 'vmpod-bench-'));
  cleanup.push(`remove ${dir}`, () => rmSync(dir, { recursive: true, force: true }));
  const { prefix, subnet } = await freeSubnet();
  const { prefix6, subnet6 } = ipv6 ? await freeSubnet6() : {};
  const ranges = [];
  const routes = [];
  if (ipv6 !== 'only') ranges.push([{ subnet, gateway: `${prefix}.1` }]), routes.push({ dst: '0.0.0.0/0' });
  if (ipv6) ranges.push([{ subnet: subnet6, gateway: `${prefix6}:1` }]), routes.push({ dst: '::/0' });
  const bridge = `vmpb${id}`;
  const confDir = join(dir, 'net.d');
  const cacheDir = join(dir, 'cache');
  const dataDir = join(dir, 'ipam');
  execFileSync('mkdir', ['-p', confDir, cacheDir, dataDir, join(dir, 'bare')]);
  const plugin = {
    type: 'bridge',
    bridge,
    isGateway: true,
    ipMasq: false,
    ipam: { type: 'host-local', dataDir, ranges, routes },
  };
  const netName = `vmpodbench-${id}`;
  writeFileSync(
    join(confDir, '10-bench.conflist'),
    JSON.stringify({ cniVersion: '1.0.0', name: netName, plugins: [plugin] }),
  );
  // what libcni hands the plugin for a single-plugin list: the plugin's conf with the list's name and version
  const addConf = join(dir, 'bare', 'add.json');
  writeFileSync(addConf, JSON.stringify({ cniVersion: '1.0.0', name: netName, ...plugin }));
  cleanup.push(`delete bridge ${bridge}`, async () => {
    await run('ip', ['link', 'del', 'dev', bridge]);
  });

  const client = helper('vmpod-client');
  const bareCni = helper('bare-cni');
  const ours = new Set();
  const bare = new Set();
  let seq = 0;
  const keys = (n, tag) => Array.from({ length: n }, () => `vmpb${tag}-${id}-${seq++}`);

  const daemonArgs = (stateDir, socket) => [
    process.execPath,
    TAPMANAGER,
    '--socket',
    socket,
    '--cni-conf-dir',
    confDir,
    '--cni-bin-dir',
    CNI_BIN,
    '--cni-cache-dir',
    cacheDir,
    '--state-dir',
    stateDir,
    '--log-level',
    process.env.VMPOD_BENCH_LOG_LEVEL ?? 'info',
  ];
  const world = {
    dir,
    bridge,
    subnet,
    subnet6,
    prefix6,
    confDir,
    cacheDir,
    client,
    bareCni,
    ours,
    bare,
    socket: join(dir, 'tm.sock'),
    stateDir: join(dir, 'state'),
    daemonArgs,
    keys,
    daemon: undefined,
    /** starts tapmanager (ours); resolves once its socket takes connections */
    async start(stateDir = world.stateDir, socket = world.socket) {
      const log = openSync(join(dir, 'tapmanager.log'), 'a');
      const [cmd, ...args] = daemonArgs(stateDir, socket);
      const child = spawn(cmd, args, { stdio: ['ignore', 'ignore', log] });
      closeSync(log);
      const end = Date.now() + 60_000;
      while (!(await connects(socket))) {
        if (child.exitCode !== null) throw new Error(`tapmanager exited ${child.exitCode}: ${tailLog()}`);
        if (Date.now() > end) throw new Error('tapmanager did not listen within 60 s');
        await sleep(10);
      }
      world.daemon = { pid: child.pid, child };
      return world.daemon;
    },
    /** SIGTERM the running tapmanager (ours, by the PID we started) and wait for it to be gone */
    async stop(d = world.daemon) {
      if (!d) return;
      try {
        process.kill(d.pid, 'SIGTERM');
      } catch (e) {
        if (e.code !== 'ESRCH') throw e;
      }
      const end = Date.now() + 10_000;
      while (existsSync(`/proc/${d.pid}`) && !isZombie(d.pid)) {
        if (Date.now() > end) {
          process.kill(d.pid, 'SIGKILL');
          break;
        }
        await sleep(5);
      }
      if (d === world.daemon) world.daemon = undefined;
    },
    /** adds through tapmanager: PAR clients at once; { totalMs, opsMs[] } */
    async add(ks, par = 1) {
      const r = await clientSet('add', ks, par);
      for (const k of ks) ours.add(k);
      return r;
    },
    async release(ks, par = 1) {
      const r = await clientSet('release', ks, par);
      for (const k of ks) ours.delete(k);
      return r;
    },
    /** the same adds, bare: `ip netns add` + the bridge plugin's ADD exec'd by bare-cni */
    async bareAdd(names, par = 1) {
      for (const n of names) bare.add(n);
      return bareSet('add', addConf, names, par);
    },
    async bareDel(names, par = 1) {
      // libcni's DEL: the conf with the cached ADD result as prevResult (made here, outside the timed work)
      for (const n of names) {
        const prev = JSON.parse(readFileSync(join(dir, 'bare', `${n}.result.json`), 'utf8'));
        writeFileSync(
          join(dir, 'bare', `${n}.del.json`),
          JSON.stringify({ cniVersion: '1.0.0', name: netName, ...plugin, prevResult: prev }),
        );
      }
      const r = await bareSet('del', join(dir, 'bare', '%s.del.json'), names, par);
      for (const n of names) bare.delete(n);
      return r;
    },
  };
  const tailLog = () => {
    try {
      return readFileSync(join(dir, 'tapmanager.log'), 'utf8').slice(-2000);
    } catch {
      return '';
    }
  };
  async function clientSet(op, ks, par) {
    if (ks.length === 0) return { totalMs: 0, opsMs: [] };
    const out = join(dir, `lat-${op}`);
    const r = await run(client, [op, world.socket, String(par), out, ...ks], { timeoutMs: 600_000 });
    if (r.code !== 0) throw new Error(`vmpod-client ${op}: ${r.stderr.trim()} ${tailLog()}`);
    const opsMs = [];
    for (let w = 0; w < par; w++) {
      const f = `${out}.${w}`;
      if (existsSync(f))
        opsMs.push(
          ...readFileSync(f, 'utf8')
            .trim()
            .split('\n')
            .filter(Boolean)
            .map((x) => Number(x) / 1000),
        );
    }
    return { totalMs: Number(r.stdout.trim()) / 1000, opsMs };
  }
  async function bareSet(op, conf, names, par) {
    const r = await run(
      bareCni,
      [op, conf, join(dir, 'bare', '%s.result.json'), CNI_BIN, 'bridge', IFNAME, String(par), ...names],
      { timeoutMs: 600_000 },
    );
    if (r.code !== 0) throw new Error(`bare-cni ${op}: ${r.stderr.trim()}`);
    const lines = r.stdout.trim().split('\n');
    return {
      totalMs: Number(lines.find((l) => l.startsWith('total ')).slice(6)) / 1000,
      opsMs: lines.filter((l) => l.startsWith('op ')).map((l) => Number(l.slice(3)) / 1000),
      // each op's `ip netns` and plugin times, in the order the ops ran (with par 1, the order of names)
      partsMs: lines
        .filter((l) => l.startsWith('part '))
        .map((l) => {
          const [, a, x, b, y] = l.split(' ');
          return { [a]: Number(x) / 1000, [b]: Number(y) / 1000 };
        }),
    };
  }
  // cleanup, in this order (LIFO): whatever pods are left, then the daemon, then the bridge and the dir (above)
  cleanup.push('stop tapmanager', () => world.stop());
  cleanup.push('release our pods', async () => {
    if (ours.size === 0) return;
    if (!world.daemon) await world.start();
    await world.release([...ours], 8);
  });
  cleanup.push('delete the baseline pods', async () => {
    const added = [...bare].filter((n) => existsSync(join(dir, 'bare', `${n}.result.json`)));
    for (const n of bare)
      if (!added.includes(n) && existsSync(`/var/run/netns/${n}`)) await run('ip', ['netns', 'del', n]);
    if (added.length > 0) await world.bareDel(added, 8);
  });
  return world;
}

function isZombie(pid) {
  try {
    return readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].startsWith('Z');
  } catch {
    return true;
  }
}

/** does the Unix socket take a connection? */
function connects(path) {
  return new Promise((resolve) => {
    const c = connect(path);
    c.once('connect', () => {
      c.destroy();
      resolve(true);
    });
    c.once('error', () => resolve(false));
  });
}
