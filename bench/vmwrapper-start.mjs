#!/usr/bin/env node
// vmwrapper's cost on every VM start: spawn to the exec'd emulator's exit, with /bin/true as the emulator.
//   node bench/vmwrapper-start.mjs [--runs N]      (root; default 30; needs `npm run build`)
// Sets, interleaved, in one run:
//   true        /bin/true spawned directly (the floor of any process)
//   node        `node -e 0` (Node's own start-up: the floor for any Node program; the baseline)
//   probe       vmwrapper, VIRTLET_EMULATOR empty: libvirt's probe path
//   start       vmwrapper with VIRTLET_NET_KEY: a get from tapmanager (1 tap fd), argv rewrite, execve
//   start-mq8   the same with 8 queues (VMPOD_NET_QUEUES=8): a get with {"queues": 8} (tapmanager dups its fd and
//               opens 7 more queues of the tap), `fds=...,mq=on,vectors=18` and the /dev/vhost-net check; to the
//               emulator's exit, which closes the 7 extra queues (the kernel detaches each, about 1 ms: the VM's stop)
//   start-mq8-at, start-at   8 queues and 1: from the spawn to the moment the emulator runs (bench/c/exec-stamp.c
//               prints CLOCK_MONOTONIC), the start without the emulator's exit
// Prints a JSON line per set and the figures (vmwrapper-start, vmwrapper-start-mq8, vmwrapper-probe vs node -e 0).
// Reported, never asserted.
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { repo } from './lib/dist.mjs';
import { Cleanup } from './lib/cleanup.mjs';
import { podWorld } from './lib/pods.mjs';
import { figure } from './lib/figure.mjs';
import { helper } from './lib/cc.mjs';
import { median } from './lib/stats.mjs';

const vmwrapper = join(repo, 'dist/bundle/vmwrapper.cjs');
const r1 = (x) => Math.round(x * 10) / 10;

function timeOnce(cmd, args, env) {
  const t = performance.now();
  const r = spawnSync(cmd, args, { env, stdio: ['ignore', 'ignore', 'pipe'] });
  const ms = performance.now() - t;
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${r.status}: ${r.stderr}`);
  return ms;
}

/** spawn -> the emulator's first instruction: exec-stamp prints CLOCK_MONOTONIC, which hrtime reads too */
function timeToExec(cmd, args, env) {
  const t = process.hrtime.bigint();
  const r = spawnSync(cmd, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(' ')} exited ${r.status}: ${r.stderr}`);
  return Number(BigInt(r.stdout.toString().trim()) - t) / 1e6;
}

async function main() {
  const { values } = parseArgs({ options: { runs: { type: 'string', default: '30' } } });
  const runs = Number(values.runs);
  if (!Number.isInteger(runs) || runs < 1 || runs > 1000) throw new Error(`--runs ${values.runs}: expected 1 to 1000`);
  if (process.getuid?.() !== 0) throw new Error('needs root (netns, bridge, tap)');
  const cleanup = new Cleanup();
  cleanup.installGuards('vmwrapper-start', 600_000);
  try {
    const w = await podWorld(cleanup);
    await w.start();
    const [key] = w.keys(1, 'w');
    await w.add([key]);
    const base = { PATH: process.env.PATH, VMPOD_LOG_LEVEL: 'silent' };
    const stamp = helper('exec-stamp');
    const sets = { true: [], node: [], probe: [], start: [], 'start-mq8': [], 'start-at': [], 'start-mq8-at': [] };
    const startEnv = {
      ...base,
      VIRTLET_EMULATOR: '/bin/true',
      VIRTLET_NET_KEY: key,
      VIRTLET_FD_SERVER_SOCKET_PATH: w.socket,
    };
    for (let i = 0; i < runs; i++) {
      sets.true.push(timeOnce('/bin/true', [], base));
      sets.node.push(timeOnce(process.execPath, ['-e', '0'], base));
      sets.probe.push(timeOnce(vmwrapper, ['-S'], { ...base, VMWRAPPER_DEFAULT_EMULATOR: '/bin/true' }));
      sets.node.push(timeOnce(process.execPath, ['-e', '0'], base));
      sets.start.push(timeOnce(vmwrapper, ['-S'], startEnv));
      sets.node.push(timeOnce(process.execPath, ['-e', '0'], base));
      sets['start-mq8'].push(timeOnce(vmwrapper, ['-S', '-smp', '8'], { ...startEnv, VMPOD_NET_QUEUES: '8' }));
      sets['start-at'].push(timeToExec(vmwrapper, ['-S'], { ...startEnv, VIRTLET_EMULATOR: stamp }));
      sets.node.push(timeOnce(process.execPath, ['-e', '0'], base));
      sets['start-mq8-at'].push(
        timeToExec(vmwrapper, ['-S', '-smp', '8'], { ...startEnv, VIRTLET_EMULATOR: stamp, VMPOD_NET_QUEUES: '8' }),
      );
    }
    for (const [k, v] of Object.entries(sets))
      console.log(
        JSON.stringify({
          bench: 'vmwrapper-start',
          set: k,
          runs: v.length,
          medianMs: r1(median(v)),
          minMs: r1(Math.min(...v)),
          maxMs: r1(Math.max(...v)),
        }),
      );
    figure('vmwrapper-start', 'ms', sets.start, sets.node, {
      goal: 1.3,
      what: 'vmwrapper start: get (1 tap) + argv + execve /bin/true',
      baselineWhat: 'node -e 0',
    });
    figure('vmwrapper-start-mq8', 'ms', sets['start-mq8-at'], sets.node, {
      goal: 1.3,
      what: 'vmwrapper start, 8 queues: spawn -> the emulator runs (get of 8 queues of 1 tap, argv, execve)',
      baselineWhat: 'node -e 0',
    });
    figure('vmwrapper-start-mq8-exit', 'ms', sets['start-mq8'], sets.node, {
      what: 'the same to the exit of /bin/true, which detaches the 7 extra queues',
      baselineWhat: 'node -e 0',
    });
    figure('vmwrapper-start-at', 'ms', sets['start-at'], sets.node, {
      what: 'vmwrapper start, 1 queue: spawn -> the emulator runs',
      baselineWhat: 'node -e 0',
    });
    figure('vmwrapper-probe', 'ms', sets.probe, sets.node, {
      goal: 1.1,
      what: 'vmwrapper probe path: execve /bin/true',
      baselineWhat: 'node -e 0',
    });
  } finally {
    await cleanup.run();
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
