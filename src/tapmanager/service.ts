// What each command does: validate, serialise per key, call the pod network and DHCP, encode the reply.
// Every request logs one line with key, op and durationMs.
import type { PeerCred } from '../native.js';
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
  ) {
    this.dhcp = new DhcpServers(log);
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
      case Command.Get: {
        const key = validateKey(req.key);
        return this.queue.run(key, async () => {
          const st = await this.pods.ensureFds(key);
          if (!this.dhcp.running(key)) this.dhcp.start(st);
          return { payload: encodeGetInfo(getInfos(st)), fds: st.fds };
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

  /** After a daemon restart: reattach pods left ready, start their DHCP servers. */
  async restore(): Promise<{ restored: string[]; rolledBack: string[] }> {
    const out = await this.pods.restore();
    for (const key of out.restored) {
      const st = this.pods.state(key);
      if (!st) continue;
      try {
        this.dhcp.start(st);
      } catch (e) {
        this.log.error({ key, err: e }, 'restarting DHCP for a restored pod failed');
      }
    }
    return out;
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
