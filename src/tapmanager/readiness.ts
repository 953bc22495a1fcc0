// Readiness beyond "restored" (the service knows that): the fd socket still listens at its path, the CNI config loads,
// and no CNI plugin answers STATUS with an error. Each unmet condition is a sentence for /readyz and `tapctl status
// --ready`.
import { lstatSync } from 'node:fs';
import { errorChain } from '../errors.js';

export interface ReadinessDeps {
  socketPath: string;
  /** the server holds its listening socket */
  listening(): boolean;
  cniConfDir: string;
  loadConfList(): Promise<unknown>;
  /** CNI STATUS (cni-status.ts): one sentence per plugin that cannot take adds */
  cniStatus?: () => string[];
}

export async function checkReadiness(d: ReadinessDeps): Promise<{ ready: boolean; reasons: string[] }> {
  const reasons: string[] = [];
  if (!d.listening()) reasons.push(`not listening on ${d.socketPath}`);
  else {
    try {
      if (!lstatSync(d.socketPath).isSocket())
        reasons.push(`${d.socketPath} is no longer a socket: restart tapmanager`);
    } catch (e) {
      reasons.push(
        `socket ${d.socketPath} is gone (${(e as NodeJS.ErrnoException).code ?? 'error'}): something removed it; ` +
          `restart tapmanager`,
      );
    }
  }
  try {
    await d.loadConfList();
  } catch (e) {
    reasons.push(`CNI config in ${d.cniConfDir} does not load: ${errorChain(e).replace(/\s*\n\s*/g, ' ')}`);
  }
  reasons.push(...(d.cniStatus?.() ?? []));
  return { ready: reasons.length === 0, reasons };
}
