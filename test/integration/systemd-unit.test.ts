// deploy/systemd/vmpod-tapmanager.service as systemd itself reads it (systemd-analyze verify, offline).
import { describe, it, expect } from 'vitest';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { execa } from 'execa';
import { REPO } from '../helpers/daemon.js';

const UNIT = join(REPO, 'deploy/systemd/vmpod-tapmanager.service');

describe('systemd unit', () => {
  it('verifies cleanly and is Type=notify with a watchdog, SIGTERM and the state dir', async () => {
    const r = await execa('systemd-analyze', ['verify', UNIT], { reject: false, timeout: 60_000 });
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
