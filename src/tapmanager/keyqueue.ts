// Per-key serialisation, cross-key parallelism (DESIGN.md): two operations on one pod never interleave,
// operations on different pods run at once.
export class KeyQueue {
  private readonly tails = new Map<string, Promise<unknown>>();

  /** Runs fn after every earlier operation on key has settled. */
  run<T>(key: string, fn: () => Promise<T>): Promise<T> {
    const prev = this.tails.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => undefined);
    this.tails.set(key, tail);
    void tail.then(() => {
      if (this.tails.get(key) === tail) this.tails.delete(key);
    });
    return next;
  }

  /** Resolves when every queued operation (on every key) has settled. */
  async drain(): Promise<void> {
    while (this.tails.size > 0) await Promise.all([...this.tails.values()]);
  }

  get busyKeys(): string[] {
    return [...this.tails.keys()];
  }
}
