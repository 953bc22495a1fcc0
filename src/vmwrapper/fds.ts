// Which fds vmwrapper must pass on to qemu: what libvirt gave it (the monitor socket, fdsets, the serial log...).
// Node's own fds are close-on-exec, and Node marks the low fds close-on-exec at start-up (docs/decisions.md, "Inherited fds in vmwrapper"),
// so the inherited set is: every fd >= 3 that is still inheritable, plus every fd named in libvirt's argv
// (`fd=N` in -chardev/-netdev/-add-fd values) that is open.
import { readdirSync, readFileSync } from 'node:fs';

const O_CLOEXEC = 0o2000000;

/** fds >= 3 without FD_CLOEXEC, read from /proc/self/fdinfo. */
export function inheritableFds(procSelf = '/proc/self'): number[] {
  const out: number[] = [];
  for (const name of readdirSync(`${procSelf}/fd`)) {
    const fd = Number(name);
    if (!Number.isInteger(fd) || fd < 3) continue;
    let info: string;
    try {
      info = readFileSync(`${procSelf}/fdinfo/${fd}`, 'utf8');
    } catch {
      continue; // the fd readdir itself used, now closed
    }
    const m = /^flags:\s*([0-7]+)/m.exec(info);
    if (m && (parseInt(m[1]!, 8) & O_CLOEXEC) === 0) out.push(fd);
  }
  return out.sort((a, b) => a - b);
}

/** Pure: fd numbers referenced in a qemu argv as `fd=N` (key=value syntax) or `"fd":N` (JSON syntax). */
export function fdsNamedInArgv(argv: string[]): number[] {
  const out = new Set<number>();
  for (const a of argv) {
    for (const m of a.matchAll(/(?:^|,)fd=(\d+)/g)) out.add(Number(m[1]));
    for (const m of a.matchAll(/"fd"\s*:\s*"?(\d+)"?/g)) out.add(Number(m[1]));
  }
  return [...out].sort((a, b) => a - b);
}

export function isOpenFd(fd: number, procSelf = '/proc/self'): boolean {
  try {
    readFileSync(`${procSelf}/fdinfo/${fd}`);
    return true;
  } catch {
    return false;
  }
}
