// Who else holds an address on the pod's wire (after a DHCPDECLINE): the edge that spawns. The pod bridge has
// ageing_time 0 (it floods like a hub), so its fdb keeps no learned MAC to read; instead the pod netns ARPs for
// the address once, from the bridge: a temporary on-link /32 route on the bridge, one ping, the neighbour entry
// read, the route (and the entry) removed. Runs only on a DECLINE, which the server then backs off from.
import { execFile } from 'node:child_process';
import { isIpv4 } from '../net/ip.js';

// generous: it runs only on a DECLINE, off the answer path, and on a loaded node a spawn alone can take seconds
const TIMEOUT_MS = 15_000;

function inNetns(nsPath: string, argv: string[]): Promise<{ ok: boolean; stdout: string }> {
  return new Promise((resolve) => {
    const child = execFile(
      'nsenter',
      [`--net=${nsPath}`, '--', ...argv],
      { timeout: TIMEOUT_MS, killSignal: 'SIGKILL' },
      (err, stdout) => resolve({ ok: err === null, stdout }),
    );
    child.stdin?.end();
  });
}

/** The MAC that answers ARP for `ip` on `bridge` inside the netns, undefined when nobody does. */
export async function conflictingMac(nsPath: string, bridge: string, ip: string): Promise<string | undefined> {
  if (!isIpv4(ip) || !/^[\w.-]{1,15}$/.test(bridge)) return undefined;
  const route = ['ip', 'route', 'add', `${ip}/32`, 'dev', bridge, 'scope', 'link'];
  const added = (await inNetns(nsPath, route)).ok;
  try {
    // a stale entry (the VM itself held the address before) would be read back as the answer: ask afresh
    await inNetns(nsPath, ['ip', 'neigh', 'flush', 'to', ip, 'dev', bridge]);
    await inNetns(nsPath, ['ping', '-c', '1', '-W', '2', '-I', bridge, ip]);
    const { stdout } = await inNetns(nsPath, ['ip', '-j', 'neigh', 'show', 'to', ip, 'dev', bridge]);
    const entries = JSON.parse(stdout.trim() || '[]') as { lladdr?: string }[];
    return entries.find((e) => e.lladdr)?.lladdr;
  } catch {
    return undefined;
  } finally {
    if (added) {
      await inNetns(nsPath, ['ip', 'route', 'del', `${ip}/32`, 'dev', bridge]);
      await inNetns(nsPath, ['ip', 'neigh', 'del', ip, 'dev', bridge]);
    }
  }
}
