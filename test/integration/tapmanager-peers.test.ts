// Who may use the socket: uid 0, and the members of --socket-group. File mode 0660 keeps others out; SO_PEERCRED
// keeps out anyone who gets through anyway.
import { describe, it, expect, afterEach } from 'vitest';
import { chmodSync, statSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { startDaemon, removeDir, REPO, type Daemon } from '../helpers/daemon.js';
import { makeCniConf, type CniTestNet } from '../helpers/cniconf.js';

const NOBODY = 65534; // nobody / nogroup on Debian

/**
 * Runs the built fd client's list() as another user (setpriv, so supplementary groups can be given too);
 * returns its exit code and output.
 */
function listAs(uid: number, gid: number, socket: string, groups: number[] = []): { status: number | null; out: string } {
  const script = `
    import { FdClient } from ${JSON.stringify(join(REPO, 'dist/client/fdclient.js'))};
    try { console.log(JSON.stringify(new FdClient(${JSON.stringify(socket)}, { timeoutMs: 5000 }).list())); }
    catch (e) { console.log(String(e.message)); process.exit(3); }`;
  const ids = [`--reuid=${uid}`, `--regid=${gid}`, groups.length ? `--groups=${groups.join(',')}` : '--clear-groups'];
  const r = spawnSync('setpriv', [...ids, process.execPath, '--input-type=module', '-e', script], { encoding: 'utf8', timeout: 20_000 });
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
}

let net: CniTestNet | undefined;
let d: Daemon | undefined;
afterEach(async () => {
  if (d) {
    expect(await d.stop()).toBe(0);
    removeDir(d.dir);
  }
  await net?.cleanup();
  d = undefined;
  net = undefined;
});

describe('socket access', () => {
  it('refuses a peer that is neither root nor in the socket group, even when the file mode lets it connect', async () => {
    net = await makeCniConf();
    d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir });
    chmodSync(d.dir, 0o755);
    // 0660 root:root: nobody cannot even connect
    expect(listAs(NOBODY, NOBODY, d.socket)).toMatchObject({ status: 3, out: expect.stringMatching(/EACCES/) });
    // opened up by hand: the server still refuses by credentials, and says why
    chmodSync(d.socket, 0o666);
    const r = listAs(NOBODY, NOBODY, d.socket);
    expect(r.status).toBe(3);
    expect(r.out).toMatch(/server returned error: permission denied: uid 65534 gid 65534/);
    expect(d.alive()).toBe(true);
  });

  it('serves the members of --socket-group, and gives the socket that group', async () => {
    net = await makeCniConf();
    d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir, extraArgs: ['--socket-group', String(NOBODY)] });
    chmodSync(d.dir, 0o755);
    const st = statSync(d.socket);
    expect(st.gid).toBe(NOBODY);
    expect(st.mode & 0o777).toBe(0o660);
    const r = listAs(NOBODY, NOBODY, d.socket);
    expect(r).toMatchObject({ status: 0 });
    expect(JSON.parse(r.out)).toEqual([]);
    // a member through a supplementary group (primary group 100, "users") is served too
    expect(listAs(NOBODY, 100, d.socket, [NOBODY])).toMatchObject({ status: 0 });
    // and without the group, refused by the file mode
    expect(listAs(NOBODY, 100, d.socket)).toMatchObject({ status: 3 });
  });
});
