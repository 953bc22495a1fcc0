// Who may use the fd socket (docs/protocol.md, "Transport"): uid 0, or a member of an allowed group, by its primary
// gid (SO_PEERCRED) or a supplementary one. Pure: the server reads the credentials and /proc.

export interface Peer {
  uid: number;
  gid: number;
}

/**
 * The part of the rule the credentials alone decide: uid 0 or an allowed primary gid. The addon's fast get server
 * (native/fastget.c) applies exactly this and hands every other peer to JS.
 */
export function allowedByCred(peer: Peer, allowedGids: readonly number[]): boolean {
  return peer.uid === 0 || allowedGids.includes(peer.gid);
}

/** The whole rule; groups() (the peer's supplementary groups) is asked only when the credentials do not decide. */
export function peerAllowed(peer: Peer, allowedGids: readonly number[], groups: () => number[]): boolean {
  if (allowedByCred(peer, allowedGids)) return true;
  return allowedGids.length > 0 && groups().some((g) => allowedGids.includes(g));
}

/** Supplementary groups of a process, from the "Groups:" line of /proc/<pid>/status. */
export function groupsFromStatus(status: string): number[] {
  const m = /^Groups:[ \t]*(.*)$/m.exec(status);
  return m ? m[1]!.trim().split(/\s+/).filter(Boolean).map(Number) : [];
}
