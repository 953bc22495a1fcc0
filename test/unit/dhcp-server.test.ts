import { describe, expect, it, vi } from 'vitest';
import { silentLogger } from '../../src/log.js';
import type { DhcpLease } from '../../src/dhcp/lease.js';
import { decodeClasslessRoutes } from '../../src/dhcp/options.js';
import {
  decodePacket,
  type DhcpOption,
  encodePacket,
  getOption,
  macToBytes,
  MessageType,
  messageType,
  Opt,
  optionIp,
} from '../../src/dhcp/packet.js';
import { DhcpServer, type DhcpSocketIo } from '../../src/dhcp/server.js';

const SERVER = '169.254.254.2';
const lease: DhcpLease = {
  mac: '02:AB:CD:00:00:05',
  ip: '10.1.90.5',
  prefixLength: 24,
  gateway: '10.1.90.1',
  routes: [{ dst: '0.0.0.0/0', gw: '10.1.90.1' }],
  dns: ['10.96.0.10'],
  search: ['cluster.local'],
  hostname: 'vm-1',
  mtu: 1450,
  leaseSeconds: 3600,
};

/** A recording fake of the socket calls: push datagrams, fire the poll callback, read what was sent. */
class FakeIo implements DhcpSocketIo {
  opened: [string, string, number][] = [];
  closed: number[] = [];
  sent: { data: Buffer; address: string; port: number }[] = [];
  queue: Buffer[] = [];
  cb: ((err: Error | null) => void) | undefined;
  pollStopped = 0;
  failPoll = false;
  udpSocketInNetns(nsPath: string, ifname: string, port: number): number {
    this.opened.push([nsPath, ifname, port]);
    return 42;
  }
  pollReadable(_fd: number, cb: (err: Error | null) => void) {
    if (this.failPoll) throw Object.assign(new Error('uv_poll_init: EBADF'), { code: 'EBADF' });
    this.cb = cb;
    return { stop: () => void this.pollStopped++ };
  }
  recvFrom(_fd: number, max: number) {
    const d = this.queue.shift();
    return d ? { data: d.subarray(0, max), address: '0.0.0.0', port: 68, ifindex: 7 } : null;
  }
  sendTo(_fd: number, data: Buffer, address: string, port: number): number {
    this.sent.push({ data, address, port });
    return data.length;
  }
  close(fd: number): void {
    this.closed.push(fd);
  }
  deliver(...bufs: Buffer[]): void {
    this.queue.push(...bufs);
    this.cb?.(null);
  }
}

function request(
  type: number,
  opts: { mac?: string; ciaddr?: string; options?: DhcpOption[]; op?: number } = {},
): Buffer {
  const chaddr = Buffer.alloc(16);
  macToBytes(opts.mac ?? '02:ab:cd:00:00:05').copy(chaddr);
  return encodePacket({
    op: opts.op ?? 1,
    htype: 1,
    hlen: 6,
    hops: 0,
    xid: 0x1234abcd,
    secs: 0,
    flags: 0,
    ciaddr: opts.ciaddr ?? '0.0.0.0',
    yiaddr: '0.0.0.0',
    siaddr: '0.0.0.0',
    giaddr: '0.0.0.0',
    chaddr,
    options: [{ code: Opt.MessageType, data: Buffer.from([type]) }, ...(opts.options ?? [])],
  });
}

const ip = (s: string) => Buffer.from(s.split('.').map(Number));

function start(io = new FakeIo(), extra: Partial<Parameters<typeof DhcpServer.start>[0]> = {}) {
  const server = DhcpServer.start({
    nsPath: '/var/run/netns/p',
    bridge: 'br0',
    serverIp: SERVER,
    lease,
    log: silentLogger(),
    io,
    findConflict: async () => '02:99:00:00:00:01',
    ...extra,
  });
  return { io, server };
}

describe('DhcpServer (recording fake socket)', () => {
  it('opens its socket in the netns on the bridge, port 67', () => {
    const { io, server } = start();
    expect(io.opened).toEqual([['/var/run/netns/p', 'br0', 67]]);
    expect(server.running).toBe(true);
    server.stop();
  });

  it('answers DISCOVER with a broadcast OFFER carrying the lease and echoing the client id', () => {
    const { io, server } = start();
    const cid = Buffer.from([1, 2, 0xab, 0xcd, 0, 0, 5]);
    io.deliver(
      request(MessageType.Discover, {
        options: [
          { code: Opt.ClientId, data: cid },
          { code: Opt.ParameterList, data: Buffer.from([1, 3, 6, 12, 15, 26, 119, 121]) },
        ],
      }),
    );
    expect(io.sent).toHaveLength(1);
    expect(io.sent[0]).toMatchObject({ address: '255.255.255.255', port: 68 });
    const r = decodePacket(io.sent[0].data);
    expect(r).toMatchObject({ op: 2, xid: 0x1234abcd, yiaddr: '10.1.90.5', ciaddr: '0.0.0.0' });
    expect(messageType(r)).toBe(MessageType.Offer);
    expect(optionIp(r, Opt.ServerId)).toBe(SERVER);
    expect(getOption(r, Opt.ClientId)!.equals(cid)).toBe(true);
    expect(r.options.slice(0, 3).map((o) => o.code)).toEqual([53, 54, 1]);
    expect(decodeClasslessRoutes(getOption(r, Opt.ClasslessRoutes)!)).toEqual([
      { dst: SERVER, prefix: 32, gw: '0.0.0.0' },
      { dst: '0.0.0.0', prefix: 0, gw: '10.1.90.1' },
    ]);
    expect(server.stats).toMatchObject({ offers: 1, acks: 0, naks: 0, dropped: 0 });
    server.stop();
  });

  it('ACKs REQUESTs in SELECTING, INIT-REBOOT and RENEWING states for the lease address', () => {
    const { io, server } = start();
    io.deliver(
      request(MessageType.Request, {
        options: [
          { code: Opt.ServerId, data: ip(SERVER) },
          { code: Opt.RequestedIp, data: ip('10.1.90.5') },
        ],
      }),
      request(MessageType.Request, { options: [{ code: Opt.RequestedIp, data: ip('10.1.90.5') }] }),
      request(MessageType.Request, { ciaddr: '10.1.90.5' }),
    );
    const replies = io.sent.map((s) => decodePacket(s.data));
    expect(replies.map(messageType)).toEqual([MessageType.Ack, MessageType.Ack, MessageType.Ack]);
    expect(replies.map((r) => r.yiaddr)).toEqual(['10.1.90.5', '10.1.90.5', '10.1.90.5']);
    expect(replies[2].ciaddr).toBe('10.1.90.5');
    expect(getOption(replies[0], Opt.LeaseTime)!.readUInt32BE(0)).toBe(3600);
    expect(server.stats.acks).toBe(3);
    server.stop();
  });

  it('NAKs a wrong address in every state and ignores a SELECTING request for another server', () => {
    const { io, server } = start();
    io.deliver(
      request(MessageType.Request, {
        options: [
          { code: Opt.ServerId, data: ip(SERVER) },
          { code: Opt.RequestedIp, data: ip('10.1.90.6') },
        ],
      }),
      request(MessageType.Request, { options: [{ code: Opt.RequestedIp, data: ip('192.168.1.9') }] }),
      request(MessageType.Request, { ciaddr: '10.1.90.77' }),
      request(MessageType.Request, {}),
      request(MessageType.Request, {
        options: [
          { code: Opt.ServerId, data: ip('10.0.0.1') },
          { code: Opt.RequestedIp, data: ip('10.1.90.5') },
        ],
      }),
    );
    const replies = io.sent.map((s) => decodePacket(s.data));
    expect(replies.map(messageType)).toEqual([MessageType.Nak, MessageType.Nak, MessageType.Nak, MessageType.Nak]);
    for (const r of replies) {
      expect(r.yiaddr).toBe('0.0.0.0');
      expect(optionIp(r, Opt.ServerId)).toBe(SERVER);
      expect(getOption(r, Opt.LeaseTime)).toBeUndefined();
    }
    expect(getOption(replies[1], Opt.Message)!.toString()).toMatch(/192\.168\.1\.9 is not leased/);
    expect(server.stats).toMatchObject({ naks: 4, acks: 0, ignored: 1 });
    server.stop();
  });

  it('tells its hooks each packet by direction and type, and each lease granted; remembers the last lease', () => {
    const packets: string[] = [];
    let leases = 0;
    const { io, server } = start(new FakeIo(), {
      onPacket: (d, t) => packets.push(`${d} ${t}`),
      onLease: () => void leases++,
    });
    expect(server.lastLeaseAt).toBeUndefined();
    io.deliver(request(MessageType.Discover));
    expect(server.lastLeaseAt).toBeUndefined();
    io.deliver(
      request(MessageType.Request, {
        options: [
          { code: Opt.ServerId, data: ip(SERVER) },
          { code: Opt.RequestedIp, data: ip('10.1.90.5') },
        ],
      }),
      request(MessageType.Inform, { ciaddr: '10.1.90.5' }),
      request(MessageType.Request, { ciaddr: '10.1.90.77' }),
      Buffer.from('garbage'),
    );
    expect(packets).toEqual([
      'received discover',
      'sent offer',
      'received request',
      'sent ack',
      'received inform',
      'sent ack',
      'received request',
      'sent nak',
      'received malformed',
    ]);
    expect(leases).toBe(1); // the ACK to INFORM and the NAK grant nothing
    expect(Date.now() - server.lastLeaseAt!.getTime()).toBeLessThan(60_000);
    server.stop();
  });

  it('answers INFORM with an ACK without yiaddr and without lease times', () => {
    const { io, server } = start();
    io.deliver(request(MessageType.Inform, { ciaddr: '10.1.90.5' }));
    const r = decodePacket(io.sent[0].data);
    expect(messageType(r)).toBe(MessageType.Ack);
    expect(r.yiaddr).toBe('0.0.0.0');
    expect(r.ciaddr).toBe('10.1.90.5');
    for (const code of [Opt.LeaseTime, Opt.RenewalTime, Opt.RebindingTime]) expect(getOption(r, code)).toBeUndefined();
    expect(getOption(r, Opt.DnsServers)).toBeDefined();
    server.stop();
  });

  it('serves its MAC in any case, ignores other MACs, drops BOOTREPLYs, logs RELEASE without replying', () => {
    const { io, server } = start();
    io.deliver(
      request(MessageType.Discover, { mac: '02:ab:cd:00:00:06' }),
      request(MessageType.Offer, { op: 2 }),
      request(MessageType.Release, { ciaddr: '10.1.90.5' }),
    );
    expect(io.sent).toHaveLength(0);
    expect(server.stats).toMatchObject({ ignored: 1, dropped: 1, offers: 0 });
    io.deliver(request(MessageType.Discover, { mac: '02:AB:CD:00:00:05' }));
    expect(io.sent).toHaveLength(1);
    server.stop();
  });

  it('DECLINE: no reply, DISCOVERs unanswered during a back-off that doubles per DECLINE, answered again after it', () => {
    vi.useFakeTimers({ toFake: ['Date'] });
    try {
      const t0 = Date.now();
      const { io, server } = start(new FakeIo(), { declineBackoffMs: 10_000 });
      const decline = () =>
        request(MessageType.Decline, { options: [{ code: Opt.RequestedIp, data: ip('10.1.90.5') }] });
      io.deliver(decline(), request(MessageType.Discover), request(MessageType.Discover));
      expect(io.sent).toHaveLength(0);
      expect(server.stats).toMatchObject({ declines: 1, ignored: 2, offers: 0 });
      vi.setSystemTime(t0 + 10_001);
      io.deliver(request(MessageType.Discover));
      expect(io.sent).toHaveLength(1);
      io.deliver(decline()); // the second back-off is 20 s
      vi.setSystemTime(t0 + 10_001 + 15_000);
      io.deliver(request(MessageType.Discover));
      expect(io.sent).toHaveLength(1);
      vi.setSystemTime(t0 + 10_001 + 20_001);
      io.deliver(request(MessageType.Discover));
      expect(io.sent).toHaveLength(2);
      server.stop();
    } finally {
      vi.useRealTimers();
    }
  });

  it('drops malformed datagrams without throwing: every truncation, no type 53, bad cookie, > 1500 bytes, bad hlen', () => {
    const { io, server } = start();
    const good = request(MessageType.Discover);
    const end = good.indexOf(255, 240);
    for (let n = 0; n <= end; n++) expect(() => io.deliver(good.subarray(0, n))).not.toThrow();
    const noType = decodePacket(good);
    const cookie = Buffer.from(good);
    cookie[236] = 0;
    const hlen = Buffer.from(good);
    hlen[2] = 16;
    io.deliver(
      encodePacket({ ...noType, options: [] }),
      cookie,
      Buffer.concat([good, Buffer.alloc(1300)]),
      hlen,
      request(MessageType.Ack),
    );
    expect(io.sent).toHaveLength(0);
    expect(server.stats.dropped).toBe(end + 1 + 5);
    // and it still answers afterwards
    io.deliver(good);
    expect(io.sent).toHaveLength(1);
    server.stop();
  });

  it('stop() is idempotent, closes the socket once and ignores late wake-ups', () => {
    const { io, server } = start();
    const cb = io.cb!;
    server.stop();
    server.stop();
    expect(io.closed).toEqual([42]);
    expect(io.pollStopped).toBe(1);
    expect(server.running).toBe(false);
    io.queue.push(request(MessageType.Discover));
    cb(null);
    expect(io.sent).toHaveLength(0);
  });

  it('validates the lease before opening a socket, and closes the socket when watching it fails', () => {
    const io = new FakeIo();
    expect(() =>
      DhcpServer.start({
        nsPath: '/p',
        bridge: 'br0',
        serverIp: SERVER,
        lease: { ...lease, search: ['bad domain'] },
        log: silentLogger(),
        io,
      }),
    ).toThrow(/bad label/);
    expect(io.opened).toHaveLength(0);
    io.failPoll = true;
    expect(() => start(io)).toThrow(/EBADF/);
    expect(io.closed).toEqual([42]);
  });
});
