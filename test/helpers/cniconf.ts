// A throwaway CNI network for integration tests: a bridge + host-local conflist with a unique bridge name,
// a unique /24, a private host-local dataDir and a private CNI cache dir, optionally with a fake plugin
// chained after bridge that fails ADD with a CNI error, or the fault-injection plugin (test/fixtures/cni/faulty). leftovers() lists what a pod could have left behind.
import {
  mkdtempSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
  chmodSync,
  copyFileSync,
  existsSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';

export const SYSTEM_CNI_BIN = '/usr/lib/cni';

export interface CniTestNet {
  name: string;
  bridge: string;
  subnet: string;
  gateway: string;
  /** with opts.ipv6: the IPv6 /64 and the gateway in it (on the host bridge) */
  subnet6?: string;
  gateway6?: string;
  root: string;
  confDir: string;
  binDirs: string[];
  cacheDir: string;
  dataDir: string;
  leftovers(): Promise<Leftovers>;
  bridgeExists(): Promise<boolean>;
  /** deletes the bridge and the temporary dirs */
  cleanup(): Promise<void>;
  /** with `faulty`: sets what the fault-injection plugin does per verb, e.g. { ADD: 'hang', DEL: 'fail' } */
  setFaults(modes: Partial<Record<'ADD' | 'DEL' | 'CHECK', FaultMode>>): void;
  /** with `faulty`: its runs so far, in order ("ADD 1234") */
  faultyRuns(): { verb: string; pid: number }[];
}

/** What test/fixtures/cni/faulty does for one verb (see the script's header). */
export type FaultMode = 'ok' | 'fail' | 'hang' | 'ignore-term' | 'flood' | 'garbage' | 'error-exit0';

/** The fault-injection plugin's file name (its "type"). */
export const FAULTY_PLUGIN = 'faulty';
const FAULTY_SRC = join(import.meta.dirname, '../fixtures/cni/faulty');

export interface Leftovers {
  /** host-side links enslaved to the test bridge (veth peers of pods) */
  veths: string[];
  /** host-local allocation files (one per allocated IP) */
  allocations: string[];
  /** CNI result cache files */
  cacheFiles: string[];
}

export interface CniConfOptions {
  /** chain a fake plugin after bridge whose ADD exits 1 with a CNI error JSON (its DEL succeeds) */
  failingPlugin?: boolean;
  /** chain test/fixtures/cni/faulty after bridge (all verbs "ok" until setFaults) */
  faulty?: boolean;
  mtu?: number;
  /** 'dual': a second host-local range with a unique fdXX:..::/64 and an IPv6 default route; 'only': that range alone */
  ipv6?: 'dual' | 'only';
  /**
   * host-local's dataDir when the plugins run in a container: `conf` is the path written into the conflist (as the
   * container sees it), `host` the same directory on the host (what leftovers() scans). Default: a private dir.
   */
  ipamDataDir?: { conf: string; host: string };
}

const FAKE_PLUGIN = 'vmpod-test-fail';

const FAKE_SCRIPT = `#!/bin/sh
# test plugin: ADD fails with a CNI error, DEL and VERSION succeed. Shell builtins only (the CNI env has a bare PATH).
while IFS= read -r _l; do :; done
case "$CNI_COMMAND" in
  ADD) printf '%s' '{"cniVersion":"1.0.0","code":100,"msg":"fake failure for the test","details":"chained after bridge"}'; exit 1 ;;
  VERSION) printf '%s' '{"cniVersion":"1.0.0","supportedVersions":["0.3.0","0.3.1","0.4.0","1.0.0"]}' ;;
  *) exit 0 ;;
esac
`;

async function hostRoutes(): Promise<string> {
  return (await execa('ip', ['-4', 'route', 'show', 'table', 'all'], { timeout: 10_000 })).stdout;
}

/** A /24 in 10.200-249.x.0 that no route on the host touches (its first three octets). */
export async function uniqueSubnet(): Promise<{ prefix: string }> {
  const routes = await hostRoutes();
  for (let i = 0; i < 50; i++) {
    const b = randomBytes(2);
    const prefix = `10.${200 + (b[0]! % 50)}.${b[1]!}`;
    if (!routes.includes(`${prefix}.`)) return { prefix };
  }
  throw new Error('no free 10.200-249.x.0/24 subnet found');
}

function filesUnder(dir: string): string[] {
  if (!existsSync(dir)) return [];
  const out: string[] = [];
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...filesUnder(p));
    else out.push(p);
  }
  return out;
}

export async function makeCniConf(opts: CniConfOptions = {}): Promise<CniTestNet> {
  const id = randomBytes(3).toString('hex');
  const name = `vmpodtest-${id}`;
  const bridge = `vmpt${id}`; // 10 bytes
  const { prefix } = await uniqueSubnet();
  const subnet = `${prefix}.0/24`;
  const gateway = `${prefix}.1`;
  const root = mkdtempSync(join(tmpdir(), 'vmpod-cni-'));
  const confDir = join(root, 'net.d');
  const binDir = join(root, 'bin');
  const cacheDir = join(root, 'cache');
  const dataDir = opts.ipamDataDir?.host ?? join(root, 'ipam');
  for (const d of [confDir, binDir, cacheDir, dataDir]) mkdirSync(d, { recursive: true });
  // a unique ULA /64 per network (fd + 40 random bits, RFC 4193)
  const p6 = randomBytes(5).toString('hex');
  // canonical text (RFC 5952: no leading zeros in a group), as ip and the clients print it
  const group = (h: string) => parseInt(h, 16).toString(16);
  const subnet6 = opts.ipv6 ? `fd${p6.slice(0, 2)}:${group(p6.slice(2, 6))}:${group(p6.slice(6, 10))}::/64` : undefined;
  const gateway6 = subnet6 ? subnet6.replace('::/64', '::1') : undefined;
  const ranges: Record<string, string>[][] = [];
  const routes: { dst: string }[] = [];
  if (opts.ipv6 !== 'only') {
    ranges.push([{ subnet, gateway }]);
    routes.push({ dst: '0.0.0.0/0' });
  }
  if (subnet6 && gateway6) {
    ranges.push([{ subnet: subnet6, gateway: gateway6 }]);
    routes.push({ dst: '::/0' });
  }
  const plugins: Record<string, unknown>[] = [
    {
      type: 'bridge',
      bridge,
      isGateway: true,
      ipMasq: false,
      ...(opts.mtu ? { mtu: opts.mtu } : {}),
      ipam: { type: 'host-local', dataDir: opts.ipamDataDir?.conf ?? dataDir, ranges, routes },
    },
  ];
  if (opts.failingPlugin) {
    writeFileSync(join(binDir, FAKE_PLUGIN), FAKE_SCRIPT);
    chmodSync(join(binDir, FAKE_PLUGIN), 0o755);
    plugins.push({ type: FAKE_PLUGIN });
  }
  const control = join(root, 'faulty.control');
  if (opts.faulty) {
    copyFileSync(FAULTY_SRC, join(binDir, FAULTY_PLUGIN));
    chmodSync(join(binDir, FAULTY_PLUGIN), 0o755);
    plugins.push({ type: FAULTY_PLUGIN, control });
  }
  writeFileSync(join(confDir, '10-test.conflist'), JSON.stringify({ cniVersion: '1.0.0', name, plugins }, null, 1));

  const leftovers = async (): Promise<Leftovers> => {
    const r = await execa('ip', ['-j', 'link', 'show', 'master', bridge], { reject: false, timeout: 10_000 });
    const veths =
      r.exitCode === 0 && r.stdout.trim() ? (JSON.parse(r.stdout) as { ifname: string }[]).map((l) => l.ifname) : [];
    // host-local keeps one file per allocated IP, plus last_reserved_ip.<range> and a lock file
    const allocations = filesUnder(dataDir).filter((f) => !/\/(last_reserved_ip\.\d+|lock)$/.test(f));
    return { veths, allocations, cacheFiles: filesUnder(cacheDir) };
  };
  const bridgeExists = async (): Promise<boolean> =>
    (await execa('ip', ['link', 'show', 'dev', bridge], { reject: false, timeout: 10_000 })).exitCode === 0;
  return {
    name,
    bridge,
    subnet,
    gateway,
    ...(subnet6 && gateway6 ? { subnet6, gateway6 } : {}),
    root,
    confDir,
    binDirs: [binDir, SYSTEM_CNI_BIN],
    cacheDir,
    dataDir,
    leftovers,
    bridgeExists,
    setFaults(modes) {
      writeFileSync(
        control,
        Object.entries(modes)
          .map(([v, m]) => `${v}=${m}\n`)
          .join(''),
      );
    },
    faultyRuns() {
      if (!existsSync(`${control}.runs`)) return [];
      return readFileSync(`${control}.runs`, 'utf8')
        .trim()
        .split('\n')
        .filter(Boolean)
        .map((l) => {
          const [verb, pid] = l.split(' ');
          return { verb: verb!, pid: Number(pid) };
        });
    },
    async cleanup() {
      if (await bridgeExists()) await execa('ip', ['link', 'del', 'dev', bridge], { timeout: 10_000 });
      rmSync(root, { recursive: true, force: true });
    },
  };
}
