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
import { randomBytes } from 'node:crypto';
import { Cleanup, mustRun, run } from './lib/cleanup.mjs';
import { podWorld } from './lib/pods.mjs';
import { figure } from './lib/figure.mjs';
import { helper } from './lib/cc.mjs';

const { values: o } = parseArgs({ options: { runs: { type: 'string', default: '10' } } });
const runs = Number(o.runs);
if (process.getuid?.() !== 0) throw new Error('needs root (netns, bridge, tap)');
const cleanup = new Cleanup();
cleanup.installGuards('dhcp-first', 600_000);

async function handMadePod(w) {
  const ns = `vmpbh-${randomBytes(3).toString('hex')}`;
  await mustRun('ip', ['netns', 'add', ns]);
  cleanup.push(`delete netns ${ns}`, () => mustRun('ip', ['netns', 'del', ns]));
  const lines = [
    'link set dev lo up',
    'link add name br0 type bridge ageing_time 0',
    'addr add 169.254.254.2/24 dev br0',
    'link add name virtlet-eth0 type veth peer name vmpbpeer0',
    'link set dev virtlet-eth0 master br0',
    'tuntap add dev tap0 mode tap',
    'link set dev tap0 master br0',
    'link set dev virtlet-eth0 up',
    'link set dev vmpbpeer0 up',
    'link set dev tap0 up',
    'link set dev br0 up',
  ];
  await run('ip', ['-n', ns, '-batch', '-'], { input: lines.join('\n') + '\n' }).then((r) => {
    if (r.code !== 0) throw new Error(`hand-made pod: ${r.stderr}`);
  });
  const prefix = w.subnet.split('.').slice(0, 3).join('.');
  const ip = `${prefix}.250`;
  const mac = '0a:58:0a:f4:07:05';
  const argv = [
    '/usr/sbin/dnsmasq', '--keep-in-foreground', '--conf-file=/dev/null', '--port=0', '--no-resolv', '--no-hosts',
    `--log-facility=${join(w.dir, 'dnsmasq.log')}`, `--pid-file=${join(w.dir, 'dnsmasq.pid')}`, '--leasefile-ro', '--no-ping',
    '--interface=br0', '--bind-interfaces', '--except-interface=lo',
    `--shared-network=br0,${prefix}.0`,
    `--dhcp-range=${ip},static,255.255.252.0,86400`,
    `--dhcp-host=${mac},${ip},bench-vm`,
    `--dhcp-option=option:router,${prefix}.1`,
    `--dhcp-option=121,0.0.0.0/0,${prefix}.1`,
    '--dhcp-option=option:mtu,1500',
  ];
  return { nsPath: `/var/run/netns/${ns}`, mac, argv };
}

async function main() {
  const w = await podWorld(cleanup);
  await w.start();
  const pod = await handMadePod(w);
  const probe = helper('dhcp-first');
  const ours = { ready: [], exchange: [], attempts: [] };
  const base = { ready: [], exchange: [], attempts: [] };
  for (let i = 0; i < runs; i++) {
    const [key] = w.keys(1, 'd');
    const addJson = join(w.dir, 'dhcp-add.json');
    writeFileSync(addJson, JSON.stringify({ podNetworkDesc: { podId: key, podNs: 'bench', podName: 'bench-vm', DNS: null } }));
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
    for (const [side, x] of [[ours, a], [base, d]]) {
      side.ready.push(x.readyToOfferUs / 1000);
      side.exchange.push(x.discoverToOfferUs / 1000);
      side.attempts.push(x.attempts);
    }
  }
  figure('dhcp-first-offer', 'ms', ours.ready, base.ready, { goal: 1.0, what: 'add reply -> first OFFER read from the tap', baselineWhat: 'dnsmasq exec\'d on a hand-made pod -> first OFFER', extra: { attempts: { ours: ours.attempts, baseline: base.attempts } } });
  figure('dhcp-first-exchange', 'ms', ours.exchange, base.exchange, { what: 'the answered DISCOVER -> its OFFER (first exchange of a fresh pod)', baselineWhat: 'the same, dnsmasq' });
  await cleanup.run();
}

main().catch(async (e) => {
  console.error(e);
  await cleanup.run();
  process.exit(1);
});
