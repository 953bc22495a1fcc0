// vmwrapper: libvirt's <emulator>. Same PID as qemu: it ends in execve, or exits 1 with one line on stderr.
// It runs on every VM start and every libvirt capability probe, so it loads only what the path taken uses: a
// probe loads probe.ts and the addon (no client) and writes no log line; a start loads run.ts (the client, the qemu
// argv builder, the device scan, the log line) on demand, and writes one JSON line by hand (no logger library). In the
// bundles run.ts is a file of its own (dist/bundle/vmwrapper-start.cjs): a probe does not even read it.
import { writeSync } from 'node:fs';
import { native } from '../native.js';
import { isProbe, probePlan } from '../vmwrapper/probe.js';
import { errorChain } from '../errors.js';

const env = process.env;
const args = process.argv.slice(2);

function fail(e: unknown): never {
  process.stderr.write(`vmwrapper: ${errorChain(e).replace(/\s*\n\s*/g, ' ')}\n`);
  process.exit(1);
}

async function start(): Promise<void> {
  const { planExec, applyPlan, logLine } = await import('../vmwrapper/run.js');
  const plan = await planExec(args, env);
  applyPlan(plan);
  // written synchronously to fd 2, so the line is out before the exec
  if (env.VMPOD_LOG_LEVEL !== 'silent') {
    writeSync(
      2,
      logLine({ ...plan.summary, keepFds: plan.keepFds, argv: plan.argv }, 'exec emulator', process.pid, new Date()),
    );
  }
  native().execve(plan.path, plan.argv, plan.env, plan.keepFds);
}

if (args.length === 1 && args[0] === '--version') {
  // ours, not qemu's (a probe would pass it on to qemu): read only here
  import('../version.js').then((v) => process.stdout.write(`${v.packageVersion()}\n`), fail);
} else if (isProbe(env)) {
  try {
    const plan = probePlan(args, env);
    native().execve(plan.path, plan.argv, plan.env, plan.keepFds);
  } catch (e) {
    fail(e);
  }
} else start().catch(fail);
