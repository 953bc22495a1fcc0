// The per-pod, single-client DHCPv4 server: one socket per pod bridge, one lease, one MAC.
//
// WHERE IT LISTENS. The socket is made inside the pod netns by one synchronous addon call (udpSocketInNetns:
// SO_BINDTODEVICE(bridge), SO_BROADCAST, bound to 0.0.0.0:67), so no JS ever runs in the pod netns; it is
// readable when start() returns, before tapmanager answers ADD, so the guest cannot be faster than the server
// (Virtlet slept 500 ms and hoped).
//
// RENEWALS (decided here). The server id (option 54) is the bridge's link-local address, 169.254.254.2 by
// default. The guest does not otherwise reach it: its only route off-subnet is the pod's default gateway outside
// the pod, and that gateway would never hand 169.254.254.2 back into the pod (docs/networking.md). So:
//  1. options.ts adds a host route "<server id>/32 on-link" (router 0.0.0.0) to option 121, so the unicast
//     REQUEST of a RENEWING client (RFC 2131 section 4.4.5, sent to the server id) goes out of the guest's NIC,
//     ARPs for the server id, which the bridge answers, and arrives on this socket;
//  2. every reply is sent as a broadcast to 255.255.255.255:68 on the bridge (SO_BINDTODEVICE), whatever the
//     broadcast flag says (RFC 2131 section 4.1 would unicast to ciaddr or yiaddr): after the veth was stripped
//     the pod netns has no route back to the guest's address, and every client state accepts a broadcast reply
//     (busybox's kernel-socket listener in RENEWING is bound to 0.0.0.0:68 on the interface). What the rest of the pod
//     network must provide (podnet): the bridge holds only the tap and the veth, and DHCP (udp 67/68) to and from the
//     veth port is dropped (podnet's filter table, Virtlet's rules), so these broadcasts stay in the pod and no outside
//     server answers the guest; the rule must match the veth port only, or it drops the guest's renewals as Virtlet's
//     did. And the pod netns must accept the guest's source address for (1): rp_filter 0 on the bridge and in "all"
//     (the kernel uses the maximum). A new netns copies its IPv4 settings from the host's
//     (net.core.devconf_inherit_init_net = 0); podnet sets rp_filter 0 in every pod netns (its "rp-filter" step).
//
// SIZE. A reply fits the client's option 57, else 576 bytes (RFC 2131 section 2; busybox sends 57 = 576):
// options that overflow the options field go into file and sname (option 52); no option is split (RFC 3396),
// since busybox reads only the first instance of a code. buildOptions refuses leases that cannot fit.
//
// Tested with busybox udhcpc (test/integration/dhcp-udhcpc.test.ts): SIGUSR1 makes it unicast a RENEWING
// REQUEST from its leased address to the server id, and the broadcast ACK renews the lease.
//
// WHAT IT ANSWERS (RFC 2131 section 4.3): DISCOVER -> OFFER; REQUEST -> ACK or NAK by client state:
//   SELECTING   (option 54 present): ignored unless 54 is ours; ACK when option 50 is the lease's address
//   INIT-REBOOT (no 54, option 50):  ACK when 50 is the lease's address
//   RENEWING / REBINDING (no 54, no 50, ciaddr set): ACK when ciaddr is the lease's address
//   otherwise NAK (the client restarts from INIT);
// INFORM -> ACK without yiaddr and without lease times (section 4.3.5); RELEASE is logged.
// DECLINE (section 4.3.3: the guest found the address in use on the wire): a warning with the address, the VM's
// MAC and the MAC that answers ARP for the address (conflict.ts); the single lease cannot be replaced by another
// address, so the DISCOVERs that follow are not answered for a back-off (10 s, doubling per DECLINE up to 5 min,
// reset by an ACK): no tight OFFER/DECLINE loop.
// Only the lease's MAC is served (chaddr compared case-insensitively); other clients are ignored.
// Malformed datagrams are dropped with a debug line and stats.dropped++; nothing a client sends can throw out of
// the poll callback.
import { errorChain, tryDecode } from '../errors.js';
import { lazyChild, type Logger } from '../log.js';
import { native, type Poller, type RecvFromResult } from '../native.js';
import { SocketWatch } from '../net/watch.js';
import type { DhcpLease } from './lease.js';
import { conflictingMac } from './conflict.js';
import { buildOptions, type BuiltOptions, LEASE_ONLY_OPTIONS, orderByRequest } from './options.js';
import {
  chaddrMac,
  clientMaxMessage,
  decodePacket,
  type DhcpOption,
  type DhcpPacket,
  encodePacket,
  getOption,
  HTYPE_ETHERNET,
  macToBytes,
  MessageType,
  messageType,
  messageTypeName,
  normaliseMac,
  Op,
  Opt,
  optionIp,
} from './packet.js';
import { ipToBytes } from '../net/ip.js';

export const DHCP_SERVER_PORT = 67;
export const DHCP_CLIENT_PORT = 68;
const BROADCAST = '255.255.255.255';
const RECV_MAX = 2048;
/** datagrams handled per poll wake-up; the poll is level-triggered, so the rest wait for the next turn of the loop */

/** The socket calls the server makes; native() by default, a recording fake in unit tests. */
export interface DhcpSocketIo {
  udpSocketInNetns(nsPath: string, ifname: string, port: number): number;
  pollReadable(fd: number, cb: (err: Error | null) => void): Poller;
  recvFrom(fd: number, max: number): RecvFromResult | null;
  sendTo(fd: number, data: Buffer, address: string, port: number): number;
  close(fd: number): void;
}

export interface DhcpStats {
  offers: number;
  acks: number;
  naks: number;
  /** malformed datagrams */
  dropped: number;
  /** well-formed, but not for us: another MAC, a SELECTING request for another server; DISCOVERs while backing off */
  ignored: number;
  declines: number;
}

/** The first back-off after a DECLINE (RFC 2131 asks the client itself to wait at least 10 s), and the longest. */
export const DECLINE_BACKOFF_MS = 10_000;
export const DECLINE_BACKOFF_MAX_MS = 300_000;

export type RequestState = 'selecting' | 'init-reboot' | 'renewing/rebinding';

/** What to do with one datagram (pure). */
export type Decision =
  | {
      kind: 'reply';
      type: typeof MessageType.Offer | typeof MessageType.Ack | typeof MessageType.Nak;
      data: Buffer;
      request: string;
      state?: RequestState;
      why?: string;
    }
  | { kind: 'log'; request: 'RELEASE' | 'DECLINE'; detail: Record<string, string> }
  | { kind: 'ignore'; why: string }
  | { kind: 'drop'; why: string };

export interface AnswerContext {
  lease: DhcpLease;
  /** from buildOptions(lease, serverId) */
  built: BuiltOptions;
}

function replyPacket(req: DhcpPacket, type: number, yiaddr: string, ciaddr: string, options: DhcpOption[]): Buffer {
  // RFC 6842: the client identifier (61) is echoed; 97 too, as Virtlet did (PXE clients look for it).
  const echo = [Opt.ClientId, Opt.ClientMachineId].flatMap((code) => {
    const data = getOption(req, code);
    return data && data.length > 0 ? [{ code, data }] : [];
  });
  return encodePacket(
    {
      op: Op.Reply,
      htype: req.htype,
      hlen: req.hlen,
      hops: 0,
      xid: req.xid,
      secs: 0,
      flags: req.flags,
      ciaddr,
      yiaddr,
      siaddr: '0.0.0.0',
      giaddr: req.giaddr,
      chaddr: req.chaddr,
      options: [{ code: Opt.MessageType, data: Buffer.from([type]) }, ...options, ...echo],
    },
    clientMaxMessage(getOption(req, Opt.MaxMessageSize)),
  );
}

/**
 * A REQUEST (RFC 2131 4.3.2): its state told by option 54, option 50 and ciaddr; the lease's address ACKed, any other
 * NAKed.
 */
function answerRequest(
  req: DhcpPacket,
  ctx: AnswerContext,
  full: DhcpOption[],
  nak: (request: string, state: RequestState | undefined, why: string) => Decision,
  mac: string,
): Decision {
  const { lease, built } = ctx;
  const sid = optionIp(req, Opt.ServerId);
  const requested = optionIp(req, Opt.RequestedIp);
  let state: RequestState;
  let asked: string | undefined;
  if (getOption(req, Opt.ServerId) !== undefined) {
    if (sid !== built.serverId)
      return {
        kind: 'ignore',
        why: `REQUEST selects server ${sid ?? '(bad option 54)'}, we are ${built.serverId}`,
      };
    state = 'selecting';
    asked = requested;
  } else if (requested !== undefined) {
    state = 'init-reboot';
    asked = requested;
  } else if (req.ciaddr !== '0.0.0.0') {
    state = 'renewing/rebinding';
    asked = req.ciaddr;
  } else {
    return nak('REQUEST', undefined, 'REQUEST names no address (no option 50, no ciaddr)');
  }
  if (asked !== lease.ip) return nak('REQUEST', state, `address ${asked ?? '(none)'} is not leased to ${mac}`);
  return {
    kind: 'reply',
    type: MessageType.Ack,
    request: 'REQUEST',
    state,
    data: replyPacket(req, MessageType.Ack, lease.ip, req.ciaddr, full),
  };
}

/** Decide the answer to one datagram. Pure; never throws on client input. */
export function answer(buf: Buffer, ctx: AnswerContext): Decision {
  const decoded = tryDecode(decodePacket, buf);
  if (!decoded.ok) return { kind: 'drop', why: decoded.why };
  const req = decoded.value;
  if (req.op !== Op.Request) return { kind: 'drop', why: `op ${req.op} is not BOOTREQUEST` };
  if (req.htype !== HTYPE_ETHERNET || req.hlen !== 6)
    return { kind: 'drop', why: `htype ${req.htype} hlen ${req.hlen} is not Ethernet` };
  const type = messageType(req);
  if (type === undefined) return { kind: 'drop', why: 'no DHCP message type (option 53): BOOTP is not served' };
  const mac = chaddrMac(req);
  const { lease, built } = ctx;
  if (mac !== normaliseMac(lease.mac))
    return { kind: 'ignore', why: `${messageTypeName(type)} from ${mac}, we serve ${lease.mac}` };

  const prl = getOption(req, Opt.ParameterList);
  const full = orderByRequest(built.options, prl);
  const nak = (request: string, state: RequestState | undefined, why: string): Decision => ({
    kind: 'reply',
    type: MessageType.Nak,
    request,
    ...(state ? { state } : {}),
    why,
    data: replyPacket(req, MessageType.Nak, '0.0.0.0', '0.0.0.0', [
      { code: Opt.ServerId, data: ipToBytes(built.serverId) },
      { code: Opt.Message, data: Buffer.from(why, 'ascii') },
    ]),
  });

  // encoding a reply can fail only when the echoed client ids do not fit the client's maximum message size
  try {
    switch (type) {
      case MessageType.Discover:
        return {
          kind: 'reply',
          type: MessageType.Offer,
          request: 'DISCOVER',
          data: replyPacket(req, MessageType.Offer, lease.ip, '0.0.0.0', full),
        };
      case MessageType.Request:
        return answerRequest(req, ctx, full, nak, mac);
      case MessageType.Inform:
        return {
          kind: 'reply',
          type: MessageType.Ack,
          request: 'INFORM',
          data: replyPacket(
            req,
            MessageType.Ack,
            '0.0.0.0',
            req.ciaddr,
            full.filter((o) => !LEASE_ONLY_OPTIONS.has(o.code)),
          ),
        };
      case MessageType.Release:
        return { kind: 'log', request: 'RELEASE', detail: { ciaddr: req.ciaddr } };
      case MessageType.Decline:
        return { kind: 'log', request: 'DECLINE', detail: { requested: optionIp(req, Opt.RequestedIp) ?? '(none)' } };
      default:
        return { kind: 'drop', why: `message type ${messageTypeName(type)} is not a client message` };
    }
  } catch (e) {
    return { kind: 'drop', why: `cannot encode a reply to ${messageTypeName(type)}: ${errorChain(e)}` };
  }
}

export interface DhcpServerOptions {
  nsPath: string;
  bridge: string;
  serverIp: string;
  lease: DhcpLease;
  log: Logger;
  /** default 67; tests may use others */
  port?: number;
  /** default 68 */
  clientPort?: number;
  /** default: the native addon */
  io?: DhcpSocketIo;
  /** the first back-off after a DECLINE, default DECLINE_BACKOFF_MS */
  declineBackoffMs?: number;
  /** who answers ARP for the declined address (a MAC); default conflictingMac in the pod netns */
  findConflict?: (ip: string) => Promise<string | undefined>;
  /** told of each datagram: received (its message type, or "malformed"/"ignored") and sent (offer, ack, nak) */
  onPacket?: (direction: 'received' | 'sent', type: string) => void;
  /** told when an ACK grants the lease (an answered REQUEST) */
  onLease?: () => void;
}

export class DhcpServer {
  readonly stats: DhcpStats = { offers: 0, acks: 0, naks: 0, dropped: 0, ignored: 0, declines: 0 };
  readonly lease: DhcpLease;
  /** when an ACK last granted the lease (a REQUEST answered), undefined until then */
  lastLeaseAt: Date | undefined;
  private readonly watch: SocketWatch<RecvFromResult>;
  private readonly onPacket: (direction: 'received' | 'sent', type: string) => void;
  private readonly onLease: () => void;
  private readonly io: DhcpSocketIo;
  private readonly log: Logger;
  private readonly ctx: AnswerContext;
  private readonly where: { nsPath: string; port: number };
  private readonly clientPort: number;
  private readonly declineBaseMs: number;
  private readonly findConflict: (ip: string) => Promise<string | undefined>;
  /** current back-off after DECLINEs (0: none), and until when DISCOVERs go unanswered */
  private backoffMs = 0;
  private backoffUntil = 0;

  /**
   * Validates the lease (buildOptions throws VmpodError(Config) before any socket exists), opens the socket in the
   * pod netns and watches it. Listening when it returns. A failure after the socket was opened closes it.
   */
  static start(opts: DhcpServerOptions): DhcpServer {
    const built = buildOptions(opts.lease, opts.serverIp);
    warmUp({ lease: opts.lease, built });
    return new DhcpServer(opts, built);
  }

  private constructor(opts: DhcpServerOptions, built: BuiltOptions) {
    this.io = opts.io ?? native();
    this.lease = opts.lease;
    this.ctx = { lease: opts.lease, built };
    this.clientPort = opts.clientPort ?? DHCP_CLIENT_PORT;
    this.declineBaseMs = opts.declineBackoffMs ?? DECLINE_BACKOFF_MS;
    this.findConflict = opts.findConflict ?? ((ip) => conflictingMac(opts.nsPath, opts.bridge, ip));
    this.onPacket = opts.onPacket ?? (() => {});
    this.onLease = opts.onLease ?? (() => {});
    this.log = lazyChild(opts.log, { component: 'dhcp', bridge: opts.bridge, mac: opts.lease.mac });
    const port = opts.port ?? DHCP_SERVER_PORT;
    this.where = { nsPath: opts.nsPath, port };
    const fd = this.io.udpSocketInNetns(opts.nsPath, opts.bridge, port);
    this.watch = new SocketWatch(
      this.io,
      fd,
      (f) => this.io.recvFrom(f, RECV_MAX),
      (d) => this.handle(d),
      this.log,
      'dhcp server',
    );
  }

  /** Its start line (the caller writes it once the request that started it has its reply); quiet: at debug. */
  announce(quiet = false): void {
    const { lease, built } = this.ctx;
    this.log[quiet ? 'debug' : 'info'](
      {
        ...this.where,
        serverId: built.serverId,
        ip: `${lease.ip}/${lease.prefixLength}`,
        routes: built.routes.map((r) => `${r.dst}/${r.prefix} via ${r.gw}`),
      },
      'dhcp server listening',
    );
  }

  /** the socket fd, -1 once stopped */
  get socketFd(): number {
    return this.watch.fd;
  }

  get running(): boolean {
    return this.watch.fd >= 0;
  }

  /**
   * Idempotent: stops watching and closes the socket. Its stop line, with the counts as they are now, is written on
   * the loop's next turn, off the path of the request that stopped it (the RA and DHCPv6 servers' likewise).
   */
  stop(): void {
    if (!this.watch.stop()) return;
    const stats = { ...this.stats };
    setImmediate(() => this.log.info({ stats }, 'dhcp server stopped'));
  }

  /** settled: its UDP socket closes at once on stop */
  get closed(): Promise<void> {
    return this.watch.closed;
  }

  /** A DECLINE: back off (doubling), and warn with the address and who else answers for it (looked up async). */
  private onDecline(from: string, address: string): void {
    this.stats.declines++;
    this.backoffMs = this.backoffMs === 0 ? this.declineBaseMs : Math.min(this.backoffMs * 2, DECLINE_BACKOFF_MAX_MS);
    this.backoffUntil = Date.now() + this.backoffMs;
    const backoffMs = this.backoffMs;
    const warn = (conflictingMac: string | undefined): void =>
      this.log.warn(
        {
          from,
          address,
          vmMac: normaliseMac(this.lease.mac),
          conflictingMac: conflictingMac ?? '(no answer to ARP)',
          backoffMs,
        },
        'dhcp: DECLINE: the guest found its address in use on the wire; its DISCOVERs are not answered during the ' +
          'back-off',
      );
    this.findConflict(address).then(warn, () => warn(undefined));
  }

  /** One datagram; never throws. */
  private handle(d: RecvFromResult): void {
    let decision: Decision;
    try {
      decision = answer(d.data, this.ctx);
    } catch (e) {
      // answer() is written not to throw on input; anything here is our bug, still not worth the daemon
      decision = { kind: 'drop', why: `internal: ${errorChain(e)}` };
    }
    const from = `${d.address}:${d.port}`;
    this.onPacket(
      'received',
      decision.kind === 'drop' ? 'malformed' : decision.kind === 'ignore' ? 'ignored' : decision.request.toLowerCase(),
    );
    switch (decision.kind) {
      case 'drop':
        this.stats.dropped++;
        this.log.debug({ from, bytes: d.data.length, why: decision.why }, 'dhcp: dropped malformed datagram');
        return;
      case 'ignore':
        this.stats.ignored++;
        this.log.debug({ from, why: decision.why }, 'dhcp: ignored datagram');
        return;
      case 'log':
        if (decision.request === 'DECLINE') this.onDecline(from, decision.detail.requested ?? '(none)');
        else this.log.info({ from, ...decision.detail }, 'dhcp: RELEASE');
        return;
      case 'reply': {
        if (decision.type === MessageType.Offer && Date.now() < this.backoffUntil) {
          this.stats.ignored++;
          this.log.debug(
            { from, backoffMs: this.backoffMs },
            'dhcp: DISCOVER not answered: backing off after a DECLINE',
          );
          return;
        }
        if (decision.type === MessageType.Ack && decision.request === 'REQUEST') this.backoffMs = 0;
        try {
          this.io.sendTo(this.watch.fd, decision.data, BROADCAST, this.clientPort);
        } catch (e) {
          this.log.warn({ from, err: errorChain(e) }, `dhcp: sending ${messageTypeName(decision.type)} failed`);
          return;
        }
        if (decision.type === MessageType.Offer) this.stats.offers++;
        else if (decision.type === MessageType.Ack) this.stats.acks++;
        else this.stats.naks++;
        this.onPacket('sent', messageTypeName(decision.type).toLowerCase());
        if (decision.type === MessageType.Ack && decision.request === 'REQUEST') {
          this.lastLeaseAt = new Date();
          this.onLease();
        }
        const line = { from, request: decision.request, state: decision.state, ip: this.lease.ip, why: decision.why };
        if (decision.type === MessageType.Nak) this.log.warn(line, 'dhcp: NAK');
        else this.log.info(line, `dhcp: ${messageTypeName(decision.type)}`);
        return;
      }
      default: {
        const never: never = decision;
        throw new Error(`unhandled decision ${JSON.stringify(never)}`);
      }
    }
  }
}

let warmed = false;

/**
 * Once per process, at the first server's start (so before tapmanager answers that pod's add): answer() on a
 * DISCOVER and a REQUEST made for the lease, results thrown away. V8 compiles a function on its first call; without
 * this the first guest's first DISCOVER would wait for the decoder, the option builder and the encoder to compile
 * (docs/performance.md, first DHCP answer). Every later pod shares the compiled code.
 */
export function warmUp(ctx: AnswerContext): void {
  if (warmed) return;
  warmed = true;
  try {
    const hw = macToBytes(ctx.lease.mac);
    const chaddr = Buffer.alloc(16);
    hw.copy(chaddr);
    const asked = Buffer.from(Array.from({ length: 254 }, (_, i) => i + 1));
    const base = {
      op: Op.Request,
      htype: HTYPE_ETHERNET,
      hlen: 6,
      hops: 0,
      xid: 0x5741524d,
      secs: 0,
      flags: 0,
      ciaddr: '0.0.0.0',
      yiaddr: '0.0.0.0',
      siaddr: '0.0.0.0',
      giaddr: '0.0.0.0',
      chaddr,
    };
    const client = [
      { code: Opt.ClientId, data: Buffer.concat([Buffer.from([HTYPE_ETHERNET]), hw]) },
      { code: Opt.ParameterList, data: asked },
    ];
    answer(
      encodePacket({
        ...base,
        options: [{ code: Opt.MessageType, data: Buffer.from([MessageType.Discover]) }, ...client],
      }),
      ctx,
    );
    answer(
      encodePacket({
        ...base,
        options: [
          { code: Opt.MessageType, data: Buffer.from([MessageType.Request]) },
          { code: Opt.RequestedIp, data: ipToBytes(ctx.lease.ip) },
          { code: Opt.ServerId, data: ipToBytes(ctx.built.serverId) },
          ...client,
        ],
      }),
      ctx,
    );
  } catch {
    // a warm-up only: the real first packet will compile what this did not
  }
}
