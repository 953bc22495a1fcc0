// Keeps every resource's socket made and registered with kubelet. A pass per poke (the tick, an event in the kubelet
// dir), one at a time:
// - our socket gone or replaced (kubelet removes every socket of its dir when it restarts): make it again, register;
// - kubelet.sock made again since we registered (kubelet restarted): make our socket again, register;
// - not registered: try, unless within the backoff after a failure (0.5 s doubling to 10 s); a new kubelet.sock
//   ends the wait. Each distinct failure is logged once. kubelet refusing (not "unavailable") is final: the plugin
//   should exit, as the API asks.
import type { Logger } from '../log.js';
import { errorChain } from '../errors.js';
import { fileIdentity, isRetryable, register, SocketTakenError, type ResourceServer } from './grpc.js';

export const BACKOFF_FIRST_MS = 500;
export const BACKOFF_MAX_MS = 10_000;
const REGISTER_TIMEOUT_MS = 5000;

export interface RegistrarResource {
  name: string;
  /** our socket's name in the kubelet dir */
  endpoint: string;
  server: ResourceServer;
}

interface State {
  /** the identity of kubelet.sock we registered with; undefined: not registered */
  registeredWith?: string;
  /** kubelet.sock's identity at the last attempt (null: it did not exist) */
  attemptKid?: string | null;
  nextAt: number;
  backoffMs: number;
  attempts: number;
  lastFailure?: string;
  made: boolean;
}

export class Registrar {
  #state = new Map<string, State>();
  #running: Promise<void> | undefined;
  #again = false;
  #stopped = false;
  #refused: (e: Error) => void = () => undefined;
  /** settles when kubelet refuses a registration (unsupported version, resource name taken) */
  readonly refused = new Promise<Error>((r) => (this.#refused = r));

  constructor(
    private readonly o: {
      kubeletSocket: string;
      resources: RegistrarResource[];
      log: Logger;
      onRegister?: (resource: string, result: 'ok' | 'failed') => void;
    },
  ) {
    for (const r of o.resources)
      this.#state.set(r.name, { nextAt: 0, backoffMs: BACKOFF_FIRST_MS, attempts: 0, made: false });
  }

  get allRegistered(): boolean {
    return [...this.#state.values()].every((s) => s.registeredWith !== undefined);
  }

  /** Something may have changed: run a pass now, or right after the running one. */
  poke(): void {
    if (this.#running) this.#again = true;
    else
      this.reconcile().catch((e: unknown) =>
        this.o.log.error({ err: e }, 'registration pass failed: tried again on the next tick'),
      );
  }

  /** Passes until nothing asked for another meanwhile. */
  reconcile(): Promise<void> {
    if (this.#running) {
      this.#again = true;
      return this.#running;
    }
    this.#running = (async () => {
      do {
        this.#again = false;
        for (const r of this.o.resources) if (!this.#stopped) await this.#pass(r);
      } while (this.#again && !this.#stopped);
    })().finally(() => (this.#running = undefined));
    return this.#running;
  }

  async #pass(r: RegistrarResource): Promise<void> {
    const st = this.#state.get(r.name)!;
    const kid = fileIdentity(this.o.kubeletSocket);
    const log = this.o.log;
    let remake = !r.server.intact();
    if (remake && st.made)
      log.warn(
        { resource: r.name, socket: r.server.socket },
        'our socket was removed: making it again and registering again',
      );
    if (!remake && st.registeredWith !== undefined && kid !== undefined && kid !== st.registeredWith) {
      log.warn(
        { resource: r.name, kubeletSocket: this.o.kubeletSocket },
        'kubelet.sock was created again (kubelet restarted): making our socket again and registering again',
      );
      remake = true;
    }
    if (remake) {
      r.server.stop();
      try {
        await r.server.start();
      } catch (e) {
        if (e instanceof SocketTakenError && !st.made) throw e; // at start: the plugin does not start
        return this.#failed(r, st, kid, 'listen', `cannot listen on ${r.server.socket}: ${errorChain(e)}`);
      }
      st.made = true;
      st.registeredWith = undefined;
      st.nextAt = 0;
    }
    if (st.registeredWith !== undefined || this.#stopped) return;
    if (Date.now() < st.nextAt && (kid ?? null) === st.attemptKid) return;
    st.attemptKid = kid ?? null;
    st.attempts++;
    if (kid === undefined)
      return this.#failed(r, st, kid, 'no-socket', `${this.o.kubeletSocket} does not exist (kubelet not up yet?)`);
    try {
      await register(this.o.kubeletSocket, r.endpoint, r.name, REGISTER_TIMEOUT_MS);
    } catch (e) {
      const g = e as { code?: number; details?: string; message: string };
      if (isRetryable(g))
        return this.#failed(
          r,
          st,
          kid,
          `grpc-${g.code}`,
          `kubelet at ${this.o.kubeletSocket} does not answer (${g.details ?? g.message})`,
        );
      this.o.onRegister?.(r.name, 'failed');
      log.error(
        { resource: r.name, code: g.code },
        `kubelet refused the registration of ${r.name}: ${g.details ?? g.message}`,
      );
      this.#refused(new Error(`kubelet refused the registration of ${r.name}: ${g.details ?? g.message}`));
      return;
    }
    if (this.#stopped) return;
    st.registeredWith = kid;
    st.backoffMs = BACKOFF_FIRST_MS;
    st.lastFailure = undefined;
    this.o.onRegister?.(r.name, 'ok');
    log.info({ resource: r.name, endpoint: r.endpoint, attempts: st.attempts }, 'registered with kubelet');
    st.attempts = 0;
  }

  /** `kind` says which failure it is (its text may carry details that change from one attempt to the next). */
  #failed(r: RegistrarResource, st: State, kid: string | undefined, kind: string, why: string): void {
    this.o.onRegister?.(r.name, 'failed');
    const fields = { resource: r.name, attempt: st.attempts, retryInMs: st.backoffMs };
    if (st.lastFailure !== kind)
      this.o.log.warn(
        fields,
        `registration failed: ${why}; retrying with backoff (logged once until the failure changes)`,
      );
    else this.o.log.debug(fields, 'registration failed again');
    st.lastFailure = kind;
    st.attemptKid = kid ?? null;
    st.nextAt = Date.now() + st.backoffMs;
    st.backoffMs = Math.min(st.backoffMs * 2, BACKOFF_MAX_MS);
  }

  stop(): void {
    this.#stopped = true;
  }
}
