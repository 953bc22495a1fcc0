// The package as npm ships it: `npm pack` (prepack builds dist/), then `npm install` of the tarball into an empty
// directory, which builds the addon from its source against the running node. Each bin answers --version, vmwrapper
// runs a libvirt probe through the addon (the stub emulator in place of qemu), and the ./client and ./devices exports
// import. Then scripts/install-host.sh installs the same tarball into a scratch root, and what the systemd unit's
// ExecStart names is there and runs. The repository itself is packed from a copy: prepack rebuilds dist/, which the
// other test files run meanwhile.
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readdirSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { REPO } from '../helpers/daemon.js';
import { runVmwrapper, STUB_EMULATOR } from '../helpers/vmwrapper.js';

const VERSION = (JSON.parse(readFileSync(join(REPO, 'package.json'), 'utf8')) as { version: string }).version;
/** what the copy leaves out: build output, caches, the VCS */
const NOT_COPIED = new Set(['node_modules', 'dist', 'build', '.cache', '.git']);
// the node running the tests first on PATH (Node 24 under scripts/test.sh): npm runs the install step with it
const PATH = `${join(process.execPath, '..')}:${process.env.PATH ?? '/usr/bin:/bin'}`;

function npm(args: string[], cwd: string, timeout = 600_000) {
  return execa('npm', args, { cwd, timeout, env: { PATH }, extendEnv: true, stdin: 'ignore' });
}

describe('the npm package', () => {
  let work: string;
  let tarball: string;
  const installed = (): string => join(work, 'app', 'node_modules', 'vmpod-node');

  beforeAll(async () => {
    work = mkdtempSync(join(tmpdir(), 'vmpod-pkg-'));
    const src = join(work, 'src');
    cpSync(REPO, src, { recursive: true, filter: (p) => !NOT_COPIED.has(p.slice(REPO.length + 1).split('/')[0]!) });
    // the dev dependencies prepack's build needs (tsc, esbuild), as installed here
    symlinkSync(join(REPO, 'node_modules'), join(src, 'node_modules'));
    mkdirSync(join(work, 'pack'));
    await npm(['pack', '--pack-destination', join(work, 'pack')], src);
    tarball = join(work, 'pack', readdirSync(join(work, 'pack')).find((f) => f.endsWith('.tgz'))!);
    mkdirSync(join(work, 'app'));
    writeFileSync(join(work, 'app', 'package.json'), JSON.stringify({ name: 'vmpod-pkg-test', private: true }));
    await npm(['install', '--no-audit', '--no-fund', '--prefer-offline', tarball], join(work, 'app'));
  }, 900_000);

  afterAll(() => {
    if (work) rmSync(work, { recursive: true, force: true });
  });

  it('ships dist/, the bins, the addon source and binding.gyp; no sources, tests or build output', async () => {
    const files = (await execa('tar', ['tzf', tarball])).stdout.split('\n');
    for (const f of [
      'dist/bundle/tapmanager.js',
      'dist/bundle/tapctl.js',
      'dist/bundle/vmwrapper.cjs',
      'dist/bundle/vmwrapper-start.cjs',
      'dist/client/fdclient.js',
      'dist/devices/index.d.ts',
      'bin/tapmanager.js',
      'binding.gyp',
      'native/vmpod.c',
      'scripts/install-addon.mjs',
      'deploy/systemd/vmpod-tapmanager.service',
      'package.json',
    ]) {
      expect(files, f).toContain(`package/${f}`);
    }
    expect(files.filter((f) => /^package\/(src|test|node_modules|build)\//.test(f))).toEqual([]);
  });

  it('installs into an empty dir: the addon built from source against this node, each bin --version', async () => {
    // built here, at install, not shipped
    expect(existsSync(join(installed(), 'build/Release/vmpod_native.node'))).toBe(true);
    const gypi = readFileSync(join(installed(), 'build/config.gypi'), 'utf8');
    expect(gypi).toContain(`"nodedir": "${join(process.execPath, '../..')}"`);
    for (const bin of ['tapmanager', 'tapctl', 'vmwrapper']) {
      const r = await execa(join(work, 'app/node_modules/.bin', bin), ['--version'], { env: { PATH }, reject: false });
      expect(r.exitCode, `${bin}: ${r.stderr}`).toBe(0);
      expect(r.stdout).toBe(VERSION);
    }
    // vmwrapper is its own program: its shebang is the node that installed it
    expect(readFileSync(join(installed(), 'dist/bundle/vmwrapper.cjs'), 'utf8').split('\n')[0]).toBe(
      `#!${process.execPath}`,
    );
  });

  it('the installed vmwrapper passes a libvirt probe to the emulator through the addon (execve, same PID)', async () => {
    const args = ['-S', '-no-user-config', '-nodefaults', '-nographic', '-machine', 'none,accel=tcg'];
    const r = await runVmwrapper({
      program: join(work, 'app/node_modules/.bin/vmwrapper'),
      args,
      env: { VMWRAPPER_DEFAULT_EMULATOR: STUB_EMULATOR },
    });
    expect(r.code, r.stderr).toBe(0);
    expect(r.stub?.pid).toBe(r.pid);
    expect(r.stub?.argv.slice(1)).toEqual(args);
  });

  it('imports ./client and ./devices', async () => {
    const code =
      "const c = await import('vmpod-node/client'); const d = await import('vmpod-node/devices'); console.log(JSON.stringify([typeof c.FdClient, typeof d.collectDevices]));";
    const r = await execa(process.execPath, ['--input-type=module', '-e', code], { cwd: join(work, 'app') });
    expect(JSON.parse(r.stdout)).toEqual(['function', 'function']);
  });

  it("scripts/install-host.sh into a scratch root: the systemd unit's ExecStart exists there and runs", async () => {
    const root = join(work, 'root');
    const r = await execa('bash', [join(REPO, 'scripts/install-host.sh'), '--root', root, '--tarball', tarball], {
      env: { PATH },
      reject: false,
      timeout: 900_000,
      stdin: 'ignore',
    });
    expect(r.exitCode, r.stderr).toBe(0);
    const unit = readFileSync(join(root, 'etc/systemd/system/vmpod-tapmanager.service'), 'utf8');
    const execStart = /^ExecStart=(.*)$/m.exec(unit)?.[1]?.split(' ') ?? [];
    expect(execStart).toEqual([
      '/usr/local/lib/vmpod-node/node/bin/node',
      '/usr/local/lib/node_modules/vmpod-node/dist/bundle/tapmanager.js',
    ]);
    for (const p of execStart) expect(existsSync(join(root, p)), p).toBe(true);
    const run = await execa(join(root, execStart[0]!), [join(root, execStart[1]!), '--version']);
    expect(run.stdout).toBe(VERSION);
    expect((await execa(join(root, execStart[0]!), ['--version'])).stdout).toMatch(/^v24\./);
    // the bins, and vmwrapper's interpreter as the host will see it
    for (const bin of ['tapmanager', 'tapctl', 'vmwrapper'])
      expect(existsSync(join(root, 'usr/local/bin', bin)), bin).toBe(true);
    expect(
      readFileSync(join(root, 'usr/local/lib/node_modules/vmpod-node/dist/bundle/vmwrapper.cjs'), 'utf8').split(
        '\n',
      )[0],
    ).toBe('#!/usr/local/lib/vmpod-node/node/bin/node');
    expect(existsSync(join(root, 'usr/local/lib/node_modules/vmpod-node/build/Release/vmpod_native.node'))).toBe(true);
    expect(readFileSync(join(root, 'etc/default/vmpod-tapmanager'), 'utf8')).toMatch(/VIRTLET_CNI_PLUGIN_DIR/);
  });
});
