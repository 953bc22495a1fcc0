// Pod netns made ahead of time, while tapmanager is idle: the netns with its sysctls, `lo` up, interface 0's tap, and
// for the bridge binding its bridge and DHCP filter (what an add makes before and while its CNI plugins run:
// podNetnsSteps, and preparedSteps for the binding expected then). Each is held by an fd and mounted nowhere (`ip
// netns list` does not show it, and it goes with the fd, also when the daemon dies). An add that finds one binds it
// under its key instead of making its netns, and runs no prepared steps while its plugins run (docs/decisions.md, "A
// pod netns made while idle").
import { native } from '../native.js';
import type { Logger } from '../log.js';
import type { Binding } from './binding.js';

/** A spare pod netns: the fd that holds it, and the binding its links were prepared for. */
export interface Spare {
  fd: number;
  preparedFor: Binding;
}

/**
 * How long no add or release must have been in flight before a spare is made: the next pod start comes seconds
 * later, and the work never lands in a run of back-to-back requests.
 */
export const SPARE_IDLE_MS = 100;

export class SpareNetns {
  readonly #spares: Spare[] = [];
  #busy = 0;
  #timer: NodeJS.Timeout | undefined;
  #filling = false;
  /** the spare being made: settles (never rejects) once it is on hand, or failed */
  #making: Promise<void> | undefined;
  #closed = false;
  #warned = false;

  /**
   * target: how many to keep on hand (0: none, the class does nothing); make: one spare, resolving with the fd that
   * holds it and what it was prepared for (it closes what it made when it fails)
   */
  constructor(
    private readonly target: number,
    private readonly make: () => Promise<Spare>,
    private readonly log: Logger,
    private readonly idleMs = SPARE_IDLE_MS,
  ) {}

  /**
   * A spare, its fd now the caller's (to bind, then close), or undefined when none is on hand. One being made when none
   * is ready is waited for: it is a few milliseconds from ready, less than the caller would take to make its own.
   */
  async take(): Promise<Spare | undefined> {
    if (this.#spares.length === 0 && this.#making) await this.#making;
    return this.#spares.pop();
  }

  /** An add or a release starts: nothing is made until none is in flight for idleMs. */
  begin(): void {
    this.#busy++;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = undefined;
  }

  end(): void {
    if (--this.#busy === 0) this.#schedule();
  }

  /** Daemon exit: the spares go (their netns with them). */
  close(): void {
    this.#closed = true;
    if (this.#timer) clearTimeout(this.#timer);
    for (const spare of this.#spares.splice(0)) native().close(spare.fd);
  }

  get count(): number {
    return this.#spares.length;
  }

  /** How many adds and releases are in flight (between begin and end). */
  get inFlight(): number {
    return this.#busy;
  }

  #schedule(): void {
    if (this.#closed || this.#busy > 0 || this.#timer || this.#spares.length >= this.target) return;
    this.#timer = setTimeout(() => {
      this.#timer = undefined;
      void this.#fill();
    }, this.idleMs);
    this.#timer.unref();
  }

  async #fill(): Promise<void> {
    if (this.#filling) return;
    this.#filling = true;
    try {
      while (this.#spares.length < this.target && this.#busy === 0 && !this.#closed) {
        const one = this.#makeOne();
        this.#making = one.catch(() => {});
        await one;
      }
    } catch (e) {
      // adds make their own netns meanwhile; said once at warn, then at debug (it is retried at every idle spell)
      this.log[this.#warned ? 'debug' : 'warn']({ err: e }, 'making a spare pod netns failed: adds make their own');
      this.#warned = true;
    } finally {
      this.#filling = false;
      this.#making = undefined;
    }
  }

  async #makeOne(): Promise<void> {
    const spare = await this.make();
    if (this.#closed) native().close(spare.fd);
    else this.#spares.push(spare);
  }
}
