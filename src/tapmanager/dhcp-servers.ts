// The address servers of each pod, per tap interface: DHCPv4 when the guest NIC has IPv4, RA and DHCPv6 when it has
// IPv6, all rendering one GuestNic (guestFromCni), started before add replies and stopped on release.
import { DhcpServer, guestFromCni, type DhcpServerOptions } from '../dhcp/index.js';
import type { Lease6 } from '../dhcp/lease.js';
import { Dhcp6Server } from '../dhcp6/server.js';
import { RaServer } from '../ra/server.js';
import { formatIpv6, linkLocalFromMac } from '../net/ipv6.js';
import { fromV031 } from '../protocol/result.js';
import type { PodNetworkState } from '../podnet/index.js';
import { lazyChild, type Logger } from '../log.js';
import { VmpodError, ErrorCode } from '../errors.js';

export class DhcpServers {
  private readonly byKey = new Map<string, (DhcpServer | Dhcp6Server | RaServer)[]>();

  /**
   * defaultDns: the operator's --default-dns, served only when neither the pod nor its CNI result names DNS;
   * hooks: the metrics hooks, passed to every DHCPv4 server
   */
  constructor(
    private readonly log: Logger,
    private readonly defaultDns: readonly string[] = [],
    private readonly hooks: Pick<DhcpServerOptions, 'onPacket' | 'onLease'> = {},
  ) {}

  /**
   * Starts (or restarts) the servers of a pod; on a failure stops the ones already started and throws. Returns what
   * writes their start lines, for the caller to run once the request that started them has its reply (a line's
   * write would otherwise delay it); quiet: at debug (a restart's; its summary line names the pods).
   */
  start(st: PodNetworkState): (quiet?: boolean) => void {
    // a restart of the servers: new packet sockets need not wait for the old ones' close
    void this.stop(st.key);
    const result = st.csn.Result ? fromV031(st.csn.Result) : undefined;
    if (!result)
      throw new VmpodError(ErrorCode.State, `pod ${st.key} has no CNI result to serve over DHCP`, {
        key: st.key,
        op: 'dhcp',
      });
    const servers: (DhcpServer | Dhcp6Server | RaServer)[] = [];
    // each server binds what names it (DHCPv4 its bridge, RA and DHCPv6 their tap), so the pod's logger adds the key
    // only
    const log = lazyChild(this.log, { key: st.key });
    try {
      for (const iface of st.interfaces) {
        if (iface.type !== 'tap') continue;
        const guest = guestFromCni({
          result,
          ifIndex: iface.index,
          podDns: st.desc.DNS ?? null,
          podName: st.desc.podName,
          mtu: iface.mtu,
          mac: iface.vmMac,
          defaultDns: this.defaultDns,
        });
        // tc-redirect: no bridge; the server's address is on the tap, where the VM's DHCP stays (podnet tcredirect.ts)
        const tcRedirect = iface.binding === 'tc-redirect';
        if (guest.v4)
          servers.push(
            DhcpServer.start({
              nsPath: st.nsPath,
              bridge: tcRedirect ? iface.tapName : iface.bridgeName,
              serverIp: iface.bridgeIp,
              lease: guest.v4,
              log,
              ...this.hooks,
            }),
          );
        if (guest.v6) startIpv6(st, iface, guest.v6, log, servers);
      }
    } catch (e) {
      for (const s of servers) s.stop();
      throw new VmpodError(
        e instanceof VmpodError && e.code === ErrorCode.Config ? ErrorCode.Config : ErrorCode.Internal,
        `start DHCP/RA for pod ${st.key}`,
        { cause: e, key: st.key, op: 'dhcp' },
      );
    }
    this.byKey.set(st.key, servers);
    return (quiet = false) => {
      for (const s of servers) s.announce(quiet);
    };
  }

  /**
   * Stops the servers of a pod. Their packet sockets (RA, DHCPv6) close on pool threads, each waiting for an RCU grace
   * period: the promise settles once they are closed (never rejects), so that a release can overlap that wait with its
   * CNI DEL and still reply with nothing of the pod left open.
   */
  stop(key: string): Promise<void> {
    const servers = this.byKey.get(key) ?? [];
    this.byKey.delete(key);
    for (const s of servers) s.stop();
    return settledAll(servers.map((s) => s.closed));
  }

  /** The latest DHCPv4 lease granted on any interface of the pod, undefined when none since this process started. */
  lastLease(key: string): Date | undefined {
    let last: Date | undefined;
    for (const s of this.byKey.get(key) ?? [])
      if (s instanceof DhcpServer && s.lastLeaseAt && (!last || s.lastLeaseAt > last)) last = s.lastLeaseAt;
    return last;
  }

  /** For a pod's check: undefined when every server of the pod listens, else why not. */
  problem(key: string): string | undefined {
    const servers = this.byKey.get(key);
    if (servers === undefined) return `no DHCP server runs for pod ${key}`;
    const stopped = servers.filter((s) => !s.running);
    return stopped.length === 0
      ? undefined
      : `${stopped.length} of the pod's ${servers.length} DHCP/RA servers stopped listening`;
  }

  running(key: string): boolean {
    return this.byKey.has(key);
  }

  /** Every pod's servers stopped; settles once their sockets are closed (in parallel on the pool threads). */
  stopAll(): Promise<void> {
    return settledAll([...this.byKey.keys()].map((key) => this.stop(key)));
  }
}

const settledAll = (ps: Promise<void>[]): Promise<void> => Promise.all(ps).then(() => undefined);

/**
 * The RA and DHCPv6 servers of one tap interface, pushed onto `servers` as each starts (so a failure stops those
 * already started).
 */
function startIpv6(
  st: PodNetworkState,
  iface: PodNetworkState['interfaces'][number],
  lease6: Lease6,
  log: Logger,
  servers: (DhcpServer | Dhcp6Server | RaServer)[],
): void {
  const tcRedirect = iface.binding === 'tc-redirect';
  // records written before IPv6 support carry no bridgeMac: the planner's rule (the veth's new MAC) applies
  const mac = iface.bridgeMac ?? iface.vethMacNew;
  if (!mac)
    throw new VmpodError(
      ErrorCode.State,
      `pod ${st.key} interface ${iface.cniName} has no bridge MAC to serve IPv6 from`,
      { key: st.key, op: 'dhcp6' },
    );
  const ip6 = iface.bridgeIp6 ?? formatIpv6(linkLocalFromMac(mac));
  // tc-redirect on a macvlan or ipvlan: the pod netns routes nothing for the VM, which is on the CNI network's link:
  // our RA gives the prefix, DNS and the DHCPv6 flag but no default route (that network's routers advertise theirs)
  const ra = tcRedirect && iface.routed6 !== true ? { ...lease6, defaultRoute: false } : lease6;
  // tc-redirect: no link of the pod netns holds the servers' link-local, so the RA server answers the guest's
  // neighbour solicitations for it (else no unicast to the DHCPv6 server: renewals, releases)
  servers.push(
    RaServer.start({
      nsPath: st.nsPath,
      tap: iface.tapName,
      routerMac: mac,
      routerIp: ip6,
      lease: ra,
      log,
      answerNs: tcRedirect,
    }),
  );
  servers.push(
    Dhcp6Server.start({
      nsPath: st.nsPath,
      tap: iface.tapName,
      serverMac: mac,
      serverIp: ip6,
      lease: lease6,
      log,
    }),
  );
}
