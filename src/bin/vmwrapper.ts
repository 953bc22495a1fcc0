// vmwrapper: libvirt's <emulator>. Same PID as qemu: it ends in execve, or exits 1 with one line on stderr.
// It runs on every VM start and every libvirt capability probe, so it loads only what the path taken uses: a
// probe loads probe.ts and the addon (no client, no logger) and writes no log line; a start loads run.ts (the
// client, the qemu argv builder, the device scan) and the logger, on demand.
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
  const [{ planExec, applyPlan }, { createLogger }] = await Promise.all([import('../vmwrapper/run.js'), import('../log.js')]);
  const log = createLogger('vmwrapper', env.VMPOD_LOG_LEVEL === 'silent' ? 'silent' : 'info');
  const plan = await planExec(args, env);
  applyPlan(plan);
  // the destination is synchronous (fd 2), so this line is on disk before the exec
  log.info({ ...plan.summary, keepFds: plan.keepFds, argv: plan.argv }, 'exec emulator');
  native().execve(plan.path, plan.argv, plan.env, plan.keepFds);
}

if (isProbe(env)) {
  try {
    const plan = probePlan(args, env);
    native().execve(plan.path, plan.argv, plan.env, plan.keepFds);
  } catch (e) {
    fail(e);
  }
} else start().catch(fail);
