// Router Advertisements to one VM on its tap (RFC 4861 6.2; RFC 8106).
//
// WHERE. Like the DHCPv6 server: an AF_PACKET socket on the tap inside the pod netns, BPF-filtered to ICMPv6
// Router Solicitations; advertisements are written into the tap, so they reach the VM and nothing else.
//
// WHO THE ROUTER IS. Advertisements come from the pod bridge's link-local address and MAC. The pod netns has IPv6
// forwarding on (podnet's ipv6 step), so the kernel answers the guest's neighbour solicitations for that address
// with the Router flag set (RFC 4861 7.2.5: else guests drop the default route at the first NUD probe), and routes
// what the guest sends to it on to the CNI result's gateway (`::/0 via <gateway> dev br<i>`): the gateway's own
// link-local address is never needed, whether or not it derives from its MAC.
// Where no link of the pod netns holds that address (the tc-redirect binding: no bridge, and the tap makes no
// link-local), nothing would answer the guest's neighbour solicitations for it, so a guest could never send it a
// unicast (udhcpc6's renewals and releases go to the DHCPv6 server, the same address): with answerNs the server
// answers them itself, from the same socket, as a router (R, S and O set, the router MAC as target link-layer address).
//
// WHEN. At start, then MAX_INITIAL_RTR_ADVERTISEMENTS at most 16 s apart, then every MinRtrAdvInterval ..
// MaxRtrAdvInterval (200 .. 600 s, uniformly random); a Router Solicitation is answered at once, unicast to its
// source (RFC 4861 6.2.6 allows it, and it skips the 3 s multicast rate limit), within a rate limit.
// Malformed or foreign solicitations (another MAC, hop limit not 255, bad options) are dropped with a debug line
// and a counter.
import { errorChain } from '../errors.js';
import { unpooled } from '../buffers.js';
import type { Lease6 } from '../dhcp/lease.js';
import { lazyChild, type Logger } from '../log.js';
import type { RecvFrameResult } from '../native.js';
import type { SocketWatch } from '../net/watch.js';
import { bpfIpv6Filter, decodeFrame6, encodeIcmp6Frame, ETH_HLEN, IP6_HLEN, NH_ICMPV6 } from '../net/frame6.js';
import { normaliseIpv6 } from '../net/ipv6.js';
import { nativePacketIo, type PacketIo, RateLimit, watchTapFrames } from '../net/packetio.js';
import {
  MAX_INITIAL_RTR_ADVERT_INTERVAL,
  MAX_INITIAL_RTR_ADVERTISEMENTS,
  MAX_RTR_ADV_INTERVAL,
  MIN_RTR_ADV_INTERVAL,
  raFromLease,
} from './options.js';
import { ALL_NODES, ALL_ROUTERS, decodeNs, decodeRs, encodeNa, encodeRa, ICMP6_NS, ICMP6_RS } from './packet.js';

export interface RaStats {
  /** unsolicited, multicast */
  periodic: number;
  /** answers to solicitations */
  solicited: number;
  /** neighbour advertisements for the router's address (answerNs) */
  neighbour: number;
  dropped: number;
  ignored: number;
  limited: number;
}

export interface RaServerOptions {
  nsPath: string;
  tap: string;
  /** the pod bridge's MAC and link-local address: the router the guest sees */
  routerMac: string;
  routerIp: string;
  lease: Lease6;
  log: Logger;
  io?: PacketIo;
  /** seconds; defaults RFC 4861's */
  intervals?: { min: number; max: number; initial: number };
  burst?: number;
  perSecond?: number;
  /** answer neighbour solicitations for routerIp (no link of the pod netns holds it) */
  answerNs?: boolean;
}

export type RsDecision =
  | { kind: 'answer'; dst: string; dstMac: string }
  | { kind: 'ignore'; why: string }
  | { kind: 'drop'; why: string };

/**
 * What to do with one frame (pure): RFC 4861 6.1.1's validity checks, then whether it is ours to answer.
 * csumNotReady: the socket's word that the ICMPv6 checksum is still to be filled in (decodeFrame6).
 */
export function answerRs(frameBuf: Buffer, vmMac: string, routerIp: string, csumNotReady = false): RsDecision {
  let f;
  try {
    f = decodeFrame6(frameBuf, csumNotReady);
  } catch (e) {
    return { kind: 'drop', why: errorChain(e) };
  }
  if (f.proto !== NH_ICMPV6 || f.payload[0] !== ICMP6_RS)
    return { kind: 'ignore', why: `not a router solicitation (next header ${f.proto})` };
  if (f.srcMac !== vmMac) return { kind: 'ignore', why: `RS from ${f.srcMac}, we serve ${vmMac}` };
  if (f.hopLimit !== 255) return { kind: 'drop', why: `RS with hop limit ${f.hopLimit}, not 255 (RFC 4861 6.1.1)` };
  if (f.dst !== ALL_ROUTERS && f.dst !== routerIp) return { kind: 'ignore', why: `RS to ${f.dst}` };
  try {
    decodeRs(f.payload, f.src);
  } catch (e) {
    return { kind: 'drop', why: errorChain(e) };
  }
  // from :: (before the guest has an address) the answer goes to all nodes (RFC 4861 6.2.6)
  return f.src === '::'
    ? { kind: 'answer', dst: ALL_NODES, dstMac: '33:33:00:00:00:01' }
    : { kind: 'answer', dst: f.src, dstMac: f.srcMac };
}

/**
 * What to do with one frame that may be a neighbour solicitation for the router's address (pure): RFC 4861 7.1.1's
 * checks, then an answer to the solicitation's source (from :: it is a duplicate address check by someone else: none).
 */
export function answerNs(frameBuf: Buffer, vmMac: string, routerIp: string, csumNotReady = false): RsDecision {
  let f;
  try {
    f = decodeFrame6(frameBuf, csumNotReady);
  } catch (e) {
    return { kind: 'drop', why: errorChain(e) };
  }
  if (f.proto !== NH_ICMPV6 || f.payload[0] !== ICMP6_NS)
    return { kind: 'ignore', why: `not a neighbour solicitation (next header ${f.proto})` };
  if (f.srcMac !== vmMac) return { kind: 'ignore', why: `NS from ${f.srcMac}, we serve ${vmMac}` };
  if (f.hopLimit !== 255) return { kind: 'drop', why: `NS with hop limit ${f.hopLimit}, not 255 (RFC 4861 7.1.1)` };
  let target: string;
  try {
    target = decodeNs(f.payload, f.src).target;
  } catch (e) {
    return { kind: 'drop', why: errorChain(e) };
  }
  if (target !== routerIp) return { kind: 'ignore', why: `NS for ${target}` };
  if (f.src === '::') return { kind: 'ignore', why: `duplicate address detection of ${target} from ${f.srcMac}` };
  return { kind: 'answer', dst: f.src, dstMac: f.srcMac };
}

export class RaServer {
  readonly stats: RaStats = { periodic: 0, solicited: 0, neighbour: 0, dropped: 0, ignored: 0, limited: 0 };
  private readonly watch: SocketWatch<RecvFrameResult>;
  private timer: NodeJS.Timeout | undefined;
  private sentInitial = 0;
  private readonly io: PacketIo;
  private readonly log: Logger;
  private readonly ra: Buffer;
  private readonly routerIp: string;
  private readonly routerMac: string;
  private readonly vmMac: string;
  private readonly intervals: { min: number; max: number; initial: number };
  private readonly limit: RateLimit;
  private readonly na: Buffer | undefined;
  private readonly lease: Lease6;

  /** Encodes the advertisement (VmpodError/RangeError on a lease it cannot carry, before any socket), then listens. */
  static start(opts: RaServerOptions): RaServer {
    return new RaServer(opts);
  }

  private constructor(opts: RaServerOptions) {
    this.routerIp = normaliseIpv6(opts.routerIp) ?? opts.routerIp;
    this.routerMac = opts.routerMac.toLowerCase();
    this.vmMac = opts.lease.mac;
    // kept for the pod's life: out of the shared pool (buffers.ts)
    const [ra, na] = unpooled([
      encodeRa(raFromLease(opts.lease, this.routerMac)),
      ...(opts.answerNs === true ? [encodeNa(this.routerIp, this.routerMac)] : []),
    ]);
    this.ra = ra!;
    this.na = na;
    this.io = opts.io ?? nativePacketIo();
    this.intervals = opts.intervals ?? {
      min: MIN_RTR_ADV_INTERVAL,
      max: MAX_RTR_ADV_INTERVAL,
      initial: MAX_INITIAL_RTR_ADVERT_INTERVAL,
    };
    this.limit = new RateLimit(opts.burst ?? 20, opts.perSecond ?? 10);
    this.log = lazyChild(opts.log, { component: 'ra', tap: opts.tap, mac: this.vmMac });
    this.watch = watchTapFrames(
      this.io,
      opts.nsPath,
      opts.tap,
      bpfIpv6Filter({ icmpTypes: this.na ? [ICMP6_RS, ICMP6_NS] : [ICMP6_RS] }),
      (data, csumNotReady) => this.handle(data, csumNotReady),
      this.log,
      'ra',
    );
    this.lease = opts.lease;
    this.advertise();
  }

  /** Its start line (the caller writes it once the request that started it has its reply); quiet: at debug. */
  announce(quiet = false): void {
    this.log[quiet ? 'debug' : 'info'](
      {
        router: this.routerIp,
        prefix: `${this.lease.prefix}/${this.lease.prefixLength}`,
        defaultRouter: this.lease.defaultRoute,
        mtu: this.lease.mtu,
      },
      'router advertisements on',
    );
  }

  get running(): boolean {
    return this.watch.fd >= 0;
  }

  /** settles once its socket is closed after stop (off the event loop) */
  get closed(): Promise<void> {
    return this.watch.closed;
  }

  /** Its stop line on the loop's next turn, as the DHCPv4 server's (DhcpServer.stop). */
  stop(): void {
    if (this.watch.fd < 0) return;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.watch.stop();
    const stats = { ...this.stats };
    setImmediate(() => this.log.info({ stats }, 'router advertisements off'));
  }

  /** One unsolicited multicast RA, and the next one scheduled. */
  private advertise(): void {
    if (this.watch.fd < 0) return;
    if (this.send(ALL_NODES, '33:33:00:00:00:01')) this.stats.periodic++;
    this.sentInitial++;
    const { min, max, initial } = this.intervals;
    let next = min + Math.random() * (max - min);
    if (this.sentInitial < MAX_INITIAL_RTR_ADVERTISEMENTS) next = Math.min(next, initial);
    this.timer = setTimeout(() => this.advertise(), next * 1000);
    this.timer.unref();
  }

  private send(dst: string, dstMac: string, msg = this.ra): boolean {
    try {
      this.io.writeAll(
        this.watch.fd,
        encodeIcmp6Frame({ srcMac: this.routerMac, dstMac, src: this.routerIp, dst, hopLimit: 255 }, msg),
      );
      return true;
    } catch (e) {
      // a tap nobody holds, or a full queue: the next one goes later, the guest's RS gets its own answer
      this.log.debug({ dst, err: errorChain(e) }, 'ra: sending failed');
      return false;
    }
  }

  /** One frame (csumNotReady: its checksum is still to be filled in); never throws. */
  handle(frameBuf: Buffer, csumNotReady = false): void {
    // the socket's filter passes ICMPv6 right after the IPv6 header only: its type is the byte after both headers
    const ns = this.na !== undefined && frameBuf[ETH_HLEN + IP6_HLEN] === ICMP6_NS;
    let d: RsDecision;
    try {
      d = ns
        ? answerNs(frameBuf, this.vmMac, this.routerIp, csumNotReady)
        : answerRs(frameBuf, this.vmMac, this.routerIp, csumNotReady);
    } catch (e) {
      d = { kind: 'drop', why: `internal: ${errorChain(e)}` };
    }
    if (d.kind === 'drop') {
      this.stats.dropped++;
      this.log.debug({ bytes: frameBuf.length, why: d.why }, 'ra: dropped');
      return;
    }
    if (d.kind === 'ignore') {
      this.stats.ignored++;
      this.log.debug({ why: d.why }, 'ra: ignored');
      return;
    }
    if (!this.limit.take()) {
      this.stats.limited++;
      this.log.debug({ dst: d.dst }, 'ra: solicitation over the rate limit, not answered');
      return;
    }
    if (ns) {
      if (this.send(d.dst, d.dstMac, this.na)) this.stats.neighbour++;
      return;
    }
    if (this.send(d.dst, d.dstMac)) {
      this.stats.solicited++;
      this.log.debug({ dst: d.dst }, 'ra: solicited advertisement sent');
    }
  }
}
