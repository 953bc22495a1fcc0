// The fd-server protocol's constants (docs/protocol.md; Virtlet pkg/tapmanager/fdserver.go).

/** Request command codes. 0..3 are Virtlet's and never change meaning; ours start at 4. */
export const Command = {
  Add: 0,
  Release: 1,
  Get: 2,
  Recover: 3,
  List: 4,
  ReleaseForce: 5,
  Status: 6,
  Gc: 7,
  Check: 8,
} as const;
export type Command = (typeof Command)[keyof typeof Command];

/** A response carries `request | RESPONSE_BIT` (Virtlet's fdResponse). */
export const RESPONSE_BIT = 0x80;
/** Error reply: command 0xFF, key of 64 zero bytes, payload = UTF-8 error text, no fds. */
export const ERROR_COMMAND = 0xff;
/** Virtlet's fdMagic: the first 4 bytes of every header, big-endian. */
export const MAGIC = 0x42424242;
/** magic u32 + command u8 + dataSize u32 + oobSize u32 + key [64]byte, packed (Go binary.Write). */
export const HEADER_SIZE = 77;
export const KEY_SIZE = 64;
/** Largest payload we accept or send (a ContainerSideNetwork is a few KiB; Virtlet had no limit). */
export const MAX_PAYLOAD = 1024 * 1024;
/**
 * Largest oobSize a client will honour: SCM_MAX_FD (253, include/net/scm.h) fds is the most one
 * SCM_RIGHTS message can carry.
 */
export const MAX_FDS = 253;

const NAMES: Record<Command, string> = {
  [Command.Add]: 'add',
  [Command.Release]: 'release',
  [Command.Get]: 'get',
  [Command.Recover]: 'recover',
  [Command.List]: 'list',
  [Command.ReleaseForce]: 'release-force',
  [Command.Status]: 'status',
  [Command.Gc]: 'gc',
  [Command.Check]: 'check',
};

/** True for the request codes we serve (0..8). */
export function isCommand(n: number): n is Command {
  return Number.isInteger(n) && n >= Command.Add && n <= Command.Check;
}

/** The response code for a request code. */
export function responseOf(command: Command): number {
  return command | RESPONSE_BIT;
}

/** "add", "get-response", "error", "unknown(0x17)": for logs and error messages. */
export function commandName(n: number): string {
  if (n === ERROR_COMMAND) return 'error';
  if (isCommand(n)) return NAMES[n];
  if (n & RESPONSE_BIT) {
    const req = n & ~RESPONSE_BIT;
    if (isCommand(req)) return `${NAMES[req]}-response`;
  }
  return `unknown(0x${n.toString(16).padStart(2, '0')})`;
}

/** Parses "add" | "release" | ... back to its code; undefined for anything else. */
export function commandFromName(name: string): Command | undefined {
  for (const [code, n] of Object.entries(NAMES)) if (n === name) return Number(code) as Command;
  return undefined;
}

/**
 * CMSG_SPACE(4 * nfds) on 64-bit Linux: a 16-byte cmsghdr (size_t len + int level + int type) plus the
 * fd array rounded up to 8 bytes (CMSG_ALIGN to sizeof(size_t)). 24 for 1..2 fds, 32 for 3..4.
 * Virtlet's client offers exactly this control buffer and checks the length it gets back, so the header's
 * oobSize must be exactly this. 0 fds: no control message at all.
 */
export function cmsgSpace(nfds: number): number {
  if (!Number.isInteger(nfds) || nfds < 0) throw new RangeError(`cmsgSpace: bad fd count ${nfds}`);
  if (nfds === 0) return 0;
  const align8 = (n: number) => (n + 7) & ~7;
  return 16 + align8(4 * nfds);
}
