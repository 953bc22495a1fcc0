#!/usr/bin/env node
// The first DHCP OFFER after a pod network is ready, as the VM sees it (root; after `npm run build`):
//   node bench/dhcp-first.mjs [--runs 10]
// ours      bench/c/dhcp-first.c sends tapmanager an add; ready = the add's reply; it gets the tap fd and writes a
//           DISCOVER into the tap (the guest's side), then reads the OFFER from it
// baseline  a hand-made pod of the same shape (netns, br0 169.254.254.2/24 with a veth and tap0 in it); ready = the
//           fork that execs dnsmasq there (same lease: address, mask, router, routes, host name, MTU); the same
//           DISCOVER written into tap0, the OFFER read from it
// A DISCOVER goes every 2 ms until one is answered: "ready -> first OFFER" counts a server that is not listening
// yet; "DISCOVER -> OFFER" is the exchange that was answered. Runs alternate between the sides.
import { parseArgs } from 'node:util';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Cleanup, run } from './lib/cleanup.mjs';
import { podWorld } from './lib/pods.mjs';
import { figure } from './lib/figure.mjs';
import { helper } from './lib/cc.mjs';
import { handMadePod } from './lib/handpod.mjs';

const { values: o } = parseArgs({ options: { runs: { type: 'string', default: '10' } } });
const runs = Number(o.runs);
if (process.getuid?.() !== 0) throw new Error('needs root (netns, bridge, tap)');
const cleanup = new Cleanup();
cleanup.installGuards('dhcp-first', 600_000);

async function main() {
  const w = await podWorld(cleanup);
  await w.start();
  const pod = await handMadePod(cleanup, w);
  const probe = helper('dhcp-first');
  const ours = { ready: [], exchange: [], attempts: [] };
  const base = { ready: [], exchange: [], attempts: [] };
  for (let i = 0; i < runs; i++) {
    const [key] = w.keys(1, 'd');
    const addJson = join(w.dir, 'dhcp-add.json');
    writeFileSync(
      addJson,
      JSON.stringify({ podNetworkDesc: { podId: key, podNs: 'bench', podName: 'bench-vm', DNS: null } }),
    );
    w.ours.add(key);
    const r = await run(probe, ['vmpod', w.socket, key, addJson], { timeoutMs: 180_000 });
    if (r.code !== 0) throw new Error(`dhcp-first vmpod: ${r.stderr}`);
    const a = JSON.parse(r.stdout);
    await w.release([key]);
    const b = await run(probe, ['dnsmasq', pod.nsPath, 'tap0', pod.mac, '--', ...pod.argv], { timeoutMs: 180_000 });
    if (b.code !== 0) {
      let log = '';
      try {
        log = readFileSync(join(w.dir, 'dnsmasq.log'), 'utf8').slice(-1500);
      } catch {
        // no log: dnsmasq did not start
      }
      throw new Error(`dhcp-first dnsmasq: ${b.stderr} dnsmasq.log: ${log}`);
    }
    const d = JSON.parse(b.stdout);
    for (const [side, x] of [
      [ours, a],
      [base, d],
    ]) {
      side.ready.push(x.readyToAnswerUs / 1000);
      side.exchange.push(x.requestToAnswerUs / 1000);
      side.attempts.push(x.attempts);
    }
  }
  figure('dhcp-first-offer', 'ms', ours.ready, base.ready, {
    goal: 1.0,
    what: 'add reply -> first OFFER read from the tap',
    baselineWhat: "dnsmasq exec'd on a hand-made pod -> first OFFER",
    extra: { attempts: { ours: ours.attempts, baseline: base.attempts } },
  });
  figure('dhcp-first-exchange', 'ms', ours.exchange, base.exchange, {
    what: 'the answered DISCOVER -> its OFFER (first exchange of a fresh pod)',
    baselineWhat: 'the same, dnsmasq',
  });
  await cleanup.run();
}

main().catch(async (e) => {
  console.error(e);
  await cleanup.run();
  process.exit(1);
});
