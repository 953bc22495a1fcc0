// deploy/systemd/vmpod-tapmanager.service as systemd itself reads it (systemd-analyze verify, offline). Its ExecStart
// names the host install's paths (scripts/install-host.sh; test/deploy/package.test.ts installs into a scratch root and
// runs them): verify reads a copy whose ExecStart names the same programs where this checkout has them.
import { describe, it, expect } from 'vitest';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';
import { REPO } from '../helpers/daemon.js';

const UNIT = join(REPO, 'deploy/systemd/vmpod-tapmanager.service');

describe('systemd unit', () => {
  it('verifies cleanly and is Type=notify with a watchdog, SIGTERM and the state dir', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'vmpod-unit-'));
    const here = join(dir, 'vmpod-tapmanager.service');
    writeFileSync(
      here,
      readFileSync(UNIT, 'utf8')
        .replace('/usr/local/lib/vmpod-node/node/bin/node', process.execPath)
        .replace('/usr/local/lib/node_modules/vmpod-node/', `${REPO}/`),
    );
    const r = await execa('systemd-analyze', ['verify', here], { reject: false, timeout: 60_000 });
    rmSync(dir, { recursive: true, force: true });
    expect(r.exitCode, r.stderr).toBe(0);
    expect(r.stderr).toBe('');
    const keys = new Map(
      readFileSync(UNIT, 'utf8')
        .split('\n')
        .filter((l) => /^[A-Za-z]+=/.test(l))
        .map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]),
    );
    expect(keys.get('Type')).toBe('notify');
    expect(keys.get('NotifyAccess')).toBe('main');
    expect(keys.get('KillSignal')).toBe('SIGTERM');
    expect(Number(keys.get('WatchdogSec'))).toBeGreaterThan(0);
    expect(keys.get('StateDirectory')).toBe('vmpod-node');
    expect(keys.get('ExecStart')).toMatch(/dist\/bundle\/tapmanager\.js$/);
  });
});
