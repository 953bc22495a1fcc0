// What each command does: validate, serialise per key, call the pod network and DHCP, encode the reply.
// Every request logs one line with key, op and durationMs.
import { native, type PeerCred } from '../native.js';
import type { Logger } from '../log.js';
import type { Handler, Reply, Request } from './server.js';
import { Command, commandName } from '../protocol/commands.js';
import { validateKey } from '../identity.js';
import { decodeGetFDPayload, decodeRecoverPayload, encodeCsn, encodeGetInfo } from '../protocol/codec.js';
import { macToBase64 } from '../protocol/mac.js';
import type { GetInfo } from '../protocol/payloads.js';
import { InterfaceType } from '../protocol/payloads.js';
import { KeyQueue } from './keyqueue.js';
import type { PodNetwork, PodNetworkState } from '../podnet/index.js';
import { DhcpServers } from './dhcp-servers.js';
import { VmpodError, ErrorCode, errorChain } from '../errors.js';

/** One entry of list's (4) reply. */
export interface PodSummary {
  key: string;
  podName: string;
  podNs: string;
  nsPath: string;
  interfaces: { name: string; type: 'tap' | 'vf'; mac: string; tap: string; bridge: string; mtu: number; pciAddress: string; ip?: string }[];
  dhcp: boolean;
}

export class TapmanagerService implements Handler {
  readonly queue = new KeyQueue();
  readonly dhcp: DhcpServers;

  constructor(
    private readonly pods: PodNetwork,
    private readonly log: Logger,
    opts: { defaultDns?: readonly string[] } = {},
  ) {
    this.dhcp = new DhcpServers(log, opts.defaultDns);
  }

  async handle(req: Request, peer: PeerCred): Promise<Reply> {
    const op = commandName(req.command);
    const log = this.log.child({ key: req.key, op, command: req.command, peerPid: peer.pid });
    const t0 = performance.now();
    try {
      const reply = await this.dispatch(req, log);
      log.info({ durationMs: Math.round((performance.now() - t0) * 10) / 10, fds: reply.fds.length }, `${op} done`);
      return reply;
    } catch (e) {
      log.error({ durationMs: Math.round((performance.now() - t0) * 10) / 10, err: e, error: errorChain(e) }, `${op} failed`);
      throw e;
    }
  }

  private async dispatch(req: Request, log: Logger): Promise<Reply> {
    switch (req.command) {
      case Command.Add: {
        const key = validateKey(req.key);
        const payload = decodeGetFDPayload(req.data);
        return this.queue.run(key, async () => {
          const existing = this.pods.state(key);
          if (existing) {
            if (existing.desc.podId !== payload.podNetworkDesc.podId) {
              throw new VmpodError(ErrorCode.Conflict, `pod network ${key} already exists for pod ${existing.desc.podId}; release it first`, { key, op: 'add' });
            }
            log.info('add repeated for an existing pod network: returning it unchanged');
            return { payload: encodeCsn(existing.csn), fds: [] };
          }
          const st = await this.pods.add(key, payload.podNetworkDesc);
          try {
            this.dhcp.start(st);
          } catch (e) {
            await this.pods.release(key).catch((re) => log.error({ err: re }, 'rollback after a DHCP failure failed'));
            throw e;
          }
          return { payload: encodeCsn(st.csn), fds: [] };
        });
      }
      case Command.Release: {
        const key = validateKey(req.key);
        return this.queue.run(key, async () => {
          this.dhcp.stop(key);
          await this.pods.release(key);
          return { payload: null, fds: [] };
        });
      }
      case Command.ReleaseForce: {
        // tapctl release --force: an operator finishing a quarantined key by hand
        const key = validateKey(req.key);
        return this.queue.run(key, async () => {
          this.dhcp.stop(key);
          const { leftovers } = await this.pods.release(key, { force: true });
          return { payload: Buffer.from(JSON.stringify({ key, leftovers })), fds: [] };
        });
      }
      case Command.Get: {
        const key = validateKey(req.key);
        return this.queue.run(key, async () => {
          const st = await this.pods.ensureFds(key);
          if (!this.dhcp.running(key)) this.dhcp.start(st);
          // the reply owns copies: a release queued right behind this get may close st.fds while the reply waits
          // for the peer to read
          return { payload: encodeGetInfo(getInfos(st)), fds: dupAll(st.fds) };
        });
      }
      case Command.Recover: {
        const key = validateKey(req.key);
        const payload = decodeRecoverPayload(req.data);
        return this.queue.run(key, async () => {
          const st = await this.pods.recover(key, payload);
          this.dhcp.start(st);
          return { payload: null, fds: [] };
        });
      }
      case Command.List: {
        const list = this.pods
          .keys()
          .map((k) => this.pods.state(k))
          .filter((s): s is PodNetworkState => s !== undefined)
          .map((s) => this.summary(s));
        return { payload: Buffer.from(JSON.stringify(list)), fds: [] };
      }
      default:
        throw new VmpodError(ErrorCode.BadRequest, `unknown command ${req.command}`);
    }
  }

  /**
   * After a daemon restart: reattach pods left ready (and start their DHCP servers), undo pods left halfway.
   * Every recorded key is queued at once, synchronously, so a request for a key still being restored waits in
   * that key's queue while other keys are served; the work itself runs at most RESTORE_PARALLEL keys at a time.
   * Call it before the server accepts; the returned promise settles when every key is done.
   */
  restore(): Promise<RestoreOutcome> {
    const out: RestoreOutcome = { restored: [], rolledBack: [], netnsMissing: [], quarantined: [], kept: [] };
    this.pods.sweepTemps();
    const slots = new Slots(RESTORE_PARALLEL);
    const one = async (key: string): Promise<void> => {
      const r = await slots.run(() => this.pods.restoreKey(key));
      if (r === 'none') return;
      out[r].push(key);
      if (r !== 'restored') return;
      const st = this.pods.state(key);
      if (!st) return;
      try {
        this.dhcp.start(st);
      } catch (e) {
        this.log.error({ key, err: e }, 'restarting DHCP for a restored pod failed');
      }
    };
    const all = this.pods.recordedKeys().map((key) =>
      this.queue.run(key, () => one(key)).catch((e: unknown) => {
        out.kept.push(key);
        this.log.error({ key, op: 'restore', err: e }, 'restore failed: the record stays');
      }),
    );
    return Promise.all(all).then(() => out);
  }

  /** SIGTERM: let running requests finish, stop DHCP, close our copies of the fds; pod networks stay. */
  async shutdown(): Promise<void> {
    await this.queue.drain();
    this.dhcp.stopAll();
    this.pods.closeAll();
  }

  private summary(s: PodNetworkState): PodSummary {
    const ips = s.csn.Result?.ips ?? [];
    return {
      key: s.key,
      podName: s.desc.podName,
      podNs: s.desc.podNs,
      nsPath: s.nsPath,
      interfaces: s.interfaces.map((i) => {
        const ip = ips.find((x) => (x.interface ?? 0) === i.index)?.address;
        return {
          name: i.cniName,
          type: i.type,
          mac: i.vmMac,
          tap: i.tapName,
          bridge: i.bridgeName,
          mtu: i.mtu,
          pciAddress: i.pciAddress ?? '',
          ...(ip ? { ip } : {}),
        };
      }),
      dhcp: this.dhcp.running(s.key),
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

/** How many recorded pods a restart restores at once (each may spawn CNI DEL for a half-made pod). */
const RESTORE_PARALLEL = 4;

/** At most n functions running at once, the rest in arrival order. */
class Slots {
  private running = 0;
  private readonly waiting: (() => void)[] = [];
  constructor(private readonly n: number) {}

  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.running >= this.n) await new Promise<void>((r) => this.waiting.push(r));
    else this.running++;
    try {
      return await fn();
    } finally {
      const next = this.waiting.shift();
      if (next) next();
      else this.running--;
    }
  }
}

/** dup's of fds (CLOEXEC), all or none. */
function dupAll(fds: number[]): number[] {
  const n = native();
  const out: number[] = [];
  try {
    for (const fd of fds) out.push(n.dupCloexec(fd, 3));
  } catch (e) {
    for (const fd of out) n.close(fd);
    throw e;
  }
  return out;
}

/** get's info array: one element per interface, fdIndex = its position in the fd list. */
export function getInfos(st: PodNetworkState): GetInfo[] {
  return st.interfaces.map((i, idx) => ({
    type: i.type === 'vf' ? InterfaceType.VF : InterfaceType.Tap,
    mac: macToBase64(i.vmMac),
    fdIndex: idx,
    pciAddress: i.pciAddress ?? '',
    ...(i.type === 'tap' ? { mtu: i.mtu } : {}),
  }));
}
