#!/usr/bin/env node
// Baseline "VM start to DHCP lease" WITHOUT vmpod: per run a fresh netns + bridge + hand-made tap + dnsmasq, then
// qemu (TCG here) with the test guest, timed from spawning qemu to the guest's VMPOD-LEASE line on its serial log.
// The steps are test/helpers/baseline.ts (the same as test/e2e/guest-baseline.test.ts), bundled with esbuild
// because Node 20 cannot import TypeScript.
//   node bench/vm-start-baseline.mjs [--runs N]      (root; default 5 runs)
// Prints one JSON line per run, a JSON summary line, and a human line. Reported, never asserted.
import { parseArgs } from 'node:util';
import { loadTs } from './lib/ts.mjs';
import { median } from './lib/stats.mjs';

const r1 = (x) => Math.round(x * 10) / 10;

const loadHelpers = () =>
  loadTs('baseline-helpers', [
    "export * from './test/helpers/baseline.ts';",
    "export { ensureGuest, detectAccel } from './test/helpers/guest.ts';",
  ]);

async function main() {
  const { values } = parseArgs({ options: { runs: { type: 'string', default: '5' } } });
  const runs = Number(values.runs);
  if (!Number.isInteger(runs) || runs < 1 || runs > 100) throw new Error(`--runs ${values.runs}: expected 1 to 100`);
  if (process.getuid?.() !== 0) throw new Error('needs root (netns, tap, qemu on a tap)');

  const h = await loadHelpers();
  const guest = await h.ensureGuest();
  const accel = h.detectAccel();
  const results = [];
  for (let i = 1; i <= runs; i++) {
    const t0 = performance.now();
    const net = await h.setupBaselineNet({ prefix: 'vmebn' });
    const setupMs = performance.now() - t0;
    let vm;
    try {
      vm = await h.bootBaselineVm(net, guest, { timeoutMs: 60_000 });
    } finally {
      const tTeardown = performance.now();
      await net.teardown.run();
      const teardownMs = performance.now() - tTeardown;
      if (vm !== undefined) {
        const left = await h.baselineLeftovers(net, [vm.qemuPid, net.dnsmasqPid]);
        const leaked = left.netns.length + left.links.length + left.pids.length;
        const r = {
          bench: 'vm-start-baseline',
          run: i,
          accel,
          setupMs: r1(setupMs),
          startToBootMs: r1(vm.startToBootMs),
          startToLeaseMs: r1(vm.startToLeaseMs),
          teardownMs: r1(teardownMs),
          leaked,
        };
        results.push(r);
        console.log(JSON.stringify(r));
      }
    }
  }
  const summary = {
    bench: 'vm-start-baseline',
    summary: true,
    runs,
    accel,
    medianSetupMs: r1(median(results.map((r) => r.setupMs))),
    medianStartToBootMs: r1(median(results.map((r) => r.startToBootMs))),
    medianStartToLeaseMs: r1(median(results.map((r) => r.startToLeaseMs))),
    minStartToLeaseMs: r1(Math.min(...results.map((r) => r.startToLeaseMs))),
    maxStartToLeaseMs: r1(Math.max(...results.map((r) => r.startToLeaseMs))),
  };
  console.log(JSON.stringify(summary));
  console.log(
    `vm-start-baseline: ${runs} runs (${accel}), qemu start to DHCP lease median ${summary.medianStartToLeaseMs} ms ` +
      `(min ${summary.minStartToLeaseMs}, max ${summary.maxStartToLeaseMs}); to init ${summary.medianStartToBootMs} ms; ` +
      `netns+tap+dnsmasq setup ${summary.medianSetupMs} ms`,
  );
}

main().catch((e) => {
  console.error(`vm-start-baseline: ${e?.stack ?? e}`);
  process.exitCode = 1;
});
