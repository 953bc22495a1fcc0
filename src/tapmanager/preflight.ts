// Start-up checks of the paths tapmanager needs, before anything listens: each problem is one line naming the
// path and what to do. A missing dir that should be a host mount is not created (it would live in the container
// only, invisible to the host); the state and CNI cache dirs are created when missing, then must be writable.
import { accessSync, constants, mkdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import type { TapmanagerConfig } from './config.js';

function why(e: unknown): string {
  const err = e as NodeJS.ErrnoException;
  return err.code ?? err.message;
}

function isDir(path: string): boolean | string {
  try {
    return statSync(path).isDirectory();
  } catch (e) {
    return why(e);
  }
}

/** Creates the dir if missing, then writes and removes a probe file in it. */
function writableDir(path: string, what: string, flag: string): string | undefined {
  try {
    mkdirSync(path, { recursive: true, mode: 0o700 });
  } catch (e) {
    return `${what} ${path} cannot be created (${why(e)}): create it, or mount a writable host dir there (${flag})`;
  }
  const probe = join(path, `.vmpod-write-check-${process.pid}`);
  try {
    writeFileSync(probe, '', { mode: 0o600 });
    rmSync(probe);
  } catch (e) {
    return `${what} ${path} is not writable (${why(e)}): make it writable for tapmanager's user, or mount a writable host dir there (${flag})`;
  }
  return undefined;
}

/** Every problem found, one line each; empty when tapmanager can start. */
export function preflight(config: Pick<TapmanagerConfig, 'socket' | 'stateDir' | 'cniCacheDir' | 'cniBinDirs'>): string[] {
  const problems: string[] = [];
  const sockDir = dirname(config.socket);
  const d = isDir(sockDir);
  if (d !== true) {
    problems.push(
      d === false
        ? `socket dir ${sockDir} is not a directory: fix --socket / VIRTLET_FD_SERVER_SOCKET_PATH`
        : `socket dir ${sockDir} does not exist (${d}): mount the host's ${sockDir} into the tapmanager container (or create it on this host), or fix --socket / VIRTLET_FD_SERVER_SOCKET_PATH`,
    );
  } else {
    try {
      accessSync(sockDir, constants.W_OK);
    } catch (e) {
      problems.push(`socket dir ${sockDir} is not writable (${why(e)}): the socket cannot be created there; run tapmanager as root or fix --socket`);
    }
  }
  for (const bin of config.cniBinDirs) {
    const b = isDir(bin);
    if (b !== true) {
      problems.push(`CNI plugin dir ${bin} ${b === false ? 'is not a directory' : `does not exist (${b})`}: mount the host's ${bin} (read-only) into the container, or fix --cni-bin-dir / VIRTLET_CNI_PLUGIN_DIR`);
    }
  }
  const st = writableDir(config.stateDir, 'state dir', '--state-dir / VMPOD_STATE_DIR');
  if (st) problems.push(st);
  const cache = writableDir(config.cniCacheDir, 'CNI cache dir', '--cni-cache-dir / VMPOD_CNI_CACHE_DIR');
  if (cache) problems.push(cache);
  return problems;
}
