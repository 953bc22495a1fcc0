// One DHCP server per tap interface of each pod, started before add replies and stopped on release.
import { DhcpServer, leaseFromCni, type DhcpServerOptions } from '../dhcp/index.js';
import { fromV031 } from '../protocol/result.js';
import type { PodNetworkState } from '../podnet/index.js';
import type { Logger } from '../log.js';
import { VmpodError, ErrorCode } from '../errors.js';

export class DhcpServers {
  private readonly byKey = new Map<string, DhcpServer[]>();

  constructor(
    private readonly log: Logger,
    /** metrics hooks, passed to every server */
    private readonly hooks: Pick<DhcpServerOptions, 'onPacket' | 'onLease'> = {},
  ) {}

  /** Starts (or restarts) the servers of a pod; on a failure stops the ones already started and throws. */
  start(st: PodNetworkState): void {
    this.stop(st.key);
    const result = st.csn.Result ? fromV031(st.csn.Result) : undefined;
    if (!result) throw new VmpodError(ErrorCode.State, `pod ${st.key} has no CNI result to serve over DHCP`, { key: st.key, op: 'dhcp' });
    const servers: DhcpServer[] = [];
    try {
      for (const iface of st.interfaces) {
        if (iface.type !== 'tap') continue;
        const lease = leaseFromCni({
          result,
          ifIndex: iface.index,
          podDns: st.desc.DNS ?? null,
          podName: st.desc.podName,
          mtu: iface.mtu,
          mac: iface.vmMac,
        });
        servers.push(
          DhcpServer.start({
            nsPath: st.nsPath,
            bridge: iface.bridgeName,
            serverIp: iface.bridgeIp,
            lease,
            log: this.log.child({ key: st.key, bridge: iface.bridgeName }),
            ...this.hooks,
          }),
        );
      }
    } catch (e) {
      for (const s of servers) s.stop();
      throw new VmpodError(ErrorCode.Internal, `start DHCP for pod ${st.key}`, { cause: e, key: st.key, op: 'dhcp' });
    }
    this.byKey.set(st.key, servers);
  }

  stop(key: string): void {
    for (const s of this.byKey.get(key) ?? []) s.stop();
    this.byKey.delete(key);
  }

  /** The latest lease granted on any interface of the pod, undefined when none since this process started. */
  lastLease(key: string): Date | undefined {
    let last: Date | undefined;
    for (const s of this.byKey.get(key) ?? []) if (s.lastLeaseAt && (!last || s.lastLeaseAt > last)) last = s.lastLeaseAt;
    return last;
  }

  running(key: string): boolean {
    return this.byKey.has(key);
  }

  stopAll(): void {
    for (const key of [...this.byKey.keys()]) this.stop(key);
  }
}
