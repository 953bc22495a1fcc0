// The per-pod, single-client stateful DHCPv6 server (RFC 8415): one lease (the CNI result's IPv6 address), one MAC.
//
// WHERE IT LISTENS. On the pod's tap, through an AF_PACKET socket made inside the pod netns (packetSocketInNetns)
// with a BPF filter passing only UDP to port 547: it sees exactly the frames the VM sends, and writes its replies
// back into the tap, so a reply reaches the VM and nothing else on the link (never another MAC), and needs no
// route or neighbour entry in the pod netns. The kernel's own copy of a unicast request (udhcpc6 renews by unicast
// to the server address) is dropped by podnet's filter before the pod netns could answer "port unreachable" (podnet's
// dhcp-filter step). Listening when start() returns, before add replies.
//
// WHO IT IS. Its address is the pod bridge's link-local (every reply comes from it; a unicast request to it gets
// its reply from it, as busybox udhcpc6 requires), its DUID is DUID-LL of the bridge's MAC: both stay the same
// across tapmanager restarts, so a client's RENEW after a restart still names this server.
//
// WHAT IT ANSWERS (RFC 8415 section 18.3), only frames from the lease's MAC:
//   SOLICIT            -> ADVERTISE with the IA_NA (the lease), or REPLY at once when the client sent Rapid Commit
//   REQUEST            -> REPLY with the IA_NA (only when it names our DUID); an IA_NA naming an address outside
//                         the pod prefix gets NotOnLink in that IA (RFC 8415 18.3.2), and the client solicits again
//   RENEW              -> REPLY: the IA_NA renewed when it holds our address, NoBinding in the IA when not
//   REBIND             -> REPLY: renewed; foreign addresses come back with lifetimes 0, and ours beside them
//   CONFIRM            -> REPLY Success when every address is in the pod prefix, NotOnLink when one is not;
//                         nothing when it names no address (RFC 8415 18.3.3)
//   RELEASE, DECLINE   -> REPLY Success (the address stays the pod's; DECLINE is logged as a warning)
//   INFORMATION-REQUEST-> REPLY with DNS servers (23) and the domain list (24), no IA
// Several IA_NAs: the first gets the address, the others NoAddrsAvail; IA_TA and IA_PD get NoAddrsAvail /
// NoPrefixAvail. A unicast request is answered as a multicast one (no UseMulticast: udhcpc6 starts over on any
// top-level status other than Success).
// Malformed frames and messages, messages breaking RFC 8415 section 16's rules, and anything beyond the rate limit
// are dropped with a debug line and a counter; nothing a client sends can throw out of the poll callback.
import { errorChain, tryDecode } from '../errors.js';
import type { Lease6 } from '../dhcp/lease.js';
import { lazyChild, type Logger } from '../log.js';
import type { RecvFrameResult } from '../native.js';
import type { SocketWatch } from '../net/watch.js';
import { nativePacketIo, type PacketIo, RateLimit, watchTapFrames } from '../net/packetio.js';
import { bpfIpv6Filter, decodeFrame6, decodeUdp6, encodeUdp6Frame, NH_UDP } from '../net/frame6.js';
import { formatIpv6, inSubnet6, linkLocalFromMac, normaliseIpv6 } from '../net/ipv6.js';
import { buildOptions6, type Built6, leasedIaNa, statusIaNa } from './options.js';
import {
  ALL_DHCP_SERVERS,
  decodeIaNa,
  decodeMessage6,
  DHCP6_SERVER_PORT,
  duidLl,
  encodeIaAddr,
  encodeIaNa,
  encodeMessage6,
  encodeOptions6,
  getOption6,
  type IaNa,
  type Message6,
  Msg,
  msgName,
  type Option6,
  Opt6,
  optionCount,
  Status,
  statusOption,
} from './packet.js';

export interface Answer6Context {
  lease: Lease6;
  built: Built6;
}

export type Decision6 =
  | { kind: 'reply'; type: typeof Msg.Advertise | typeof Msg.Reply; request: string; data: Buffer; note?: string }
  | { kind: 'ignore'; why: string }
  | { kind: 'drop'; why: string };

type Rule = 'must' | 'mustNot' | 'may';
/** RFC 8415 section 16: which messages carry a Client / Server Identifier (ours, when present). */
const RULES: Record<number, { client: Rule; server: Rule; ia: boolean }> = {
  [Msg.Solicit]: { client: 'must', server: 'mustNot', ia: true },
  [Msg.Request]: { client: 'must', server: 'must', ia: true },
  [Msg.Confirm]: { client: 'must', server: 'mustNot', ia: true },
  [Msg.Renew]: { client: 'must', server: 'must', ia: true },
  [Msg.Rebind]: { client: 'must', server: 'mustNot', ia: true },
  [Msg.Release]: { client: 'must', server: 'must', ia: true },
  [Msg.Decline]: { client: 'must', server: 'must', ia: true },
  [Msg.InformationRequest]: { client: 'may', server: 'may', ia: false },
};

function reply(
  req: Message6,
  type: typeof Msg.Advertise | typeof Msg.Reply,
  ctx: Answer6Context,
  body: Option6[],
  withInfo: boolean,
): Buffer {
  const client = getOption6(req.options, Opt6.ClientId);
  return encodeMessage6({
    type,
    xid: req.xid,
    options: [
      { code: Opt6.ServerId, data: ctx.built.serverDuid },
      ...(client ? [{ code: Opt6.ClientId, data: client }] : []),
      ...body,
      ...(withInfo ? ctx.built.info : []),
    ],
  });
}

/** The addresses an IA_NA names outside the pod prefix. */
function offLink(ia: IaNa, lease: Lease6): string[] {
  return ia.addrs.map((a) => a.address).filter((a) => !inSubnet6(a, lease.prefix, lease.prefixLength));
}

/**
 * IA_NA/IA_TA/IA_PD answers for SOLICIT and REQUEST: the first IA_NA gets the address. In a REQUEST (`request`), an
 * IA_NA naming an address outside the pod prefix gets NotOnLink instead (RFC 8415 18.3.2); a SOLICIT's addresses are
 * only hints, and the lease's address is offered whatever they are.
 */
function assign(req: Message6, ctx: Answer6Context, request: boolean): Option6[] {
  const out: Option6[] = [];
  let given = false;
  for (const o of req.options) {
    if (o.code === Opt6.IaNa) {
      const ia = decodeIaNa(o.data);
      const off = request ? offLink(ia, ctx.lease) : [];
      if (off.length > 0) {
        out.push(
          statusIaNa(
            ia.iaid,
            Status.NotOnLink,
            `not on link ${ctx.lease.prefix}/${ctx.lease.prefixLength}: ${off.join(', ')}`,
          ),
        );
      } else if (!given) {
        out.push(leasedIaNa(ia.iaid, ctx.lease, ctx.built));
        given = true;
      } else {
        out.push(statusIaNa(ia.iaid, Status.NoAddrsAvail, 'one address per client: it went to the first IA_NA'));
      }
    } else if (o.code === Opt6.IaTa) {
      if (o.data.length < 4) throw new RangeError(`IA_TA of ${o.data.length} bytes is shorter than 4`);
      const st = statusOption(Status.NoAddrsAvail, 'no temporary addresses');
      out.push({ code: Opt6.IaTa, data: Buffer.concat([o.data.subarray(0, 4), encodeOptions6([st])]) });
    } else if (o.code === Opt6.IaPd) {
      if (o.data.length < 12) throw new RangeError(`IA_PD of ${o.data.length} bytes is shorter than 12`);
      const st = statusOption(Status.NoPrefixAvail, 'no prefix delegation');
      out.push({
        code: Opt6.IaPd,
        data: Buffer.concat([o.data.subarray(0, 4), Buffer.alloc(8), encodeOptions6([st])]),
      });
    }
  }
  if (out.length === 0) out.push(statusOption(Status.NoAddrsAvail, 'no IA_NA asked for'));
  return out;
}

type Request6 = ReturnType<typeof decodeMessage6>;

/** RFC 8415 16: the identifiers and IA options each message must or must not carry; another server's message. */
function refuse6(
  req: Request6,
  ctx: Answer6Context,
  name: string,
  rule: NonNullable<(typeof RULES)[number]>,
): Decision6 | undefined {
  const clients = optionCount(req.options, Opt6.ClientId);
  const servers = optionCount(req.options, Opt6.ServerId);
  if (clients > 1 || servers > 1)
    return { kind: 'drop', why: `${name} with ${clients} Client and ${servers} Server Identifiers` };
  if (rule.client === 'must' && clients === 0) return { kind: 'drop', why: `${name} without a Client Identifier` };
  if (rule.server === 'mustNot' && servers > 0) return { kind: 'drop', why: `${name} with a Server Identifier` };
  if (rule.server === 'must' && servers === 0) return { kind: 'drop', why: `${name} without a Server Identifier` };
  const sid = getOption6(req.options, Opt6.ServerId);
  if (sid && !sid.equals(ctx.built.serverDuid))
    return {
      kind: 'ignore',
      why: `${name} for server ${sid.toString('hex')}, we are ${ctx.built.serverDuid.toString('hex')}`,
    };
  if (!rule.ia && req.options.some((o) => o.code === Opt6.IaNa || o.code === Opt6.IaTa || o.code === Opt6.IaPd)) {
    return { kind: 'drop', why: `${name} with an IA option` };
  }
  return undefined;
}

/** RENEW and REBIND (RFC 8415 18.3.4, 18.3.5): the lease renewed; foreign addresses NoBinding (RENEW) or zeroed. */
function answerRenewRebind(req: Request6, ctx: Answer6Context, iaNas: IaNa[], name: string): Decision6 {
  const { lease, built } = ctx;
  const body: Option6[] = [];
  const notes: string[] = [];
  for (const ia of iaNas) {
    const addrs = ia.addrs.map((a) => a.address);
    const foreign = addrs.filter((a) => a !== lease.ip);
    if (addrs.length === 0 || addrs.includes(lease.ip)) {
      body.push(foreign.length === 0 ? leasedIaNa(ia.iaid, lease, built) : withZeroed(ia.iaid, lease, built, foreign));
    } else if (req.type === Msg.Renew) {
      body.push(
        statusIaNa(
          ia.iaid,
          Status.NoBinding,
          `no binding for ${foreign.join(', ')}; the address of this client is ${lease.ip}`,
        ),
      );
      notes.push(`NoBinding for ${foreign.join(', ')}`);
    } else {
      body.push(withZeroed(ia.iaid, lease, built, foreign));
      notes.push(`${foreign.join(', ')} returned with lifetime 0`);
    }
  }
  if (body.length === 0) body.push(statusOption(Status.NoBinding, 'no IA_NA in the message'));
  return {
    kind: 'reply',
    type: Msg.Reply,
    request: name,
    data: reply(req, Msg.Reply, ctx, body, true),
    ...(notes.length ? { note: notes.join('; ') } : {}),
  };
}

/** CONFIRM (RFC 8415 18.3.3): Success when every address is on the pod's link, NotOnLink otherwise. */
function answerConfirm(req: Request6, ctx: Answer6Context, iaNas: IaNa[], name: string): Decision6 {
  const { lease } = ctx;
  const addrs = iaNas.flatMap((ia) => ia.addrs.map((a) => a.address));
  if (addrs.length === 0) return { kind: 'ignore', why: 'CONFIRM names no address (RFC 8415 18.3.3: no reply)' };
  const off = addrs.filter((a) => !inSubnet6(a, lease.prefix, lease.prefixLength));
  const st =
    off.length === 0
      ? statusOption(Status.Success, 'all addresses still on link')
      : statusOption(Status.NotOnLink, `not on link ${lease.prefix}/${lease.prefixLength}: ${off.join(', ')}`);
  return {
    kind: 'reply',
    type: Msg.Reply,
    request: name,
    data: reply(req, Msg.Reply, ctx, [st], false),
    ...(off.length ? { note: `NotOnLink ${off.join(', ')}` } : {}),
  };
}

/** Decide the answer to one DHCPv6 message from the lease's MAC. Pure; never throws on client input. */
export function answer6(buf: Buffer, ctx: Answer6Context): Decision6 {
  const decoded = tryDecode(decodeMessage6, buf);
  if (!decoded.ok) return { kind: 'drop', why: decoded.why };
  const req = decoded.value;
  const name = msgName(req.type);
  const rule = RULES[req.type];
  if (!rule) return { kind: 'drop', why: `${name} is not a message a client sends to a server` };
  const refused = refuse6(req, ctx, name, rule);
  if (refused) return refused;
  const { lease } = ctx;
  try {
    const iaNas = req.options.filter((o) => o.code === Opt6.IaNa).map((o) => decodeIaNa(o.data));
    switch (req.type) {
      case Msg.Solicit: {
        const rapid = getOption6(req.options, Opt6.RapidCommit) !== undefined;
        const body = assign(req, ctx, false);
        if (rapid)
          return {
            kind: 'reply',
            type: Msg.Reply,
            request: name,
            note: 'rapid commit',
            data: reply(req, Msg.Reply, ctx, [...body, { code: Opt6.RapidCommit, data: Buffer.alloc(0) }], true),
          };
        return { kind: 'reply', type: Msg.Advertise, request: name, data: reply(req, Msg.Advertise, ctx, body, true) };
      }
      case Msg.Request: {
        const off = iaNas.flatMap((ia) => offLink(ia, lease));
        return {
          kind: 'reply',
          type: Msg.Reply,
          request: name,
          data: reply(req, Msg.Reply, ctx, assign(req, ctx, true), true),
          ...(off.length ? { note: `NotOnLink ${off.join(', ')}` } : {}),
        };
      }
      case Msg.Renew:
      case Msg.Rebind:
        return answerRenewRebind(req, ctx, iaNas, name);
      case Msg.Confirm:
        return answerConfirm(req, ctx, iaNas, name);
      case Msg.Release:
      case Msg.Decline: {
        const addrs = iaNas.flatMap((ia) => ia.addrs.map((a) => a.address));
        return {
          kind: 'reply',
          type: Msg.Reply,
          request: name,
          note: `addresses ${addrs.join(', ') || '(none)'}`,
          data: reply(
            req,
            Msg.Reply,
            ctx,
            [statusOption(Status.Success, req.type === Msg.Release ? 'released' : 'decline noted')],
            false,
          ),
        };
      }
      case Msg.InformationRequest:
        return { kind: 'reply', type: Msg.Reply, request: name, data: reply(req, Msg.Reply, ctx, [], true) };
      default:
        return { kind: 'drop', why: `${name} is not served` };
    }
  } catch (e) {
    return { kind: 'drop', why: `${name}: ${errorChain(e)}` };
  }
}

function withZeroed(iaid: number, lease: Lease6, b: Built6, foreign: readonly string[]): Option6 {
  return {
    code: Opt6.IaNa,
    data: encodeIaNa({
      iaid,
      t1: b.t1,
      t2: b.t2,
      options: [
        ...foreign.map((address) => ({ code: Opt6.IaAddr, data: encodeIaAddr({ address, preferred: 0, valid: 0 }) })),
        { code: Opt6.IaAddr, data: encodeIaAddr({ address: lease.ip, preferred: b.preferred, valid: b.valid }) },
      ],
    }),
  };
}

// ---- the server: frames in, frames out ----

export interface Dhcp6Stats {
  advertises: number;
  replies: number;
  /** malformed frames or messages, rule breakers */
  dropped: number;
  /** well-formed but not for us: another MAC, another server's DUID, another destination */
  ignored: number;
  /** over the rate limit */
  limited: number;
}

export interface Dhcp6ServerOptions {
  nsPath: string;
  /** the tap the VM is on */
  tap: string;
  /** the pod bridge's MAC and link-local address: the replies' source, the DUID */
  serverMac: string;
  serverIp: string;
  lease: Lease6;
  log: Logger;
  io?: PacketIo;
  /** replies allowed at once and per second after (default 20, 10) */
  burst?: number;
  perSecond?: number;
}

export class Dhcp6Server {
  readonly stats: Dhcp6Stats = { advertises: 0, replies: 0, dropped: 0, ignored: 0, limited: 0 };
  readonly lease: Lease6;
  private readonly watch: SocketWatch<RecvFrameResult>;
  private readonly io: PacketIo;
  private readonly log: Logger;
  private readonly ctx: Answer6Context;
  private readonly serverIp: string;
  private readonly serverMac: string;
  private readonly limit: RateLimit;
  private readonly nsPath: string;

  /** Validates the lease (VmpodError(Config) before any socket exists), opens the socket, listens when it returns. */
  static start(opts: Dhcp6ServerOptions): Dhcp6Server {
    const built = buildOptions6(opts.lease, opts.serverMac);
    warmUp6({ lease: opts.lease, built }, opts.serverMac, normaliseIpv6(opts.serverIp) ?? opts.serverIp);
    return new Dhcp6Server(opts, built);
  }

  private constructor(opts: Dhcp6ServerOptions, built: Built6) {
    this.io = opts.io ?? nativePacketIo();
    this.lease = opts.lease;
    this.ctx = { lease: opts.lease, built };
    this.serverIp = normaliseIpv6(opts.serverIp) ?? opts.serverIp;
    this.serverMac = opts.serverMac.toLowerCase();
    this.limit = new RateLimit(opts.burst ?? 20, opts.perSecond ?? 10);
    this.log = lazyChild(opts.log, { component: 'dhcp6', tap: opts.tap, mac: opts.lease.mac });
    this.watch = watchTapFrames(
      this.io,
      opts.nsPath,
      opts.tap,
      bpfIpv6Filter({ udpPort: DHCP6_SERVER_PORT }),
      (data, csumNotReady) => this.handle(data, csumNotReady),
      this.log,
      'dhcp6 server',
    );
    this.nsPath = opts.nsPath;
  }

  /** Its start line (the caller writes it once the request that started it has its reply); quiet: at debug. */
  announce(quiet = false): void {
    this.log[quiet ? 'debug' : 'info'](
      {
        nsPath: this.nsPath,
        serverIp: this.serverIp,
        duid: this.ctx.built.serverDuid.toString('hex'),
        ip: `${this.lease.ip}/${this.lease.prefixLength}`,
      },
      'dhcp6 server listening',
    );
  }

  get running(): boolean {
    return this.watch.fd >= 0;
  }

  /** Its stop line on the loop's next turn, as the DHCPv4 server's (DhcpServer.stop). */
  stop(): void {
    if (!this.watch.stop()) return;
    const stats = { ...this.stats };
    setImmediate(() => this.log.info({ stats }, 'dhcp6 server stopped'));
  }

  /** settles once its socket is closed after stop (off the event loop) */
  get closed(): Promise<void> {
    return this.watch.closed;
  }

  /** One frame (csumNotReady: its UDP checksum is still to be filled in, see decodeFrame6); never throws. */
  handle(frameBuf: Buffer, csumNotReady = false): void {
    const drop = (why: string, from?: string) => {
      this.stats.dropped++;
      this.log.debug({ from, bytes: frameBuf.length, why }, 'dhcp6: dropped');
    };
    const ignore = (why: string, from?: string) => {
      this.stats.ignored++;
      this.log.debug({ from, why }, 'dhcp6: ignored');
    };
    let f;
    let udp;
    try {
      f = decodeFrame6(frameBuf, csumNotReady);
      if (f.proto !== NH_UDP) return ignore(`next header ${f.proto}`);
      udp = decodeUdp6(f.payload);
    } catch (e) {
      return drop(errorChain(e));
    }
    const from = `[${f.src}]:${udp.srcPort} ${f.srcMac}`;
    if (udp.dstPort !== DHCP6_SERVER_PORT) return ignore(`UDP port ${udp.dstPort}`, from);
    if (f.srcMac !== this.lease.mac) return ignore(`from ${f.srcMac}, we serve ${this.lease.mac}`, from);
    if (f.dst !== ALL_DHCP_SERVERS && f.dst !== this.serverIp)
      return ignore(`to ${f.dst}, we are ${ALL_DHCP_SERVERS} and ${this.serverIp}`, from);
    let d: Decision6;
    try {
      d = answer6(udp.data, this.ctx);
    } catch (e) {
      d = { kind: 'drop', why: `internal: ${errorChain(e)}` };
    }
    if (d.kind === 'drop') return drop(d.why, from);
    if (d.kind === 'ignore') return ignore(d.why, from);
    if (!this.limit.take()) {
      this.stats.limited++;
      this.log.debug({ from, request: d.request }, 'dhcp6: over the rate limit, not answered');
      return;
    }
    try {
      const out = encodeUdp6Frame(
        { srcMac: this.serverMac, dstMac: f.srcMac, src: this.serverIp, dst: f.src, hopLimit: 64 },
        DHCP6_SERVER_PORT,
        udp.srcPort,
        d.data,
      );
      this.io.writeAll(this.watch.fd, out);
    } catch (e) {
      this.log.warn({ from, err: errorChain(e) }, `dhcp6: sending ${msgName(d.type)} failed`);
      return;
    }
    if (d.type === Msg.Advertise) this.stats.advertises++;
    else this.stats.replies++;
    const line = { from, request: d.request, ip: this.lease.ip, note: d.note };
    if (d.request === 'DECLINE') this.log.warn(line, 'dhcp6: DECLINE, the guest says the address is in use');
    else this.log.info(line, `dhcp6: ${msgName(d.type)}`);
  }
}

let warmed = false;

/**
 * Once per process, at the first DHCPv6 server's start (before tapmanager answers that pod's add), as the DHCPv4
 * server does: a guest's SOLICIT with Rapid Commit and a REQUEST for the lease go through the whole path (frame
 * decode, answer6, the reply's frame), results thrown away. V8 compiles a function on its first call; without this
 * the first guest's first SOLICIT waits for it (bench/dhcp6-first.mjs; docs/performance.md).
 */
export function warmUp6(ctx: Answer6Context, serverMac: string, serverIp: string): void {
  if (warmed) return;
  warmed = true;
  try {
    const guest = formatIpv6(linkLocalFromMac(ctx.lease.mac));
    for (const m of warmUpMessages6(ctx)) {
      const frame = encodeUdp6Frame(
        { srcMac: ctx.lease.mac, dstMac: '33:33:00:01:00:02', src: guest, dst: ALL_DHCP_SERVERS, hopLimit: 1 },
        546,
        DHCP6_SERVER_PORT,
        encodeMessage6(m),
      );
      const f = decodeFrame6(frame);
      const udp = decodeUdp6(f.payload);
      const d = answer6(udp.data, ctx);
      if (d.kind === 'reply')
        encodeUdp6Frame(
          { srcMac: serverMac, dstMac: f.srcMac, src: serverIp, dst: f.src, hopLimit: 64 },
          DHCP6_SERVER_PORT,
          udp.srcPort,
          d.data,
        );
    }
  } catch {
    // a warm-up only: the real first packet compiles whatever this missed
  }
}

/** What the warm-up asks, as the lease's guest would: a SOLICIT with Rapid Commit, then a REQUEST to us. Pure. */
export function warmUpMessages6(ctx: Answer6Context): Message6[] {
  const client = [
    { code: Opt6.ClientId, data: duidLl(ctx.lease.mac) },
    { code: Opt6.IaNa, data: encodeIaNa({ iaid: 1, t1: 0, t2: 0, options: [] }) },
    { code: Opt6.Oro, data: Buffer.from([0, Opt6.DnsServers, 0, Opt6.DomainList]) },
  ];
  return [
    { type: Msg.Solicit, xid: 0x574152, options: [...client, { code: Opt6.RapidCommit, data: Buffer.alloc(0) }] },
    { type: Msg.Request, xid: 0x574153, options: [...client, { code: Opt6.ServerId, data: ctx.built.serverDuid }] },
  ];
}
