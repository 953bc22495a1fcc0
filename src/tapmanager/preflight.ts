// Start-up checks of the paths tapmanager needs, before anything listens: each problem is one line naming the
// path and what to do. A missing dir that should be a host mount is not created (it would live in the container
// only, invisible to the host); the state and CNI cache dirs are created when missing, and only once every check
// has passed.
import { accessSync, constants, existsSync, mkdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
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

/** The dir itself if it exists, else its nearest existing ancestor (where mkdir -p would start). */
function existingBase(path: string): string {
  let d = path;
  while (!existsSync(d) && dirname(d) !== d) d = dirname(d);
  return d;
}

/**
 * Can tapmanager write in `path`, creating it if missing? Checked without creating it: a probe file is written and
 * removed in the dir, or in its nearest existing ancestor when it is missing (mkdir -p would write there).
 */
function writableDir(path: string, what: string, flag: string): string | undefined {
  const base = existingBase(path);
  const d = isDir(base);
  if (d !== true)
    return (
      `${what} ${path} cannot be created (${d === false ? 'ENOTDIR' : d}): create it, or mount a writable host ` +
      `dir there (${flag})`
    );
  const probe = join(base, `.vmpod-write-check-${process.pid}`);
  try {
    writeFileSync(probe, '', { mode: 0o600 });
    rmSync(probe);
  } catch (e) {
    return base === path
      ? `${what} ${path} is not writable (${why(e)}): make it writable for tapmanager's user, or mount a writable ` +
          `host dir there (${flag})`
      : `${what} ${path} cannot be created (${why(e)} in ${base}): create it, or mount a writable host dir there ` +
          `(${flag})`;
  }
  return undefined;
}

export interface Preflight {
  /** every problem found, one line each; empty when tapmanager can start */
  problems: string[];
  /** the dirs this start created (only when there was no problem), for a start that fails later to remove */
  created: string[];
}

/**
 * Every check first, then (only when all pass) the state and CNI cache dirs are created: a start that fails its
 * checks leaves nothing behind, not even a new cache dir on the host.
 */
export function preflight(
  config: Pick<TapmanagerConfig, 'socket' | 'stateDir' | 'cniCacheDir' | 'cniBinDirs'>,
): Preflight {
  const problems = [...socketDirProblems(dirname(config.socket))];
  for (const bin of config.cniBinDirs) {
    const b = isDir(bin);
    if (b !== true) {
      problems.push(
        `CNI plugin dir ${bin} ${b === false ? 'is not a directory' : `does not exist (${b})`}: mount the host's ` +
          `${bin} (read-only) into the container, or fix --cni-bin-dir / VIRTLET_CNI_PLUGIN_DIR`,
      );
    }
  }
  const dirs: [string, string, string][] = [
    [config.stateDir, 'state dir', '--state-dir / VMPOD_STATE_DIR'],
    [config.cniCacheDir, 'CNI cache dir', '--cni-cache-dir / VMPOD_CNI_CACHE_DIR'],
  ];
  for (const [path, what, flag] of dirs) {
    const p = writableDir(path, what, flag);
    if (p) problems.push(p);
  }
  const created: string[] = [];
  if (problems.length > 0) return { problems, created };
  for (const [path, what, flag] of dirs) {
    try {
      // mkdir -p returns the first dir it made: the top of what this start created
      const top = mkdirSync(path, { recursive: true, mode: 0o700 });
      if (top !== undefined) created.push(top);
    } catch (e) {
      problems.push(
        `${what} ${path} cannot be created (${why(e)}): create it, or mount a writable host dir there (${flag})`,
      );
    }
  }
  return { problems, created };
}

function socketDirProblems(sockDir: string): string[] {
  const d = isDir(sockDir);
  if (d === false) return [`socket dir ${sockDir} is not a directory: fix --socket / VIRTLET_FD_SERVER_SOCKET_PATH`];
  if (d !== true) {
    return [
      `socket dir ${sockDir} does not exist (${d}): mount the host's ${sockDir} into the tapmanager container (or ` +
        `create it on this host), or fix --socket / VIRTLET_FD_SERVER_SOCKET_PATH`,
    ];
  }
  try {
    accessSync(sockDir, constants.W_OK);
  } catch (e) {
    return [
      `socket dir ${sockDir} is not writable (${why(e)}): the socket cannot be created there; run tapmanager as ` +
        `root or fix --socket`,
    ];
  }
  return [];
}
