#!/usr/bin/env node
// The first Router Advertisement and the first DHCPv6 answer after an IPv6 pod network is ready, as the VM sees it
// (root; after `npm run build`):
//   node bench/dhcp6-first.mjs [--runs 10] [--stack dual|only]
// The counterpart of dhcp-first.mjs, with the same C helper (bench/c/dhcp-first.c, --ask rs|solicit|solicit-rapid):
// ours      a dual-stack (--stack only: IPv6-only) pod added through tapmanager's socket; ready = the add's reply;
//           a get for the tap fd; the guest's request written into the tap, the answer read from it
// baseline  a hand-made pod of the same shape (bench/lib/handpod.mjs: netns, br0 with the link-local fe80::2 and
//           <prefix>::2 (dnsmasq needs an address in the prefix), a veth and tap0); ready = the fork that execs
//           dnsmasq there with RA (M, O) and stateful DHCPv6 of the same address for the same DUID, the same DNS;
//           the same requests written into tap0
// Per run and per question, one fresh pod on each side: RS -> the first RA (whatever triggered it: both servers send
// one unsolicited at start), SOLICIT + Rapid Commit -> REPLY, SOLICIT -> ADVERTISE. A request goes every 2 ms until
// one is answered: "ready -> first answer" counts a server not listening yet; "request -> answer" is the exchange
// that was answered (for RS: the latest RS before the RA). Runs alternate between the sides.
import { parseArgs } from 'node:util';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Cleanup, run } from './lib/cleanup.mjs';
import { podWorld } from './lib/pods.mjs';
import { figure } from './lib/figure.mjs';
import { helper } from './lib/cc.mjs';
import { handMadePod, POD_DNS } from './lib/handpod.mjs';

const { values: o } = parseArgs({
  options: { runs: { type: 'string', default: '10' }, stack: { type: 'string', default: 'dual' } },
});
const runs = Number(o.runs);
if (!['dual', 'only'].includes(o.stack)) throw new Error(`--stack ${o.stack}: dual or only`);
if (process.getuid?.() !== 0) throw new Error('needs root (netns, bridge, tap)');
const cleanup = new Cleanup();
cleanup.installGuards('dhcp6-first', 1_200_000);

/** the questions: --ask of the helper, the figure's name and words */
const ASKS = [
  {
    ask: 'rs',
    name: 'ra-first',
    what: 'RS every 2 ms from the add reply -> first RA read from the tap',
    exchange: 'the latest RS -> the RA',
  },
  {
    ask: 'solicit-rapid',
    name: 'dhcp6-first-reply',
    what: 'SOLICIT + Rapid Commit every 2 ms from the add reply -> first REPLY',
    exchange: 'the answered SOLICIT (rapid commit) -> its REPLY',
  },
  {
    ask: 'solicit',
    name: 'dhcp6-first-advertise',
    what: 'SOLICIT every 2 ms from the add reply -> first ADVERTISE',
    exchange: 'the answered SOLICIT -> its ADVERTISE',
  },
];

async function main() {
  const w = await podWorld(cleanup, { ipv6: o.stack });
  await w.start();
  const pod = await handMadePod(cleanup, w, { ipv4: o.stack === 'dual', ipv6: true, dns: true });
  const probe = helper('dhcp-first');
  const samples = Object.fromEntries(ASKS.map((a) => [a.ask, { ours: [], base: [] }]));
  const addJson = join(w.dir, 'dhcp6-add.json');
  for (let i = 0; i < runs; i++) {
    for (const { ask } of ASKS) {
      const [key] = w.keys(1, 's');
      writeFileSync(
        addJson,
        JSON.stringify({ podNetworkDesc: { podId: key, podNs: 'bench', podName: 'bench-vm', DNS: POD_DNS } }),
      );
      w.ours.add(key);
      const r = await run(probe, ['--ask', ask, 'vmpod', w.socket, key, addJson], { timeoutMs: 180_000 });
      if (r.code !== 0) throw new Error(`dhcp-first --ask ${ask} vmpod: ${r.stderr}`);
      await w.release([key]);
      const b = await run(probe, ['--ask', ask, 'dnsmasq', pod.nsPath, 'tap0', pod.mac, '--', ...pod.argv], {
        timeoutMs: 180_000,
      });
      if (b.code !== 0) {
        let log = '';
        try {
          log = readFileSync(join(w.dir, 'dnsmasq.log'), 'utf8').slice(-1500);
        } catch {
          // no log: dnsmasq did not start
        }
        throw new Error(`dhcp-first --ask ${ask} dnsmasq: ${b.stderr} dnsmasq.log: ${log}`);
      }
      samples[ask].ours.push(JSON.parse(r.stdout));
      samples[ask].base.push(JSON.parse(b.stdout));
    }
  }
  const col = (xs, k) => xs.map((x) => x[k]);
  const ms = (xs, k) => xs.map((x) => x[k] / 1000);
  const stack = o.stack === 'dual' ? '' : '-v6only';
  for (const a of ASKS) {
    const { ours, base } = samples[a.ask];
    // run 1 apart: our first IPv6 pod since tapmanager started (V8 compiles the RA / DHCPv6 code on its first packet)
    const first = { ours: ms(ours, 'readyToAnswerUs')[0], baseline: ms(base, 'readyToAnswerUs')[0] };
    const extra = {
      first,
      attempts: { ours: col(ours, 'attempts'), baseline: col(base, 'attempts') },
      answers: { ours: [...new Set(col(ours, 'answer'))], baseline: [...new Set(col(base, 'answer'))] },
    };
    // Neighbour Solicitations the helper answered for the guest's link-local (dnsmasq's kernel resolving the client)
    extra.nsAnswered = {
      ours: col(ours, 'nsAnswered').reduce((x, y) => x + y, 0),
      baseline: col(base, 'nsAnswered').reduce((x, y) => x + y, 0),
    };
    if (a.ask === 'rs')
      extra.solicited = {
        ours: col(ours, 'solicited').filter(Boolean).length,
        baseline: col(base, 'solicited').filter(Boolean).length,
        of: runs,
      };
    figure(`${a.name}${stack}`, 'ms', ms(ours, 'readyToAnswerUs'), ms(base, 'readyToAnswerUs'), {
      goal: 1.0,
      what: a.what,
      baselineWhat: "dnsmasq exec'd on a hand-made pod -> the same",
      extra,
    });
    figure(`${a.name}${stack}-exchange`, 'ms', ms(ours, 'requestToAnswerUs'), ms(base, 'requestToAnswerUs'), {
      what: a.exchange,
      baselineWhat: 'the same, dnsmasq',
      extra: { first: { ours: ms(ours, 'requestToAnswerUs')[0], baseline: ms(base, 'requestToAnswerUs')[0] } },
    });
  }
  await cleanup.run();
}

main().catch(async (e) => {
  console.error(e);
  await cleanup.run();
  process.exit(1);
});
