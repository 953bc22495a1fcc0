// The one exclusion across pods: adds and releases (of any pods, at once) share it; a CNI GC holds it alone. The CNI
// spec forbids a GC while an ADD or DEL runs (its valid-attachments list would be stale, and a plugin would drop what
// an add is making). Gets, recovers, lists and checks do not take it. An exclusive waiter goes before shared
// requests that come after it, so a steady stream of adds cannot keep GC out.
export class OpLock {
  private shared = 0;
  private exclusive = false;
  /** waiters in arrival order; an exclusive one stops the shared ones behind it */
  private readonly waiting: { exclusive: boolean; go: () => void }[] = [];

  /** Runs fn beside other shared holders, never beside an exclusive one. */
  runShared<T>(fn: () => Promise<T>): Promise<T> {
    return this.hold(false, fn);
  }

  /** Runs fn alone: after every shared holder has finished, before the shared requests that come meanwhile. */
  runExclusive<T>(fn: () => Promise<T>): Promise<T> {
    return this.hold(true, fn);
  }

  /** adds and releases running now (for logs and tests) */
  get sharedHolders(): number {
    return this.shared;
  }

  private async hold<T>(exclusive: boolean, fn: () => Promise<T>): Promise<T> {
    if (!this.canGo(exclusive)) await new Promise<void>((go) => this.waiting.push({ exclusive, go }));
    else this.take(exclusive);
    try {
      return await fn();
    } finally {
      if (exclusive) this.exclusive = false;
      else this.shared--;
      this.wake();
    }
  }

  private canGo(exclusive: boolean): boolean {
    if (this.exclusive || this.waiting.length > 0) return false;
    return !exclusive || this.shared === 0;
  }

  private take(exclusive: boolean): void {
    if (exclusive) this.exclusive = true;
    else this.shared++;
  }

  /** Lets in the waiters at the head that can go now: shared ones up to the first exclusive one, or that one alone. */
  private wake(): void {
    while (this.waiting.length > 0 && !this.exclusive) {
      const next = this.waiting[0]!;
      if (next.exclusive && this.shared > 0) return;
      this.waiting.shift();
      this.take(next.exclusive);
      next.go();
      if (next.exclusive) return;
    }
  }
}
