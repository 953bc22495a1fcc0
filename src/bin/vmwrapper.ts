// vmwrapper: libvirt's <emulator>. Same PID as qemu: it ends in execve, or exits 1 with one line on stderr.
import { native } from '../native.js';
import { applyPlan, planExec } from '../vmwrapper/run.js';
import { createLogger } from '../log.js';
import { errorChain } from '../errors.js';

const env = process.env;
const log = createLogger('vmwrapper', env.VMPOD_LOG_LEVEL === 'silent' ? 'silent' : 'info');
try {
  const plan = planExec(process.argv.slice(2), env);
  applyPlan(plan);
  // the destination is synchronous (fd 2), so this line is on disk before the exec
  log.info({ ...plan.summary, keepFds: plan.keepFds, argv: plan.argv }, 'exec emulator');
  native().execve(plan.path, plan.argv, plan.env, plan.keepFds);
} catch (e) {
  process.stderr.write(`vmwrapper: ${errorChain(e).replace(/\s*\n\s*/g, ' ')}\n`);
  process.exit(1);
}
