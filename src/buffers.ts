// Buffers kept as long as a pod lives. Node 24 cuts each small buffer (under 32 KiB) out of a shared 64 KiB slab
// (Buffer.poolSize), and a slab stays allocated while any buffer cut from it does: a few bytes kept per pod kept a
// slab each, 8.8 MB at 250 pods (docs/performance.md, "Small buffers kept per pod"). A copy made here holds only
// its own bytes.

/** bufs copied into one allocation of exactly their total size, outside the pool: views of it, in the same order. */
export function unpooled(bufs: readonly Buffer[]): Buffer[] {
  const all = Buffer.allocUnsafeSlow(bufs.reduce((n, b) => n + b.length, 0));
  let at = 0;
  return bufs.map((b) => {
    b.copy(all, at);
    at += b.length;
    return all.subarray(at - b.length, at);
  });
}
