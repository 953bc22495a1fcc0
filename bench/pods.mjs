#!/usr/bin/env node
// Pod network figures against their bare baselines, interleaved in one run (root; after `npm run build`):
//   node bench/pods.mjs [--runs 30] [--warmup 5] [--counts 10,100,250,500] [--burst 250] [--gets 200] [--rounds 5]
//                       [--figures add,burst,scale] [--strace] [--stack v4|dual|only] [--pause 150]
// add       one add / one release through tapmanager (the C client, bench/c/vmpod-client.c) vs bare-cni
//           (bench/c/bare-cni.c: `ip netns add` + the bridge plugin's ADD exec'd as libcni does; DEL, its cache file
//           removed, + `ip netns del`);
//           the sides take turns going first, and rounds are --pause ms apart (default 150: the kernel's netns
//           removal settled; a node's pod starts come seconds apart, and both sides slow down the longer the machine
//           idles before them: bench/idle-penalty.mjs; the add@N rounds of scale too);
//           --warmup untimed rounds of both sides first (a fresh daemon's first adds compile its code)
// burst     --rounds rounds: --burst bare adds by 16 clients at once, then their DELs, and the same count of adds
//           through tapmanager, 16 at once, then their releases, the sides taking turns going first, 3 s for the
//           kernel after each; tapmanager's RSS and fds at 0 and after its first burst
// scale     for each count of pods present: add and release (as `add`), get by 8 client processes at once vs a
//           minimal C server answering the same bytes and fd (bench/c/fd-echo-server.c; --rounds rounds, the sides
//           taking turns going first, after 3 s for the kernel; get@N-held: the same server keeping each connection
//           until its client hangs up, as the protocol makes a server do), and restart: spawn ->
//           first answer and -> every pod answered get, vs an empty tapmanager's spawn -> first answer
// --stack     the network both sides use: IPv4 (default), dual-stack or IPv6-only host-local ranges; the figures of
//             dual and only get a suffix (add-v6dual, ...)
// Prints one JSON line per figure ({"figure": ...}, see lib/figure.mjs). Reported, never asserted.
import { parseArgs } from 'node:util';
import { spawn } from 'node:child_process';
import { readFileSync, readdirSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { Cleanup, run } from './lib/cleanup.mjs';
import { podWorld, procMem, procCpuS } from './lib/pods.mjs';
import { figure as plainFigure, measure as plainMeasure } from './lib/figure.mjs';
import { helper } from './lib/cc.mjs';

const { values: o } = parseArgs({
  options: {
    runs: { type: 'string', default: '30' },
    warmup: { type: 'string', default: '5' },
    counts: { type: 'string', default: '10,100,250,500' },
    burst: { type: 'string', default: '250' },
    gets: { type: 'string', default: '200' },
    rounds: { type: 'string', default: '5' },
    figures: { type: 'string', default: 'add,burst,scale' },
    strace: { type: 'boolean', default: false },
    pause: { type: 'string', default: '150' },
    stack: { type: 'string', default: 'v4' },
  },
});
const runs = Number(o.runs);
const warmup = Number(o.warmup);
const counts = o.counts.split(',').map(Number);
const burstN = Number(o.burst);
const gets = Number(o.gets);
const rounds = Number(o.rounds);
const want = new Set(o.figures.split(','));
if (!['v4', 'dual', 'only'].includes(o.stack)) throw new Error(`--stack ${o.stack}: v4, dual or only`);
// figures of an IPv6 network are named apart: add-v6dual, release-burst-250x16-v6only, ...
const suffix = o.stack === 'v4' ? '' : `-v6${o.stack}`;
const figure = (name, ...rest) => plainFigure(`${name}${suffix}`, ...rest);
const measure = (name, ...rest) => plainMeasure(`${name}${suffix}`, ...rest);
const CLIENTS = 8;
const PAR = 16;

if (process.getuid?.() !== 0) throw new Error('needs root (netns, bridge, tap)');
const cleanup = new Cleanup();
cleanup.installGuards('pods', 1_800_000);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
/** the pause between two rounds of the add figure */
const SETTLE_MS = Number(o.pause);
if (!Number.isInteger(SETTLE_MS) || SETTLE_MS < 150) throw new Error(`--pause ${o.pause}: 150 ms or more`);
/** the pause after a burst's releases: the kernel removes 250 netns in the background for a second or two */
const BURST_SETTLE_MS = 3000;

async function addRelease(w, label, n) {
  const ours = { add: [], release: [] };
  const bare = { add: [], release: [] };
  // untimed rounds first, on both sides: a daemon's first adds after its start compile its code (the JIT), and the
  // bare side gets its binaries into the page cache; the figure is the steady state a node's pods see
  for (let i = 0; i < warmup; i++) {
    const [k] = w.keys(1, 'w');
    const [b] = w.keys(1, 'y');
    await w.add([k]);
    await w.bareAdd([b]);
    await w.release([k]);
    await w.bareDel([b]);
    await sleep(SETTLE_MS);
  }
  for (let i = 0; i < n; i++) {
    // interleaved, so both sides see the same machine, and each goes first every other time: the first add of a
    // round runs while the kernel still tears down the two netns released just before (cleanup_net holds the
    // locks that a new netns and a veth take), so a fixed order would charge that to one side only
    const [k] = w.keys(1, 'a');
    const [b] = w.keys(1, 'x');
    const sides = [
      [ours, () => w.add([k]), () => w.release([k])],
      [bare, () => w.bareAdd([b]), () => w.bareDel([b])],
    ];
    if (i % 2) sides.reverse();
    for (const [into, add] of sides) into.add.push(...(await add()).opsMs);
    for (const [into, , release] of sides) into.release.push(...(await release()).opsMs);
    // and the kernel's removal of the two netns (cleanup_net, a workqueue) is over before the next round's adds
    await sleep(SETTLE_MS);
  }
  const syscalls = o.strace && label === '' ? await straceAdds(w) : undefined;
  figure(`add${label}`, 'ms', ours.add, bare.add, {
    ...(syscalls ? { extra: { syscallsPerAdd: syscalls } } : {}),
    goal: 1.2,
    what: 'add over the socket (C client)',
    baselineWhat: "ip netns add + bridge ADD, exec'd by a C program",
  });
  figure(`release${label}`, 'ms', ours.release, bare.release, {
    goal: 1.05,
    what: 'release over the socket',
    baselineWhat: "bridge DEL + ip netns del, exec'd by a C program",
  });
}

/** what one add costs tapmanager in syscalls (all its threads, children not followed) and which programs it execs */
async function straceAdds(w, n = 3) {
  const out = join(w.dir, 'strace-add.txt');
  const outf = join(w.dir, 'strace-add-exec.txt');
  // every thread of the daemon (libuv's pool does the async fs work), its children not followed
  const tids = readdirSync(`/proc/${w.daemon.pid}/task`).flatMap((t) => ['-p', t]);
  // a thread takes one tracer: counts in one pass, the programs exec'd (children followed) in a second
  for (const args of [
    ['-c', '-o', out, ...tids],
    ['-f', '-e', 'trace=execve', '-e', 'signal=none', '-qq', '-o', outf, '-p', String(w.daemon.pid)],
  ]) {
    const t = tracer(args);
    await sleep(1000);
    const ks = w.keys(n, 's');
    try {
      await w.add(ks);
    } finally {
      await t.stop();
    }
    await w.release(ks);
  }
  const rows = readFileSync(out, 'utf8')
    .split('\n')
    .filter((l) => /^\s*\d/.test(l))
    .map((l) => l.trim().split(/\s+/));
  const per = {};
  for (const r of rows) {
    const name = r[r.length - 1];
    const calls = Number(r[3]);
    if (name !== 'total' && Number.isFinite(calls)) per[name] = Math.round((calls / n) * 10) / 10;
  }
  const execs = readFileSync(outf, 'utf8')
    .split('\n')
    .filter((l) => l.includes('execve(') && !l.includes('ENOENT'));
  const programs = {};
  for (const l of execs) {
    const m = /execve\("([^"]+)"/.exec(l);
    if (m) programs[m[1]] = (programs[m[1]] ?? 0) + 1 / n;
  }
  const top = Object.entries(per)
    .sort((a, b) => b[1] - a[1])
    .slice(0, 12);
  return {
    daemonCallsPerAdd: Math.round(Object.values(per).reduce((a, b) => a + b, 0)),
    fsyncPerAdd: (per.fsync ?? 0) + (per.fdatasync ?? 0),
    top: Object.fromEntries(top),
    execsPerAdd: Object.fromEntries(Object.entries(programs).map(([k, v]) => [k, Math.round(v * 10) / 10])),
  };
}

/** strace attached to the daemon; stop() ends it (SIGINT) and resolves when it has written its output */
function tracer(args) {
  const c = spawn('strace', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let err = '';
  c.stderr.on('data', (d) => (err += d));
  const exited = new Promise((res) => c.once('close', (code, sig) => res({ code, sig })));
  return {
    async stop() {
      if (c.exitCode === null && c.signalCode === null) c.kill('SIGINT');
      const r = await exited;
      if (r.code !== 0 && r.sig !== 'SIGINT')
        throw new Error(`strace ${args.join(' ')}: exit ${r.code ?? r.sig}: ${err.trim()}`);
    },
  };
}

async function burst(w) {
  const d = w.daemon;
  const mem0 = procMem(d.pid);
  let mem1;
  const ours = { add: [], release: [], cpu: [], p50: [] };
  const bare = { add: [], release: [], p50: [] };
  // --rounds rounds, the sides taking turns going first; each side starts from the same node: the other side's pods
  // are gone (and the kernel has removed their netns) before it comes (with them present, every add costs more: the
  // bridge plugin's work and the node bridge's flooding grow with its ports)
  for (let round = 0; round < rounds; round++) {
    const sides = [
      async () => {
        const bs = w.keys(burstN, 'y');
        const b = await w.bareAdd(bs, PAR);
        bare.add.push(b.totalMs);
        bare.p50.push(pick(b.opsMs, 50));
        bare.release.push((await w.bareDel(bs, PAR)).totalMs);
      },
      async () => {
        const ks = w.keys(burstN, 'b');
        const cpu0 = procCpuS(d.pid);
        const r = await w.add(ks, PAR);
        ours.cpu.push(((procCpuS(d.pid) - cpu0) / burstN) * 1e3);
        mem1 ??= procMem(d.pid);
        ours.add.push(r.totalMs);
        ours.p50.push(pick(r.opsMs, 50));
        ours.release.push((await w.release(ks, PAR)).totalMs);
      },
    ];
    if (round % 2) sides.reverse();
    for (const side of sides) {
      await side();
      await sleep(BURST_SETTLE_MS);
    }
  }
  const med = (xs) => pick(xs, 50);
  measure('memory@0', 'MB/fds', mem0);
  measure(`memory@${burstN}`, 'MB/fds', mem1, { goalRssMb: 100 });
  figure(`add-burst-${burstN}x${PAR}`, 'ms', ours.add, bare.add, {
    goal: 1.3,
    what: `${burstN} adds, ${PAR} clients at once: wall time`,
    baselineWhat: `the same ${burstN} bare adds, ${PAR} at once`,
    extra: {
      daemonCpuMsPerAdd: Math.round(med(ours.cpu) * 10) / 10,
      oursAddP50: med(ours.p50),
      bareAddP50: med(bare.p50),
    },
  });
  figure(`release-burst-${burstN}x${PAR}`, 'ms', ours.release, bare.release, {
    goal: 1.5,
    what: `${burstN} releases, ${PAR} at once: wall time`,
    baselineWhat: `the same ${burstN} bare DELs, ${PAR} at once`,
  });
}

function pick(xs, p) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)];
}

/** CLIENTS processes of `vmpod-client loop` at once against socket; latencies (us) */
async function getRound(w, socket, key, tag) {
  const outs = Array.from({ length: CLIENTS }, (_, i) => join(w.dir, `get-${tag}-${i}`));
  const rs = await Promise.all(
    outs.map((out) => run(w.client, ['loop', socket, key, String(gets), out], { timeoutMs: 300_000 })),
  );
  const bad = rs.find((r) => r.code !== 0);
  if (bad) throw new Error(`get client: ${bad.stderr}`);
  return outs.flatMap((f) => readFileSync(f, 'utf8').trim().split('\n').map(Number));
}

/** The C server answering get's reply (bench/c/fd-echo-server.c); hold: it keeps each connection until its EOF. */
async function startEcho(w, reply, name, hold) {
  const sock = join(w.dir, `${name}.sock`);
  const args = [sock, reply, '1', ...(hold ? ['hold'] : [])];
  const child = spawn(helper('fd-echo-server'), args, { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise((res, rej) => {
    child.stdout.once('data', res);
    child.once('exit', (code) => rej(new Error(`fd-echo-server exited ${code}`)));
  });
  return { sock, pid: child.pid, stop: () => child.kill('SIGTERM') };
}

/** one side of get@N: its socket, the process whose CPU it costs, its latencies and CPU over the rounds */
function getSide(tag, socket, pid) {
  return { tag, socket, pid, samples: [], cpuS: 0 };
}

async function getFigure(w, n) {
  const key = [...w.ours][0];
  const reply = join(w.dir, 'get-reply.bin');
  const c = await run(w.client, ['capture', w.socket, key, reply]);
  if (c.code !== 0) throw new Error(`capture: ${c.stderr}`);
  const echo = await startEcho(w, reply, 'echo', false);
  cleanup.push('stop fd-echo-server', echo.stop);
  const held = await startEcho(w, reply, 'held', true);
  cleanup.push('stop fd-echo-server hold', held.stop);
  const sides = [
    getSide('o', w.socket, w.daemon.pid),
    getSide('e', echo.sock, echo.pid),
    getSide('h', held.sock, held.pid),
  ];
  const [ours, base, hold] = sides;
  // the kernel first finishes removing the netns the add rounds just released (cleanup_net takes CPU for a second or
  // two), and the sides take turns going first, as in the other figures
  await sleep(BURST_SETTLE_MS);
  for (let r = 0; r < rounds; r++) {
    for (let i = 0; i < sides.length; i++) {
      const side = sides[(r + i) % sides.length];
      const c0 = procCpuS(side.pid);
      side.samples.push(...(await getRound(w, side.socket, key, side.tag)));
      side.cpuS += procCpuS(side.pid) - c0;
    }
  }
  let syscalls;
  if (o.strace)
    syscalls = {
      ours: await straceGets(w, w.daemon.pid, w.socket, key),
      baseline: await straceGets(w, echo.pid, echo.sock, key),
    };
  echo.stop();
  held.stop();
  const total = rounds * CLIENTS * gets;
  const cpuUs = (side) => Math.round((side.cpuS / total) * 1e6);
  figure(`get@${n}`, 'us', ours.samples, base.samples, {
    goal: 1.5,
    goalP99: 2,
    what: `get, ${CLIENTS} client processes at once, ${n} pods present`,
    baselineWhat: 'a C server answering the same bytes and fd',
    extra: {
      cpuUsPerGet: { ours: cpuUs(ours), baseline: cpuUs(base) },
      ...(syscalls ? { syscallsPerGet: syscalls } : {}),
    },
  });
  // for reading get@N, without a goal of its own: the same C server doing what the protocol makes every server do
  // after a get, keeping the connection until its client hangs up (the same rounds of ours)
  figure(`get@${n}-held`, 'us', ours.samples, hold.samples, {
    what: `get, ${CLIENTS} client processes at once, ${n} pods present`,
    baselineWhat: 'the C server keeping each answered connection until its EOF, read 1 ms later',
    extra: { cpuUsPerGet: { ours: cpuUs(ours), baseline: cpuUs(hold) } },
  });
}

/** syscalls per get of the server: strace -c -f on it during one client's 200 gets */
async function straceGets(w, pid, socket, key) {
  const out = join(w.dir, `strace-${pid}.txt`);
  const st = tracer(['-c', '-f', '-o', out, '-p', String(pid)]);
  await sleep(500);
  let r;
  try {
    r = await run(w.client, ['loop', socket, key, '200', join(w.dir, 'strace-lat')]);
  } finally {
    await st.stop();
  }
  if (r.code !== 0) throw new Error(r.stderr);
  const text = readFileSync(out, 'utf8');
  const total = /\s(\d+)\s+(\d+)?\s*total/.exec(text);
  const calls = Number(text.trim().split('\n').pop().trim().split(/\s+/)[3]);
  return {
    perGet: Math.round((calls / 200) * 10) / 10,
    table: text
      .split('\n')
      .slice(2, 14)
      .map((l) => l.trim())
      .filter((l) => !l.startsWith('--')),
    total: total?.[0],
  };
}

async function restartFigure(w, n) {
  const emptyState = join(w.dir, 'state-empty');
  mkdirSync(emptyState, { recursive: true });
  const emptySock = join(w.dir, 'empty.sock');
  const ours = [];
  const all = [];
  const base = [];
  for (let r = 0; r < rounds; r++) {
    await w.stop();
    const x = await run(w.client, ['restart', w.socket, ...w.ours, '--', ...w.daemonArgs(w.stateDir, w.socket)], {
      timeoutMs: 120_000,
      env: { ...process.env, VMPOD_BENCH_LOG: join(w.dir, 'tapmanager.log') },
    });
    if (x.code !== 0) throw new Error(`restart: ${x.stderr}`);
    const j = JSON.parse(x.stdout);
    w.daemon = { pid: j.pid };
    ours.push(j.firstAnswerUs / 1000);
    all.push(j.allAnsweredUs / 1000);
    const y = await run(w.client, ['restart', emptySock, '--', ...w.daemonArgs(emptyState, emptySock)], {
      timeoutMs: 120_000,
    });
    if (y.code !== 0) throw new Error(`restart empty: ${y.stderr}`);
    const e = JSON.parse(y.stdout);
    base.push(e.firstAnswerUs / 1000);
    await w.stop({ pid: e.pid });
  }
  figure(`restart@${n}`, 'ms', ours, base, {
    goal: 1.2,
    what: `spawn -> first answer, ${n} pods recorded`,
    baselineWhat: 'an empty tapmanager: spawn -> first answer',
  });
  figure(`restart-all@${n}`, 'ms', all, base, {
    goal: 2,
    what: `spawn -> every one of ${n} pods answered get`,
    baselineWhat: 'an empty tapmanager: spawn -> first answer',
  });
}

async function main() {
  const w = await podWorld(cleanup, o.stack === 'v4' ? {} : { ipv6: o.stack });
  await w.start();
  const t0 = performance.now();
  // a pause other than the default names the figures apart: add-pause500, release-pause500, add@250-pause500
  const paused = SETTLE_MS === 150 ? '' : `-pause${SETTLE_MS}`;
  if (want.has('add')) await addRelease(w, paused, runs);
  if (want.has('burst')) await burst(w);
  if (want.has('scale')) {
    for (const n of counts) {
      const have = w.ours.size;
      if (have < n) await w.add(w.keys(n - have, 'p'), PAR);
      if (have > n) await w.release([...w.ours].slice(0, have - n), PAR);
      await addRelease(w, `@${n}${paused}`, Math.max(5, Math.round(runs / 2)));
      await getFigure(w, n);
      await restartFigure(w, n);
      measure(`memory@${n}`, 'MB/fds', procMem(w.daemon.pid));
    }
  }
  console.error(`pods: ${Math.round(performance.now() - t0)} ms; cleaning up`);
  const failures = await cleanup.run();
  if (failures.length) process.exitCode = 1;
}

main().catch(async (e) => {
  console.error(e);
  await cleanup.run();
  process.exit(1);
});
