// Faults around the pod network, against the real kernel and the real bridge + host-local plugins, with the
// fault-injection plugin (test/fixtures/cni/faulty) chained after bridge: failed adds never block the retry,
// quarantine and release --force, DEL against the network the ADD used, misbehaving plugins, a netns that
// vanished, recover of a live key, the pod's DNS in the result.
import { describe, it, expect, afterEach } from 'vitest';
import { existsSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';
import { PodNetwork } from '../../src/podnet/index.js';
import { StateStore } from '../../src/state/store.js';
import { CniClient, spawnPluginExec, loadConfList, readPgidRecords } from '../../src/cni/index.js';
import { silentLogger } from '../../src/log.js';
import { errorChain } from '../../src/errors.js';
import { FAULTY_PLUGIN, makeCniConf, type CniConfOptions, type CniTestNet } from '../helpers/cniconf.js';
import { processAlive, processesNaming } from '../helpers/baseline.js';

const NETNS_DIR = '/var/run/netns';

interface Ctx {
  net: CniTestNet;
  stateDir: string;
  pgidDir: string;
  key: string;
  make(opts?: { timeoutMs?: number }): PodNetwork;
}

const cleanups: (() => Promise<void>)[] = [];

afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function setup(opts: CniConfOptions = { faulty: true }): Promise<Ctx> {
  const net = await makeCniConf(opts);
  const stateDir = mkdtempSync(join(tmpdir(), 'vmpod-faults-state-'));
  const pgidDir = join(stateDir, 'plugins');
  const key = `vmpodf-${randomBytes(4).toString('hex')}`;
  const nets: PodNetwork[] = [];
  const ctx: Ctx = {
    net,
    stateDir,
    pgidDir,
    key,
    make({ timeoutMs } = {}) {
      const cni = new CniClient({
        binDirs: net.binDirs,
        cacheDir: net.cacheDir,
        exec: spawnPluginExec({ pgidDir, killGraceMs: 500 }),
        ...(timeoutMs ? { timeoutMs } : {}),
      });
      const pn = new PodNetwork({ stateDir, cni, loadConfList: () => loadConfList(net.confDir), log: silentLogger() });
      nets.push(pn);
      return pn;
    },
  };
  cleanups.push(async () => {
    for (const pn of nets) pn.closeAll();
    if (existsSync(join(NETNS_DIR, key))) await execa('ip', ['netns', 'del', key], { reject: false });
    for (const r of net.faultyRuns()) if (processAlive(r.pid)) process.kill(r.pid, 'SIGKILL');
    await net.cleanup();
    rmSync(stateDir, { recursive: true, force: true });
    expect(existsSync(join(NETNS_DIR, key)), 'netns left').toBe(false);
  });
  return ctx;
}

const desc = (key: string, DNS: { nameservers?: string[]; search?: string[]; options?: string[] } | null = null) => ({
  podId: `uid-${key}`,
  podNs: 'default',
  podName: `vm-${key}`,
  DNS,
});

/** What a user would find left on the node: the netns, veths on the CNI bridge, IPAM files, cache files, records, plugin processes. */
async function expectNothingLeft(ctx: Ctx) {
  expect(existsSync(join(NETNS_DIR, ctx.key)), 'netns').toBe(false);
  // a netns deleted behind our back takes its veth with it only when the kernel's (asynchronous) netns cleanup
  // runs: a leak stays, a cleanup in flight goes within seconds
  let left = await ctx.net.leftovers();
  for (let i = 0; i < 100 && left.veths.length > 0; i++) {
    await new Promise((r) => setTimeout(r, 100));
    left = await ctx.net.leftovers();
  }
  expect(left).toEqual({ veths: [], allocations: [], cacheFiles: [] });
  expect(new StateStore(ctx.stateDir).keys(), 'records').toEqual([]);
  expect(
    ctx.net.faultyRuns().filter((r) => processAlive(r.pid)),
    'plugin processes still running',
  ).toEqual([]);
  // no plugin record (a slot is blanked when its plugin's run ends), and no file of the pod in the state dir (the
  // daemon's slot file, all blank, stays under plugins/)
  expect(
    existsSync(ctx.pgidDir) ? readdirSync(ctx.pgidDir).flatMap((n) => readPgidRecords(join(ctx.pgidDir, n))) : [],
    'pgid records',
  ).toEqual([]);
  expect(
    readdirSync(ctx.stateDir, { recursive: true })
      .map(String)
      .filter((n) => n !== 'plugins' && !n.startsWith('plugins/')),
    'state dir',
  ).toEqual([]);
}

/** The bridge plugin behind a script that notes each command once it has its config; the list's first plugin. */
function lookingPlugin(ctx: Ctx): { seen: string; look: string } {
  const conf = join(ctx.net.confDir, '10-test.conflist');
  const good = JSON.parse(readFileSync(conf, 'utf8')) as { plugins: Record<string, unknown>[] };
  const seen = join(ctx.stateDir, '..', `${ctx.key}.seen`);
  cleanups.push(async () => rmSync(seen, { force: true }));
  const look = join(ctx.net.binDirs[0]!, 'vmpod-look');
  const script = [
    '#!/bin/bash',
    'conf=$(cat)',
    `echo "$CNI_COMMAND" >> ${seen}`,
    'printf "%s" "$conf" | exec /usr/lib/cni/bridge',
  ];
  writeFileSync(look, script.join('\n'), { mode: 0o755 });
  writeFileSync(
    conf,
    JSON.stringify({ ...good, plugins: [{ ...good.plugins[0], type: 'vmpod-look' }, ...good.plugins.slice(1)] }),
  );
  return { seen, look };
}

/** dir read-only (a bind mount over itself: root writes anywhere else); resolves with the undo. */
async function readOnly(dir: string): Promise<() => Promise<void>> {
  await execa('mount', ['--bind', dir, dir]);
  let mounted = true;
  const unmount = async () => {
    if (mounted) await execa('umount', [dir]);
    mounted = false;
  };
  cleanups.push(unmount);
  await execa('mount', ['-o', 'remount,bind,ro', dir]);
  return unmount;
}

/** A PodNetwork whose plugins' groups are recorded nowhere (the state dir may be read-only). */
function plainPodNetwork(ctx: Ctx): PodNetwork {
  const cni = new CniClient({
    binDirs: ctx.net.binDirs,
    cacheDir: ctx.net.cacheDir,
    exec: spawnPluginExec({ killGraceMs: 500 }),
  });
  return new PodNetwork({
    stateDir: ctx.stateDir,
    cni,
    loadConfList: () => loadConfList(ctx.net.confDir),
    log: silentLogger(),
  });
}

async function errorOf(p: Promise<unknown>): Promise<Error & { code?: string }> {
  try {
    await p;
  } catch (e) {
    return e as Error & { code?: string };
  }
  throw new Error('did not fail');
}

describe('a failed add never blocks the retry', () => {
  it.each([
    ['not a program (ENOEXEC)', 'not a program\n'],
    ['a script whose interpreter is missing (ENOENT)', '#!/nonexistent/vmpod-interp\n'],
  ])(
    'a first plugin that cannot be executed, %s, ran nothing: no DEL, no quarantined record, no temp file',
    async (_what, content) => {
      const ctx = await setup({});
      const conf = join(ctx.net.confDir, '10-test.conflist');
      const good = JSON.parse(readFileSync(conf, 'utf8')) as { plugins: Record<string, unknown>[] };
      writeFileSync(join(ctx.net.binDirs[0]!, 'vmpod-noexec'), content, { mode: 0o755 });
      writeFileSync(conf, JSON.stringify({ ...good, plugins: [{ type: 'vmpod-noexec' }, ...good.plugins] }));
      const pn = ctx.make();
      const e = await errorOf(pn.add(ctx.key, desc(ctx.key)));
      expect(e.message).toMatch(/step "cni-add" failed: plugin vmpod-noexec ADD could not be run: .*(ENOEXEC|ENOENT)/);
      expect(e.message).not.toContain('rollback incomplete');
      await expectNothingLeft(ctx);
      writeFileSync(conf, JSON.stringify(good));
      await pn.add(ctx.key, desc(ctx.key));
      await pn.release(ctx.key);
      await expectNothingLeft(ctx);
    },
  );

  it('a release cut by kill -9 after the netns was unmounted, before its file went: the restart finishes it', async () => {
    const ctx = await setup({});
    const pn = ctx.make();
    await pn.add(ctx.key, desc(ctx.key));
    pn.closeAll();
    const store = new StateStore(ctx.stateDir);
    store.write({ ...store.read(ctx.key)!, phase: 'releasing' });
    await execa('umount', [join(NETNS_DIR, ctx.key)]);
    expect(existsSync(join(NETNS_DIR, ctx.key))).toBe(true);
    const out = await ctx.make().restore();
    expect(out.rolledBack).toEqual([ctx.key]);
    expect(out.quarantined).toEqual([]);
    // no record is left in phase releasing (nor in any other)
    expect(store.keys()).toEqual([]);
    await expectNothingLeft(ctx);
  });

  it('a plugin missing at add: nothing recorded, nothing left, and the retry succeeds once it is installed', async () => {
    const ctx = await setup({});
    const conf = join(ctx.net.confDir, '10-test.conflist');
    const good = JSON.parse(readFileSync(conf, 'utf8')) as { plugins: Record<string, unknown>[] };
    writeFileSync(conf, JSON.stringify({ ...good, plugins: [...good.plugins, { type: 'vmpod-not-installed' }] }));
    const pn = ctx.make();
    const e = await errorOf(pn.add(ctx.key, desc(ctx.key)));
    expect(e.message).toMatch(/step "cni-add" failed: .*CNI plugin "vmpod-not-installed" not found/);
    await expectNothingLeft(ctx);
    writeFileSync(conf, JSON.stringify(good));
    const st = await pn.add(ctx.key, desc(ctx.key));
    expect(st.csn.Result!.ips!.length).toBe(1);
    await pn.release(ctx.key);
    await expectNothingLeft(ctx);
  });

  it('a release whose last plugin was uninstalled: the DEL goes on with the others, the release fails naming it, the retry finishes', async () => {
    const ctx = await setup();
    const pn = ctx.make();
    await pn.add(ctx.key, desc(ctx.key));
    const faulty = join(ctx.net.binDirs[0]!, FAULTY_PLUGIN);
    const kept = `${faulty}.kept`;
    renameSync(faulty, kept);
    cleanups.push(async () => (existsSync(kept) ? renameSync(kept, faulty) : undefined));
    // DEL runs the list in reverse: the missing plugin's turn comes first, and the bridge plugin's DEL after it
    const e = await errorOf(pn.release(ctx.key));
    expect(e.message).toMatch(/CNI plugin "faulty" not found/);
    expect((await ctx.net.leftovers()).allocations, "the bridge plugin's DEL freed the address").toEqual([]);
    renameSync(kept, faulty);
    await pn.release(ctx.key);
    pn.closeAll();
    await expectNothingLeft(ctx);
  });

  it('plugins started early have their config only once it is time: ADD once the netns is mounted and its record on disk, DEL once the interface is given back', async () => {
    const ctx = await setup({});
    const conf = join(ctx.net.confDir, '10-test.conflist');
    const good = JSON.parse(readFileSync(conf, 'utf8')) as { plugins: Record<string, unknown>[] };
    const seen = join(ctx.stateDir, '..', `${ctx.key}.seen`);
    cleanups.push(async () => rmSync(seen, { force: true }));
    // the bridge plugin behind a script that looks, once it has read its config, at what a crash would leave
    writeFileSync(
      join(ctx.net.binDirs[0]!, 'vmpod-look'),
      [
        '#!/bin/bash',
        'conf=$(cat)',
        `if [ "$CNI_COMMAND" = ADD ]; then`,
        `  grep -q "/netns/${ctx.key} " /proc/self/mountinfo && echo netns-mounted`,
        `  grep -qs '"cni-add"' ${join(ctx.stateDir, `${ctx.key}.json`)} && echo record-has-cni-add`,
        'elif [ "$CNI_COMMAND" = DEL ]; then',
        // the undo before the DEL gave the interface back its address and took the redirect's qdisc off it
        `  ip -n ${ctx.key} -4 -o addr show dev "$CNI_IFNAME" | grep -q inet && echo del-sees-address`,
        `  tc -n ${ctx.key} qdisc show dev "$CNI_IFNAME" | grep -q ingress || echo del-sees-no-redirect`,
        `fi >> ${seen}`,
        'printf "%s" "$conf" | exec /usr/lib/cni/bridge',
      ].join('\n'),
      { mode: 0o755 },
    );
    writeFileSync(
      conf,
      JSON.stringify({ ...good, plugins: [{ ...good.plugins[0], type: 'vmpod-look' }, ...good.plugins.slice(1)] }),
    );
    const pn = ctx.make();
    const st = await pn.add(ctx.key, desc(ctx.key));
    expect(st.csn.Result!.ips!.length).toBe(1);
    expect(readFileSync(seen, 'utf8')).toBe('netns-mounted\nrecord-has-cni-add\n');
    await pn.release(ctx.key);
    expect(readFileSync(seen, 'utf8')).toBe(
      'netns-mounted\nrecord-has-cni-add\ndel-sees-address\ndel-sees-no-redirect\n',
    );
    await expectNothingLeft(ctx);
  });

  it('the ADD is started before the netns stage is over, and its go comes once the netns is mounted and the record holds the ADD', async () => {
    const ctx = await setup({});
    const real = new CniClient({ binDirs: ctx.net.binDirs, cacheDir: ctx.net.cacheDir });
    const nsPath = join(NETNS_DIR, ctx.key);
    const seen: string[] = [];
    const cni = new Proxy(real, {
      get(target, prop) {
        if (prop !== 'addDeferred') {
          const v = Reflect.get(target, prop, target) as unknown;
          return typeof v === 'function' ? (v as (...x: unknown[]) => unknown).bind(target) : v;
        }
        return (...a: Parameters<CniClient['addDeferred']>) => {
          const hold = a[3];
          seen.push(`called; a go to wait for: ${hold !== undefined}`);
          void hold?.until.then(() => {
            const rec = new StateStore(ctx.stateDir).read(ctx.key);
            seen.push(
              `go; netns there: ${existsSync(nsPath)}; cni-add recorded: ${rec?.steps.some((st) => st.name === 'cni-add')}`,
            );
          });
          return target.addDeferred(...a);
        };
      },
    });
    const pn = new PodNetwork({
      stateDir: ctx.stateDir,
      cni,
      loadConfList: () => loadConfList(ctx.net.confDir),
      log: silentLogger(),
    });
    await pn.add(ctx.key, desc(ctx.key));
    expect(seen).toEqual(['called; a go to wait for: true', 'go; netns there: true; cni-add recorded: true']);
    await pn.release(ctx.key);
    pn.closeAll();
    await expectNothingLeft(ctx);
  });

  it('a record that cannot be written once the ADD has started: its plugin is killed without its config, the add says why, nothing is left', async () => {
    const ctx = await setup({});
    const { seen, look } = lookingPlugin(ctx);
    const unmount = await readOnly(ctx.stateDir);
    const pn = plainPodNetwork(ctx);
    const e = await errorOf(pn.add(ctx.key, desc(ctx.key)));
    pn.closeAll();
    expect(e.message).toMatch(/step "state-write" failed: .*EROFS: read-only file system/);
    expect(existsSync(seen), 'the plugin had its config').toBe(false);
    expect(processesNaming(look), 'the plugin still running').toEqual([]);
    await unmount();
    await expectNothingLeft(ctx);
  });

  it("a release whose record cannot be written: its DEL's plugin is killed without its config, the pod stays, and the next release frees it", async () => {
    const ctx = await setup({});
    const { seen, look } = lookingPlugin(ctx);
    const pn = plainPodNetwork(ctx);
    await pn.add(ctx.key, desc(ctx.key));
    const unmount = await readOnly(ctx.stateDir);
    const e = await errorOf(pn.release(ctx.key));
    // what the client's error reply says (the server replies with the error's chain)
    expect(errorChain(e)).toMatch(/^write state record .*: EROFS: read-only file system/);
    expect(readFileSync(seen, 'utf8'), 'what had its config').toBe('ADD\n');
    expect(processesNaming(look), 'the plugin still running').toEqual([]);
    expect(existsSync(join(NETNS_DIR, ctx.key)), 'the netns').toBe(true);
    expect(new StateStore(ctx.stateDir).read(ctx.key)?.phase).toBe('ready');
    await unmount();
    await pn.release(ctx.key);
    pn.closeAll();
    expect(readFileSync(seen, 'utf8')).toBe('ADD\nDEL\n');
    await expectNothingLeft(ctx);
  });

  it('ADD fails and its rollback DEL fails too: the error says quarantined; the retry finishes it first and succeeds', async () => {
    const ctx = await setup();
    ctx.net.setFaults({ ADD: 'fail', DEL: 'fail' });
    const pn = ctx.make();
    const e = await errorOf(pn.add(ctx.key, desc(ctx.key)));
    expect(e.message).toContain('plugin faulty ADD failed: [code 100] faulty: injected failure');
    expect(e.message).toContain('plugin faulty DEL failed');
    expect(e.message).toContain(
      `quarantined: the next add or release of ${ctx.key} finishes it first, or run "tapctl release --force ${ctx.key}"`,
    );
    expect(new StateStore(ctx.stateDir).read(ctx.key)?.quarantine?.errors.length).toBeGreaterThan(0);

    // the cause still there: the retry says so, and changes nothing
    ctx.net.setFaults({ ADD: 'ok', DEL: 'fail' });
    const again = await errorOf(pn.add(ctx.key, desc(ctx.key)));
    expect(again.code).toBe('CONFLICT');
    expect(again.message).toMatch(
      /quarantined and still cannot be undone: .*plugin faulty DEL failed.*tapctl release --force/,
    );

    // the cause fixed: the retry finishes the quarantine, then adds
    ctx.net.setFaults({});
    const st = await pn.add(ctx.key, desc(ctx.key));
    expect((await ctx.net.leftovers()).allocations).toHaveLength(1);
    expect(st.csn.Result!.ips!.length).toBe(1);
    await pn.release(ctx.key);
    await expectNothingLeft(ctx);
  });

  it('release --force finishes a quarantined key by hand, says what could not be undone, and frees the key', async () => {
    const ctx = await setup();
    ctx.net.setFaults({ ADD: 'fail', DEL: 'fail' });
    const pn = ctx.make();
    await errorOf(pn.add(ctx.key, desc(ctx.key)));
    // a plain release cannot finish it either, and keeps it
    expect((await errorOf(pn.release(ctx.key))).message).toMatch(
      /stays quarantined for a retry \(or "tapctl release --force/,
    );
    const { leftovers } = await pn.release(ctx.key, { force: true });
    expect(leftovers.join('\n')).toContain('plugin faulty DEL failed');
    expect(new StateStore(ctx.stateDir).keys()).toEqual([]);
    expect(existsSync(join(NETNS_DIR, ctx.key))).toBe(false);
    // DEL went on past the failing plugin: bridge's DEL freed the IP
    await expectNothingLeft(ctx);
  });
});

describe('DEL runs against the network the ADD used', () => {
  it('the network renamed and replaced between add and release: the IP is freed', async () => {
    const ctx = await setup({});
    const pn = ctx.make();
    await pn.add(ctx.key, desc(ctx.key));
    expect((await ctx.net.leftovers()).allocations).toHaveLength(1);
    // another network under another name, in another file; the old file gone
    const conf = join(ctx.net.confDir, '10-test.conflist');
    const other = JSON.parse(readFileSync(conf, 'utf8')) as Record<string, unknown>;
    writeFileSync(
      join(ctx.net.confDir, '05-other.conflist'),
      JSON.stringify({ ...other, name: `other-${ctx.key}`, plugins: [{ type: 'loopback' }] }),
    );
    rmSync(conf);
    await pn.release(ctx.key);
    await expectNothingLeft(ctx);
  });

  it('an empty config dir, or a broken config, at release time does not stop the release', async () => {
    const ctx = await setup({});
    const pn = ctx.make();
    await pn.add(ctx.key, desc(ctx.key));
    const conf = join(ctx.net.confDir, '10-test.conflist');
    const saved = join(ctx.net.root, 'saved.conflist');
    renameSync(conf, saved);
    await pn.release(ctx.key);
    await expectNothingLeft(ctx);

    renameSync(saved, conf);
    await pn.add(ctx.key, desc(ctx.key));
    writeFileSync(conf, '{ this is not JSON');
    await pn.release(ctx.key);
    await expectNothingLeft(ctx);
  });
});

describe('CNI plugin faults: a clear error naming the plugin, a full rollback, nothing left', () => {
  const cases: { mode: 'flood' | 'garbage' | 'error-exit0' | 'ignore-term'; want: RegExp }[] = [
    { mode: 'flood', want: /plugin faulty ADD failed: its output exceeded the size limit of 1048576 bytes \(killed\)/ },
    { mode: 'garbage', want: /plugin faulty ADD returned a result that is not JSON: this is not JSON \{\\x1b\[31m/ },
    {
      mode: 'error-exit0',
      want: /plugin faulty ADD exited 0 but printed a CNI error: \[code 100\] faulty: injected failure/,
    },
    { mode: 'ignore-term', want: /plugin faulty ADD timed out after 20000 ms \(killed with SIGKILL\)/ },
  ];
  for (const { mode, want } of cases) {
    it(`ADD in mode ${mode}`, async () => {
      const ctx = await setup();
      ctx.net.setFaults({ ADD: mode });
      // a timeout far above what a plugin takes on a loaded machine; only the hanging one reaches it
      const pn = ctx.make({ timeoutMs: 20_000 });
      const e = await errorOf(pn.add(ctx.key, desc(ctx.key)));
      expect(e.message).toMatch(new RegExp(`^add ${ctx.key}: step "cni-add" failed: `));
      expect(e.message).toMatch(want);
      expect(e.message.length).toBeLessThan(10_000);
      expect(ctx.net.faultyRuns().map((r) => r.verb)).toEqual(['ADD', 'DEL']);
      await expectNothingLeft(ctx);
      // and the key is free
      ctx.net.setFaults({});
      await pn.add(ctx.key, desc(ctx.key));
      await pn.release(ctx.key);
      await expectNothingLeft(ctx);
    });
  }
});

describe('restart and recover', () => {
  it('a record that says ready whose netns is missing is reported and kept; release then frees the IP', async () => {
    const ctx = await setup({});
    const pn1 = ctx.make();
    await pn1.add(ctx.key, desc(ctx.key));
    pn1.closeAll();
    await execa('ip', ['netns', 'del', ctx.key]);
    const pn2 = ctx.make();
    expect(await pn2.restore()).toEqual({ restored: [], rolledBack: [], netnsMissing: [ctx.key], quarantined: [] });
    expect(new StateStore(ctx.stateDir).read(ctx.key)?.phase).toBe('ready');
    expect((await ctx.net.leftovers()).allocations).toHaveLength(1);
    await pn2.release(ctx.key);
    await expectNothingLeft(ctx);
  });

  it('recover of a live key: the same csn is a no-op, another csn an error', async () => {
    const ctx = await setup({});
    const pn = ctx.make();
    const st = await pn.add(ctx.key, desc(ctx.key));
    const same = await pn.recover(ctx.key, {
      podNetworkDesc: desc(ctx.key),
      csn: structuredClone(st.csn),
      HaveRunningContainers: true,
    });
    expect(same.fds).toEqual(st.fds);
    const other = structuredClone(st.csn);
    other.Result!.ips![0]!.address = '10.99.99.99/24';
    const e = await errorOf(
      pn.recover(ctx.key, { podNetworkDesc: desc(ctx.key), csn: other, HaveRunningContainers: true }),
    );
    expect(e.code).toBe('CONFLICT');
    expect(e.message).toContain('live with another container-side network');
    expect(pn.state(ctx.key)!.csn).toEqual(st.csn);
    await pn.release(ctx.key);
    await expectNothingLeft(ctx);
  });

  it("the add's DNS goes into the result the runtime keeps", async () => {
    const ctx = await setup({});
    const pn = ctx.make();
    const dns = {
      nameservers: ['10.96.0.10'],
      search: ['default.svc.cluster.local', 'cluster.local'],
      options: ['ndots:5'],
    };
    const st = await pn.add(ctx.key, desc(ctx.key, dns));
    expect(st.csn.Result!.dns).toEqual(dns);
    await pn.release(ctx.key);
    await expectNothingLeft(ctx);
  });
});
