// Which fds vmwrapper must pass on to qemu: what libvirt gave it (the monitor socket, fdsets, the serial log...).
// Node's own fds are close-on-exec, and Node marks the low fds close-on-exec at start-up (docs/decisions.md, "Inherited
// fds in vmwrapper"), so the inherited set is: every fd >= 3 that is still inheritable, plus every fd named in
// libvirt's argv (`fd=N` in -chardev/-netdev/-add-fd values) that is open.
import { fstatSync } from 'node:fs';
import { native } from '../native.js';

/** fds >= 3 without FD_CLOEXEC: one readdir and a fcntl per fd, in the addon (which the exec loads anyway). */
export function inheritableFds(): number[] {
  return native().inheritableFds();
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

export function isOpenFd(fd: number): boolean {
  try {
    fstatSync(fd);
    return true;
  } catch {
    return false;
  }
}
