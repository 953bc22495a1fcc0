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
//
// WHEN. At start, then MAX_INITIAL_RTR_ADVERTISEMENTS at most 16 s apart, then every MinRtrAdvInterval ..
// MaxRtrAdvInterval (200 .. 600 s, uniformly random); a Router Solicitation is answered at once, unicast to its
// source (RFC 4861 6.2.6 allows it, and it skips the 3 s multicast rate limit), within a rate limit.
// Malformed or foreign solicitations (another MAC, hop limit not 255, bad options) are dropped with a debug line
// and a counter.
import { errorChain } from '../errors.js';
import type { Lease6 } from '../dhcp/lease.js';
import type { Logger } from '../log.js';
import { native, type RecvFrameResult } from '../native.js';
import { SocketWatch } from '../net/watch.js';
import { bpfIpv6Filter, decodeFrame6, encodeIcmp6Frame, NH_ICMPV6 } from '../net/frame6.js';
import { normaliseIpv6 } from '../net/ipv6.js';
import { type PacketIo, RateLimit } from '../net/packetio.js';
import { MAX_INITIAL_RTR_ADVERT_INTERVAL, MAX_INITIAL_RTR_ADVERTISEMENTS, MAX_RTR_ADV_INTERVAL, MIN_RTR_ADV_INTERVAL, raFromLease } from './options.js';
import { ALL_NODES, ALL_ROUTERS, decodeRs, encodeRa, ICMP6_RS } from './packet.js';

export interface RaStats {
  /** unsolicited, multicast */
  periodic: number;
  /** answers to solicitations */
  solicited: number;
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
  /** its start line at debug, not info: a restart starts every restored pod's servers, and says so in one line */
  quiet?: boolean;
  io?: PacketIo;
  /** seconds; defaults RFC 4861's */
  intervals?: { min: number; max: number; initial: number };
  burst?: number;
  perSecond?: number;
}

export type RsDecision = { kind: 'answer'; dst: string; dstMac: string } | { kind: 'ignore'; why: string } | { kind: 'drop'; why: string };

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
  if (f.proto !== NH_ICMPV6 || f.payload[0] !== ICMP6_RS) return { kind: 'ignore', why: `not a router solicitation (next header ${f.proto})` };
  if (f.srcMac !== vmMac) return { kind: 'ignore', why: `RS from ${f.srcMac}, we serve ${vmMac}` };
  if (f.hopLimit !== 255) return { kind: 'drop', why: `RS with hop limit ${f.hopLimit}, not 255 (RFC 4861 6.1.1)` };
  if (f.dst !== ALL_ROUTERS && f.dst !== routerIp) return { kind: 'ignore', why: `RS to ${f.dst}` };
  try {
    decodeRs(f.payload, f.src);
  } catch (e) {
    return { kind: 'drop', why: errorChain(e) };
  }
  // from :: (before the guest has an address) the answer goes to all nodes (RFC 4861 6.2.6)
  return f.src === '::' ? { kind: 'answer', dst: ALL_NODES, dstMac: '33:33:00:00:00:01' } : { kind: 'answer', dst: f.src, dstMac: f.srcMac };
}

const RECV_MAX = 65536;

export class RaServer {
  readonly stats: RaStats = { periodic: 0, solicited: 0, dropped: 0, ignored: 0, limited: 0 };
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

  /** Encodes the advertisement (VmpodError/RangeError on a lease it cannot carry, before any socket), then listens. */
  static start(opts: RaServerOptions): RaServer {
    return new RaServer(opts);
  }

  private constructor(opts: RaServerOptions) {
    this.routerIp = normaliseIpv6(opts.routerIp) ?? opts.routerIp;
    this.routerMac = opts.routerMac.toLowerCase();
    this.vmMac = opts.lease.mac;
    this.ra = encodeRa(raFromLease(opts.lease, this.routerMac));
    this.io = opts.io ?? native();
    this.intervals = opts.intervals ?? { min: MIN_RTR_ADV_INTERVAL, max: MAX_RTR_ADV_INTERVAL, initial: MAX_INITIAL_RTR_ADVERT_INTERVAL };
    this.limit = new RateLimit(opts.burst ?? 20, opts.perSecond ?? 10);
    this.log = opts.log.child({ component: 'ra', tap: opts.tap, mac: this.vmMac });
    const fd = this.io.packetSocketInNetns(opts.nsPath, opts.tap, bpfIpv6Filter({ icmpType: ICMP6_RS }));
    this.watch = new SocketWatch(this.io, fd, (f) => this.io.recvFrame(f, RECV_MAX), (r) => this.handle(r.data, r.csumNotReady), this.log, 'ra');
    this.log[opts.quiet === true ? 'debug' : 'info']({ router: this.routerIp, prefix: `${opts.lease.prefix}/${opts.lease.prefixLength}`, defaultRouter: opts.lease.defaultRoute, mtu: opts.lease.mtu }, 'router advertisements on');
    this.advertise();
  }

  get running(): boolean {
    return this.watch.fd >= 0;
  }

  stop(): void {
    if (this.watch.fd < 0) return;
    if (this.timer) clearTimeout(this.timer);
    this.timer = undefined;
    this.watch.stop();
    this.log.info({ stats: this.stats }, 'router advertisements off');
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

  private send(dst: string, dstMac: string): boolean {
    try {
      this.io.writeAll(this.watch.fd, encodeIcmp6Frame({ srcMac: this.routerMac, dstMac, src: this.routerIp, dst, hopLimit: 255 }, this.ra));
      return true;
    } catch (e) {
      // a tap nobody holds, or a full queue: the next one goes later, the guest's RS gets its own answer
      this.log.debug({ dst, err: errorChain(e) }, 'ra: sending failed');
      return false;
    }
  }

  /** One frame (csumNotReady: its checksum is still to be filled in); never throws. */
  handle(frameBuf: Buffer, csumNotReady = false): void {
    let d: RsDecision;
    try {
      d = answerRs(frameBuf, this.vmMac, this.routerIp, csumNotReady);
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
    if (this.send(d.dst, d.dstMac)) {
      this.stats.solicited++;
      this.log.debug({ dst: d.dst }, 'ra: solicited advertisement sent');
    }
  }
}
