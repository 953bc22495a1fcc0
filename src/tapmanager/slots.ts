// At most n runs at once; the others wait in start order, and a waiting run can be promoted to the front (pure).
// tapmanager's restore runs through it, so a request for a pod still waiting to be restored is restored next.
export class Slots {
  private running = 0;
  private waiting: { id: string; start: () => void }[] = [];
  constructor(private readonly n: number) {}

  async run<T>(id: string, fn: () => Promise<T>): Promise<T> {
    if (this.running >= this.n) await new Promise<void>((start) => this.waiting.push({ id, start }));
    else this.running++;
    try {
      return await fn();
    } finally {
      const next = this.waiting.shift();
      if (next) next.start();
      else this.running--;
    }
  }

  /** The waiting run of id, if there is one, takes the next free slot. */
  promote(id: string): void {
    const i = this.waiting.findIndex((w) => w.id === id);
    if (i > 0) this.waiting.unshift(...this.waiting.splice(i, 1));
  }
}
