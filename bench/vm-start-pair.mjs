#!/usr/bin/env node
// "VM start to DHCP lease" through the pair vs the baseline, interleaved in one process run:
//   pair:     tapmanager add (netns, bridge + host-local CNI, bridge + tap, DHCP server), then `node vmwrapper.js`
//             (get the tap fd over the socket, execve qemu in place), timed to the guest's VMPOD-LEASE line;
//   baseline: netns + bridge + `ip tuntap` + dnsmasq by hand, then qemu on the tap (bench/vm-start-baseline.mjs).
// One tapmanager and one CNI network (MTU 1400) serve every pair run; each run adds, boots, stops and releases its own
// pod and checks nothing of it is left. The runs alternate which side goes first, to spread drift over both.
// The steps are test/helpers/{pairvm,baseline}.ts (the same as the e2e tests), bundled with esbuild.
//   node bench/vm-start-pair.mjs [--runs N]      (root; default 5 runs of each; needs `npm run build`)
// Prints one JSON line per run, a JSON summary line, and a human line. Reported, never asserted.
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { loadTs } from './lib/ts.mjs';
import { median } from './lib/stats.mjs';
import { figure } from './lib/figure.mjs';

const MTU = 1400;

const r1 = (x) => Math.round(x * 10) / 10;
const r2 = (x) => Math.round(x * 100) / 100;

const loadHelpers = () =>
  loadTs('pair-helpers', [
    "export * from './test/helpers/pairvm.ts';",
    "export { setupBaselineNet, bootBaselineVm, baselineLeftovers } from './test/helpers/baseline.ts';",
    "export { makeCniConf } from './test/helpers/cniconf.ts';",
    "export { startDaemon, removeDir, BIN } from './test/helpers/daemon.ts';",
    "export { ensureGuest, detectAccel } from './test/helpers/guest.ts';",
    "export { FdClient } from './src/client/fdclient.ts';",
  ]);

/** One pair run: add, boot through vmwrapper, stop, release; returns the timings and what was left. */
async function pairRun(h, ctx, i) {
  const { key, desc } = h.newPod('vmpbench');
  const client = new h.FdClient(ctx.daemon.socket, { timeoutMs: 60_000 });
  const t0 = performance.now();
  const csn = client.add(key, desc);
  const setupMs = performance.now() - t0;
  let vm;
  let teardownMs;
  try {
    vm = await h.bootPairVm({
      socket: ctx.daemon.socket,
      key,
      guest: ctx.guest,
      dir: ctx.dir,
      name: `pair-${i}.serial.log`,
      timeoutMs: 60_000,
    });
    const a = h.podAddress(csn);
    if (vm.lease.ip !== a.ip || vm.lease.mac !== a.mac) {
      throw new Error(`pair run ${i}: guest leased ${vm.lease.ip} ${vm.lease.mac}, pod is ${a.ip} ${a.mac}`);
    }
  } finally {
    const tTeardown = performance.now();
    await vm?.stop();
    client.release(key);
    teardownMs = performance.now() - tTeardown;
  }
  const left = await h.podLeftovers(ctx.net, ctx.daemon.stateDir, key);
  const leaked = Object.values(left).reduce((n, xs) => n + xs.length, 0);
  return row('pair', i, setupMs, vm, teardownMs, leaked);
}

/** One run's JSON line, the same fields for both sides. */
function row(side, run, setupMs, vm, teardownMs, leaked) {
  return {
    bench: 'vm-start-pair',
    side,
    run,
    setupMs: r1(setupMs),
    startToBootMs: r1(vm.startToBootMs),
    startToLeaseMs: r1(vm.startToLeaseMs),
    bootToLeaseMs: r1(vm.startToLeaseMs - vm.startToBootMs),
    totalMs: r1(setupMs + vm.startToLeaseMs),
    teardownMs: r1(teardownMs),
    leaked,
  };
}

/** One baseline run, as bench/vm-start-baseline.mjs does it. */
async function baselineRun(h, ctx, i) {
  const t0 = performance.now();
  const net = await h.setupBaselineNet({ prefix: 'vmebp', mtu: MTU });
  const setupMs = performance.now() - t0;
  let vm;
  let teardownMs;
  try {
    vm = await h.bootBaselineVm(net, ctx.guest, { timeoutMs: 60_000, name: `baseline-${i}` });
  } finally {
    const tTeardown = performance.now();
    await net.teardown.run();
    teardownMs = performance.now() - tTeardown;
  }
  const left = await h.baselineLeftovers(net, [vm.qemuPid, net.dnsmasqPid]);
  return row('baseline', i, setupMs, vm, teardownMs, left.netns.length + left.links.length + left.pids.length);
}

function summarise(rows) {
  const m = (f) => r1(median(rows.map((r) => r[f])));
  return {
    medianSetupMs: m('setupMs'),
    medianStartToBootMs: m('startToBootMs'),
    medianStartToLeaseMs: m('startToLeaseMs'),
    medianBootToLeaseMs: m('bootToLeaseMs'),
    medianTotalMs: m('totalMs'),
    minStartToLeaseMs: r1(Math.min(...rows.map((r) => r.startToLeaseMs))),
    maxStartToLeaseMs: r1(Math.max(...rows.map((r) => r.startToLeaseMs))),
    leaked: rows.reduce((n, r) => n + r.leaked, 0),
  };
}

async function main() {
  const { values } = parseArgs({ options: { runs: { type: 'string', default: '5' } } });
  const runs = Number(values.runs);
  if (!Number.isInteger(runs) || runs < 1 || runs > 100) throw new Error(`--runs ${values.runs}: expected 1 to 100`);
  if (process.getuid?.() !== 0) throw new Error('needs root (netns, tap, CNI plugins, qemu on a tap)');

  const h = await loadHelpers();
  const guest = await h.ensureGuest();
  const accel = h.detectAccel();
  const net = await h.makeCniConf({ mtu: MTU });
  const dir = await mkdtemp(join(tmpdir(), 'vmpod-bench-pair-'));
  let daemon;
  const pair = [];
  const baseline = [];
  try {
    daemon = await h.startDaemon({
      confDir: net.confDir,
      binDirs: net.binDirs,
      cacheDir: net.cacheDir,
      extraArgs: ['--log-level', 'warn'],
    });
    const ctx = { guest, net, daemon, dir };
    for (let i = 1; i <= runs; i++) {
      const order = i % 2 === 1 ? ['pair', 'baseline'] : ['baseline', 'pair'];
      for (const side of order) {
        const r = side === 'pair' ? await pairRun(h, ctx, i) : await baselineRun(h, ctx, i);
        (side === 'pair' ? pair : baseline).push(r);
        console.log(JSON.stringify({ ...r, accel }));
      }
    }
  } finally {
    const code = await daemon?.stop();
    if (daemon) h.removeDir(daemon.dir);
    await net.cleanup();
    await rm(dir, { recursive: true, force: true });
    if (daemon && code !== 0) console.error(`vm-start-pair: tapmanager exited with ${code}:\n${daemon.logs()}`);
  }
  const p = summarise(pair);
  const b = summarise(baseline);
  const summary = {
    bench: 'vm-start-pair',
    summary: true,
    runs,
    accel,
    pair: p,
    baseline: b,
    ratioStartToLease: r2(p.medianStartToLeaseMs / b.medianStartToLeaseMs),
    ratioTotal: r2(p.medianTotalMs / b.medianTotalMs),
  };
  console.log(JSON.stringify(summary));
  figure(
    'vm-start-to-lease',
    'ms',
    pair.map((r) => r.startToLeaseMs),
    baseline.map((r) => r.startToLeaseMs),
    {
      what: 'tapmanager add + vmwrapper + qemu: start -> guest lease',
      baselineWhat: 'netns, bridge, tap by hand, dnsmasq, qemu started directly',
    },
  );
  console.log(
    `vm-start-pair: ${runs} interleaved runs each (${accel}). Start to DHCP lease, median: pair (vmwrapper -> qemu) ` +
      `${p.medianStartToLeaseMs} ms, baseline (qemu) ${b.medianStartToLeaseMs} ms, ratio ${summary.ratioStartToLease} ` +
      `(to init ${p.medianStartToBootMs} vs ${b.medianStartToBootMs} ms; init to lease ${p.medianBootToLeaseMs} vs ${b.medianBootToLeaseMs} ms). ` +
      `Network setup: tapmanager add ${p.medianSetupMs} ms, by hand ${b.medianSetupMs} ms. ` +
      `Setup + start to lease: ${p.medianTotalMs} vs ${b.medianTotalMs} ms, ratio ${summary.ratioTotal}. Leaked objects: ${p.leaked + b.leaked}.`,
  );
}

main().catch((e) => {
  console.error(`vm-start-pair: ${e?.stack ?? e}`);
  process.exitCode = 1;
});
