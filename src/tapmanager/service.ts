// What each command does: validate, serialise per key, call the pod network and DHCP, encode the reply. Every add,
// release and recover logs one line with key, op and durationMs (get, list and status at debug; failures always).
import type { PeerCred } from '../native.js';
import { lazyChild, type Logger } from '../log.js';
import { Slots } from './slots.js';
import { setImmediate as nextTurn, setTimeout as delay } from 'node:timers/promises';
import type { Handler, Reply, Request } from './server.js';
import { Command, commandName } from '../protocol/commands.js';
import { validateKey } from '../identity.js';
import {
  decodeGetFDPayload,
  decodeGetRequest,
  decodeRecoverPayload,
  encodeCsn,
  encodeGetInfo,
} from '../protocol/codec.js';
import { macToBase64 } from '../protocol/mac.js';
import type { GetInfo } from '../protocol/payloads.js';
import { InterfaceType } from '../protocol/payloads.js';
import { KeyQueue } from './keyqueue.js';
import { OpLock } from './oplock.js';
import { PodChecker } from './checks.js';
import { bindingOf, describeInterfaces, queueFds, type PodNetwork, type PodNetworkState } from '../podnet/index.js';
import type { PodSummary, StatusReport } from '../protocol/status.js';
import type { NetworkConfigList } from '../cni/index.js';
import { DhcpServers } from './dhcp-servers.js';
import { reserveFdTable } from './fdtable.js';
import { VmpodError, ErrorCode, errorChain } from '../errors.js';
import { unpooled } from '../buffers.js';

export type { PodSummary, StatusReport };

/**
 * What the daemon wires in from outside (metrics, readiness): plain callbacks, so this module never loads
 * prom-client. All optional; set before the first request.
 */
export interface ServiceHooks {
  /** each request: command name, "ok" or the error code (lower case), duration in seconds */
  onRequest?: (command: string, result: string, seconds: number) => void;
  /** DHCP datagrams of every pod's servers */
  onDhcpPacket?: (direction: 'received' | 'sent', type: string) => void;
  /** a DHCP ACK granted a pod its lease */
  onDhcpLease?: () => void;
  /** restore finished after this many seconds */
  onRestored?: (seconds: number) => void;
  /** status (6): the readiness the daemon computes (socket, CNI config); without it, restored alone decides */
  readiness?: () => Promise<{ ready: boolean; reasons: string[] }>;
  /** before an add runs anything: throws when the network cannot take adds (CNI STATUS, cni-status.ts) */
  admitAdd?: () => Promise<NetworkConfigList | undefined>;
  /** gc (7): one CNI GC (gc.ts), holding `ops` alone */
  gc?: () => Promise<unknown>;
  /** a pod check failed, once per reason */
  onCheckFailure?: (reason: string) => void;
}

/** Where a ready pod's answer to get is kept for the socket server to send by itself (FdServer with fastGets). */
export interface GetReplies {
  setGetReply(key: string, payload: Buffer, fds: number[]): void;
  forgetGetReply(key: string): void;
  /** gets answered without the handler so far */
  readonly fastGetsAnswered?: number;
}

export class TapmanagerService implements Handler {
  readonly queue = new KeyQueue();
  /** adds and releases share it, a CNI GC holds it alone (oplock.ts) */
  readonly ops = new OpLock();
  /** the pods' checks, and which pods are degraded (checks.ts) */
  readonly checks: PodChecker;
  readonly dhcp: DhcpServers;
  readonly hooks: ServiceHooks;
  private restoreState: 'pending' | 'running' | 'done' = 'pending';
  /** while restoring: the slots the keys' restores wait in (a request promotes its key's) */
  private restoreSlots: Slots | undefined;
  /**
   * Restored pods whose DHCP servers the restore starts once every pod is back. A get meanwhile does not start them
   * first: it hands out the taps at once (a VM it starts asks for its lease seconds later; the restore's DHCP phase
   * comes after the last restore, within the restart's first second for hundreds of pods).
   */
  private readonly dhcpPending = new Set<string>();
  /** requests the handler has taken (with the server's own gets: how busy the socket is) */
  private requestsTaken = 0;
  /** get's payload per pod network, encoded at its first get: a pod's interfaces never change while it lives */
  private readonly getPayloads = new WeakMap<PodNetworkState, Buffer>();
  private readonly started = Date.now();
  /** the server's store of get answers; set once, before the server accepts */
  replies: GetReplies | undefined;

  /** defaultDns: --default-dns for DHCP; hooks: metrics and readiness (ServiceHooks) */
  constructor(
    private readonly pods: PodNetwork,
    private readonly log: Logger,
    opts: { defaultDns?: readonly string[]; hooks?: ServiceHooks } = {},
  ) {
    this.hooks = opts.hooks ?? {};
    this.checks = new PodChecker({
      check: (key) =>
        this.queue.run(key, () =>
          this.pods.check(key, () => (this.dhcpPending.has(key) ? undefined : this.dhcp.problem(key))),
        ),
      readyKeys: () =>
        this.pods
          .records()
          .filter((r) => r.phase === 'ready')
          .map((r) => r.key),
      log,
      onFailure: (reason) => this.hooks.onCheckFailure?.(reason),
    });
    this.dhcp = new DhcpServers(log, opts.defaultDns, {
      onPacket: (dir, type) => this.hooks.onDhcpPacket?.(dir, type),
      onLease: () => this.hooks.onDhcpLease?.(),
    });
  }

  /** True once restore() has run to its end: every key recorded before a restart is restored, rolled back or kept. */
  isRestored(): boolean {
    return this.restoreState === 'done';
  }

  async handle(req: Request, peer: PeerCred): Promise<Reply> {
    const op = commandName(req.command);
    this.requestsTaken++;
    // a request for a pod whose restore still waits for a slot: that restore goes next (the rest wait on)
    this.restoreSlots?.promote(req.key);
    // the request's logger is made when a line is written: a get at the default level writes none and makes none
    const log = lazyChild(this.log, { key: req.key, op, command: req.command, peerPid: peer.pid });
    const t0 = performance.now();
    try {
      // what the request's line says besides its duration (add: the pod's interfaces)
      const said: Record<string, unknown> = {};
      const reply = await this.dispatch(req, log, said);
      const ms = performance.now() - t0;
      const fds = reply.fds.length;
      // counted and logged once the reply is out (the server sends it in this turn's microtasks; an immediate runs
      // after them): neither the metrics nor the line's write delay the answer
      setImmediate(() => {
        this.hooks.onRequest?.(op, 'ok', ms / 1000);
        // get comes on every VM start and list and status are polled: a line each at debug only, the metrics count
        // them (add, release and recover keep their line)
        const quiet = req.command === Command.Get || req.command === Command.List || req.command === Command.Status;
        if (!quiet || this.log.isLevelEnabled('debug'))
          log[quiet ? 'debug' : 'info']({ durationMs: Math.round(ms * 10) / 10, fds, ...said }, `${op} done`);
      });
      return reply;
    } catch (e) {
      const ms = performance.now() - t0;
      this.hooks.onRequest?.(op, e instanceof VmpodError ? e.code.toLowerCase() : 'internal', ms / 1000);
      log.error({ durationMs: Math.round(ms * 10) / 10, err: e, error: errorChain(e) }, `${op} failed`);
      throw e;
    }
  }

  private async dispatch(req: Request, log: Logger, said: Record<string, unknown>): Promise<Reply> {
    switch (req.command) {
      case Command.Add:
        return this.add(validateKey(req.key), req.data, log, said);
      case Command.Release:
        return this.release(validateKey(req.key), false);
      case Command.ReleaseForce:
        // tapctl release --force: an operator finishing a quarantined key by hand
        return this.release(validateKey(req.key), true);
      case Command.Get:
        return this.get(validateKey(req.key), req.data);
      case Command.Recover:
        return this.recover(validateKey(req.key), req.data);
      case Command.List:
        return { payload: Buffer.from(JSON.stringify(this.list())), fds: [] };
      case Command.Status:
        return { payload: Buffer.from(JSON.stringify(await this.status())), fds: [] };
      case Command.Gc:
        if (!this.hooks.gc) throw new VmpodError(ErrorCode.BadRequest, 'gc: this daemon runs no CNI GC');
        return { payload: Buffer.from(JSON.stringify(await this.hooks.gc())), fds: [] };
      case Command.Check:
        return { payload: Buffer.from(JSON.stringify(await this.checks.checkOne(validateKey(req.key)))), fds: [] };
      default:
        throw new VmpodError(ErrorCode.BadRequest, `unknown command ${req.command}`);
    }
  }

  /**
   * add: the pod network, and its DHCP servers started before the reply, so that no guest is ever faster than its
   * server: while the container side is applied when the plan allows it (add's whileApplying), else after add.
   */
  private add(key: string, data: Request['data'], log: Logger, said: Record<string, unknown>): Promise<Reply> {
    const payload = decodeGetFDPayload(data);
    return this.queue.run(key, () =>
      this.ops.runShared(async () => {
        const existing = this.pods.state(key);
        if (existing) {
          if (existing.desc.podId !== payload.podNetworkDesc.podId) {
            throw new VmpodError(
              ErrorCode.Conflict,
              `pod network ${key} already exists for pod ${existing.desc.podId}; release it first`,
              { key, op: 'add' },
            );
          }
          log.info('add repeated for an existing pod network: returning it unchanged');
          return { payload: encodeCsn(existing.csn), fds: [] };
        }
        // a network whose plugin answers STATUS with an error: refused before anything is made or run
        const list = await this.hooks.admitAdd?.();
        let announce: (() => void) | undefined;
        let st: PodNetworkState;
        try {
          st = await this.pods.add(key, payload.podNetworkDesc, undefined, {
            ...(list ? { list } : {}),
            whileApplying: (pre) => {
              announce = this.dhcp.start(pre);
            },
          });
        } catch (e) {
          if (announce) await this.dhcp.stop(key);
          throw e;
        }
        if (!announce) {
          try {
            announce = this.dhcp.start(st);
          } catch (e) {
            await this.pods.release(key).catch((re) => log.error({ err: re }, 'rollback after a DHCP failure failed'));
            throw e;
          }
        }
        // after the reply is out: no get comes before the VM starts. A release or recover that got in first has
        // taken the pod (its state is another one, or gone) and is not undone by a late offer
        const announced = announce;
        setImmediate(() => {
          announced();
          if (this.pods.state(key) === st) this.offerGet(st);
        });
        said.interfaces = describeInterfaces(st);
        return { payload: encodeCsn(st.csn), fds: [] };
      }),
    );
  }

  /** release (force: tapctl release --force, the record goes even when undo steps fail: what is left is replied). */
  private release(key: string, force: boolean): Promise<Reply> {
    return this.queue.run(key, () =>
      this.ops.runShared(async () => {
        this.replies?.forgetGetReply(key);
        this.dhcpPending.delete(key);
        // the servers' packet sockets close on the pool while the release runs (each waits for an RCU grace period)
        const closed = this.dhcp.stop(key);
        this.checks.forget(key);
        const { leftovers } = await this.pods.release(key, { force }).finally(() => closed);
        return { payload: force ? Buffer.from(JSON.stringify({ key, leftovers })) : null, fds: [] };
      }),
    );
  }

  private get(key: string, data: Request['data']): Promise<Reply> {
    // {"queues": N} (ours): N queues on each multi-queue tap; Virtlet's client sends nothing and gets one
    const { queues } = decodeGetRequest(data);
    return this.queue.run(key, async () => {
      const st = await this.pods.ensureFds(key);
      const announce = !this.dhcp.running(key) && !this.dhcpPending.has(key) ? this.dhcp.start(st) : undefined;
      this.offerGet(st);
      // the reply owns its fds (dup's of ours, new queues): a release queued right behind this get may close st.fds
      // while the reply waits for the peer to read, and the VM alone holds the extra queues it is given
      const got = await queueFds(st, queues, this.log);
      if (announce) setImmediate(announce);
      return {
        payload: queues === 1 ? this.getPayload(st) : encodeGetInfo(getInfos(st, got.queueFdIndices)),
        fds: got.fds,
      };
    });
  }

  private recover(key: string, data: Request['data']): Promise<Reply> {
    const payload = decodeRecoverPayload(data);
    return this.queue.run(key, async () => {
      this.replies?.forgetGetReply(key);
      const st = await this.pods.recover(key, payload);
      setImmediate(this.dhcp.start(st));
      this.offerGet(st);
      return { payload: null, fds: [] };
    });
  }

  /**
   * After a daemon restart: reattach pods left ready, undo pods left halfway; then start the DHCP servers of the
   * pods restored (a get for one of them starts its server at once).
   * Every recorded key is queued at once, synchronously, so a request for a key still being restored waits in
   * that key's queue while other keys are served; the work itself runs at most RESTORE_PARALLEL keys at a time, in
   * the order of the records, except that a request for a key whose restore has not started moves it to the front.
   * Call it before the server accepts; the returned promise settles when every key is done, and from then on
   * isRestored() is true (readiness: status, /readyz, READY=1).
   */
  restore(): Promise<RestoreOutcome> {
    const out: RestoreOutcome = { restored: [], rolledBack: [], netnsMissing: [], quarantined: [], kept: [] };
    this.restoreState = 'running';
    const t0 = performance.now();
    this.pods.sweepTemps();
    const keys = this.pods.recordedKeys();
    // before the restore takes several fds per pod: one growth of the fd table, on a pool thread
    reserveFdTable(keys.length, this.log);
    const slots = (this.restoreSlots = new Slots(RESTORE_PARALLEL));
    const one = async (key: string): Promise<void> => {
      // a restore is synchronous work: each one waits for a turn of the event loop first, so the socket is served
      // between them (without it the whole restore runs as one chain of microtasks before the first accept)
      const r = await slots.run(key, async () => {
        await nextTurn();
        return this.pods.restoreKey(key);
      });
      if (r !== 'none') out[r].push(key);
      if (r === 'restored') {
        this.dhcpPending.add(key);
        // its gets are answered by the server from now on: its DHCP servers start in the restore's last phase
        const st = this.pods.state(key);
        if (st) this.offerGet(st);
      }
    };
    // the restored pods' DHCP servers, once every pod is back (a running VM renews its lease minutes from now; gets
    // meanwhile are answered without them), each in its key's queue (a release may have come first)
    const startDhcp = (key: string, until: number): Promise<void> =>
      this.queue.run(key, async () => {
        await this.quietTurn(until);
        this.dhcpPending.delete(key);
        const st = this.pods.state(key);
        if (!st || this.dhcp.running(key)) return;
        try {
          // its start lines at debug: the restart's summary line names the pods
          this.dhcp.start(st)(true);
        } catch (e) {
          // its gets go through the handler again, which tries once more and says why it fails
          this.replies?.forgetGetReply(key);
          this.log.error({ key, err: e }, 'restarting DHCP for a restored pod failed');
        }
        // its get answer went to the server when it was restored
      });
    const all = keys.map((key) =>
      this.queue
        .run(key, () => one(key))
        .catch((e: unknown) => {
          out.kept.push(key);
          this.log.error({ key, op: 'restore', err: e }, 'restore failed: the record stays');
        }),
    );
    return Promise.all(all).then(async () => {
      this.restoreSlots = undefined;
      const until = performance.now() + DHCP_YIELD_MS;
      for (const key of out.restored) await startDhcp(key, until);
      this.restoreState = 'done';
      this.hooks.onRestored?.((performance.now() - t0) / 1000);
      return out;
    });
  }

  /**
   * A turn of the event loop, and then more while requests keep coming (until `until`): the restore's DHCP phase
   * yields to gets, which VM starts wait on, while a running VM's renewal has minutes to spare.
   */
  private async quietTurn(until: number): Promise<void> {
    const taken = (): number => this.requestsTaken + (this.replies?.fastGetsAnswered ?? 0);
    for (;;) {
      const before = taken();
      await nextTurn();
      if (taken() === before || performance.now() >= until) return;
      await delay(QUIET_MS);
    }
  }

  /** get's payload of a pod network, encoded at its first get: a pod's interfaces never change while it lives */
  private getPayload(st: PodNetworkState): Buffer {
    let payload = this.getPayloads.get(st);
    // kept for the pod's life: out of the shared pool (buffers.ts)
    if (payload === undefined) this.getPayloads.set(st, (payload = unpooled([encodeGetInfo(getInfos(st))])[0]!));
    return payload;
  }

  /**
   * A pod that is ready to be got (every tap open, its DHCP servers running or about to start in a restore) gets its
   * answer kept by the server, which then answers its gets without this handler; release and recover take it back
   * first (in the key's queue).
   */
  private offerGet(st: PodNetworkState): void {
    if (
      !this.replies ||
      !(this.dhcp.running(st.key) || this.dhcpPending.has(st.key)) ||
      st.fds.length !== st.interfaces.length
    )
      return;
    try {
      this.replies.setGetReply(st.key, this.getPayload(st), st.fds);
    } catch (e) {
      this.log.warn(
        { key: st.key, err: e },
        'keeping the answer to get failed: gets of this pod go through the daemon',
      );
    }
  }

  /** SIGTERM: let running requests finish, stop DHCP, close our copies of the fds; pod networks stay. */
  async shutdown(): Promise<void> {
    await this.queue.drain();
    // a CNI GC running (it is in no key's queue) ends its DELs first
    await this.ops.runExclusive(async () => {});
    await this.dhcp.stopAll();
    this.pods.closeAll();
  }

  /** Every pod network: the ready ones from memory, the ones mid-operation (or unreadable) from their records. */
  list(): PodSummary[] {
    return this.pods.records().map(({ key, phase, rec }) => {
      const st = this.pods.state(key);
      const lastLease = this.dhcp.lastLease(key);
      const ips = (st?.csn ?? rec?.csn)?.Result?.ips ?? [];
      const desc = st?.desc ?? rec?.desc;
      const degraded = phase === 'ready' ? this.checks.degraded(key) : undefined;
      return {
        key,
        podName: desc?.podName ?? '',
        podNs: desc?.podNs ?? '',
        nsPath: st?.nsPath ?? rec?.nsPath ?? '',
        state: degraded ? 'degraded' : phase,
        ...(degraded ? { degraded: { at: degraded.at, failures: degraded.failures } } : {}),
        createdAt: rec?.createdAt ?? '',
        interfaces: (st?.interfaces ?? rec?.interfaces ?? []).map((i) => {
          const ip = ips.find((x) => (x.interface ?? 0) === i.index)?.address;
          return {
            name: i.cniName,
            type: i.type,
            mac: i.vmMac,
            tap: i.tapName,
            binding: bindingOf(i),
            bridge: i.bridgeName,
            mtu: i.mtu,
            pciAddress: i.pciAddress ?? '',
            ...(ip ? { ip } : {}),
          };
        }),
        dhcp: this.dhcp.running(key),
        lastLease: lastLease ? lastLease.toISOString() : null,
      };
    });
  }

  /** Pods by record state (adding, ready, releasing, quarantined, corrupt), for the metrics. */
  podsByState(): Record<string, number> {
    const out: Record<string, number> = {};
    for (const r of this.pods.records()) out[r.phase] = (out[r.phase] ?? 0) + 1;
    return out;
  }

  /** status (6): ready when restored and the daemon's own checks pass. */
  async status(): Promise<StatusReport> {
    const reasons: string[] = [];
    if (!this.isRestored())
      reasons.push(
        this.restoreState === 'running' ? 'restoring the pods recorded in the state dir' : 'pods not restored yet',
      );
    const r = await this.hooks.readiness?.();
    if (r) reasons.push(...r.reasons);
    return {
      ready: reasons.length === 0,
      reasons,
      restored: this.isRestored(),
      pods: this.pods.keys().length,
      pid: process.pid,
      uptimeSeconds: Math.round((Date.now() - this.started) / 1000),
    };
  }
}

/** What a restart did with each recorded key (netnsMissing and quarantined keys stay for release). */
export interface RestoreOutcome {
  restored: string[];
  rolledBack: string[];
  netnsMissing: string[];
  quarantined: string[];
  kept: string[];
}

/** How long, at most, a restart's DHCP phase yields to requests; and how long it waits each time it sees one. */
const DHCP_YIELD_MS = 2000;
const QUIET_MS = 2;

/** How many recorded pods a restart restores at once (each may spawn CNI DEL for a half-made pod). */
const RESTORE_PARALLEL = 4;

/**
 * get's info array: one element per interface; fdIndex is the place of its first fd in the fd list, and a tap's
 * queueFdIndices the places of all its queues (by default one fd per interface, in order).
 */
export function getInfos(
  st: PodNetworkState,
  queueFdIndices: number[][] = st.interfaces.map((_, idx) => [idx]),
): GetInfo[] {
  return st.interfaces.map((i, idx) => ({
    type: i.type === 'vf' ? InterfaceType.VF : InterfaceType.Tap,
    mac: macToBase64(i.vmMac),
    fdIndex: queueFdIndices[idx]![0]!,
    pciAddress: i.pciAddress ?? '',
    ...(i.type === 'tap' ? { mtu: i.mtu, queueFdIndices: queueFdIndices[idx]! } : {}),
  }));
}
