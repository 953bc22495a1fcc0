// Packet-level tests of the DHCPv6 and RA codecs and their answers: golden bytes written from RFC 8415 / RFC 4861 /
// RFC 8106 formats, the lease derivation's bad-input errors, and a fuzz test (random and mutated messages: no
// throw, and no reply to anything but a well-formed message).
import { randomBytes } from 'node:crypto';
import { isIP } from 'node:net';
import { describe, expect, it } from 'vitest';
import type { CniResult } from '../../src/cni/types.js';
import { guestFromCni, type Lease6 } from '../../src/dhcp/lease.js';
import { buildOptions6 } from '../../src/dhcp6/options.js';
import {
  decodeIaNa,
  decodeMessage6,
  decodeStatus,
  duidLl,
  encodeDomainList,
  encodeIaAddr,
  encodeIaNa,
  encodeMessage6,
  getOption6,
  Msg,
  Opt6,
  Status,
} from '../../src/dhcp6/packet.js';
import { answer6, Dhcp6Server, warmUpMessages6 } from '../../src/dhcp6/server.js';
import { checksum6, decodeFrame6, decodeUdp6, encodeIcmp6Frame, encodeUdp6Frame } from '../../src/net/frame6.js';
import { ipFamily } from '../../src/net/ip.js';
import { formatIpv6, linkLocalFromMac, multicastMac, parseIpv6 } from '../../src/net/ipv6.js';
import { silentLogger } from '../../src/log.js';
import { raFromLease } from '../../src/ra/options.js';
import { answerNs, answerRs, RaServer } from '../../src/ra/server.js';
import { decodeRa, encodeNa, encodeRa } from '../../src/ra/packet.js';

const VM_MAC = '52:54:00:12:34:56';
const BR_MAC = '02:00:00:aa:bb:cc';
const lease: Lease6 = {
  mac: VM_MAC,
  ip: 'fd00:10::5',
  prefixLength: 64,
  prefix: 'fd00:10::',
  gateway: 'fd00:10::1',
  defaultRoute: true,
  routes: [{ dst: '::/0', gw: 'fd00:10::1' }],
  dns: ['fd00:10::53'],
  search: ['svc.cluster.local'],
  mtu: 1450,
  leaseSeconds: 86400,
};
const built = buildOptions6(lease, BR_MAC);
const ctx = { lease, built };
const clientDuid = Buffer.from('000100012c3a4b5c525400123456', 'hex');

function solicit(extra: { code: number; data: Buffer }[] = []): Buffer {
  return encodeMessage6({
    type: Msg.Solicit,
    xid: 0xabcdef,
    options: [
      { code: Opt6.ClientId, data: clientDuid },
      { code: Opt6.IaNa, data: encodeIaNa({ iaid: 7, t1: 0, t2: 0, options: [] }) },
      ...extra,
    ],
  });
}

const rs = (
  srcMac: string,
  hopLimit = 255,
  src = 'fe80::5054:ff:fe12:3456',
  body = Buffer.from('8500000000000000', 'hex'),
) => encodeIcmp6Frame({ srcMac, dstMac: '33:33:00:00:00:02', src, dst: 'ff02::2', hopLimit }, body);

describe('IPv6 text and bytes', () => {
  it('parses and prints RFC 5952 text', () => {
    expect(formatIpv6(parseIpv6('2001:DB8:0:0:1:0:0:1')!)).toBe('2001:db8::1:0:0:1');
    expect(formatIpv6(parseIpv6('::ffff:10.1.2.3')!)).toBe('::ffff:a01:203');
    expect(parseIpv6('1::2::3')).toBeUndefined();
    expect(parseIpv6('fe80::1%eth0')).toBeUndefined();
    expect(formatIpv6(linkLocalFromMac('52:54:00:12:34:56'))).toBe('fe80::5054:ff:fe12:3456');
  });

  it("ipFamily agrees with node:net isIP (which it replaces on vmwrapper's path), zones aside", () => {
    const words = [
      '1.2.3.4',
      '01.2.3.4',
      '255.255.255.255',
      '256.1.1.1',
      '1.2.3',
      '::',
      '::1',
      'fe80::1',
      '1:2:3:4:5:6:7:8',
      '1:2:3:4:5:6:7::',
      '::ffff:10.1.2.3',
      '::ffff:1.2.3.256',
      '1:2:3:4:5:6:7:8:9',
      '1::2::3',
      'fd00::/64',
      '',
      'a',
      '2001:DB8::A',
      '12345::1',
      '1:2:3:4:5:6:1.2.3.4',
      '::1.2.3.4',
      ':1::',
      '1:::2',
      ' ::1',
    ];
    // and random strings over the alphabet addresses are made of
    for (let i = 0; i < 3000; i++)
      words.push(Array.from(randomBytes(2 + (i % 14)), (b) => '0123456789abcdefABCDEF:.'[b % 24]).join(''));
    for (const w of words) expect([w, ipFamily(w)]).toEqual([w, isIP(w)]);
    expect(isIP('fe80::1%eth0')).toBe(6);
    expect(ipFamily('fe80::1%eth0')).toBe(0); // no zone in a pod's addresses
  });
});

describe('DHCPv6 codec (RFC 8415)', () => {
  it('encodes a message byte for byte', () => {
    // msg-type 2, xid 0x010203; option 2 (Server Identifier) len 10: DUID-LL type 3, hw type 1, MAC
    const m = encodeMessage6({
      type: Msg.Advertise,
      xid: 0x010203,
      options: [{ code: Opt6.ServerId, data: duidLl(BR_MAC) }],
    });
    expect(m.toString('hex')).toBe('02010203' + '0002000a' + '00030001' + '020000aabbcc');
  });

  it('IA_NA and IA Address (21.4, 21.6) and the domain list (21.8, RFC 1035 wire format)', () => {
    const ia = encodeIaNa({
      iaid: 1,
      t1: 43200,
      t2: 69120,
      options: [{ code: Opt6.IaAddr, data: encodeIaAddr({ address: 'fd00:10::5', preferred: 86400, valid: 86400 }) }],
    });
    expect(ia.toString('hex')).toBe(
      '00000001' + '0000a8c0' + '00010e00' + '00050018' + 'fd000010000000000000000000000005' + '00015180' + '00015180',
    );
    expect(encodeDomainList(['svc.cluster.local']).toString('hex')).toBe(
      '03737663' + '07636c7573746572' + '056c6f63616c' + '00',
    );
    const d = decodeIaNa(ia);
    expect(d.addrs).toEqual([{ address: 'fd00:10::5', preferred: 86400, valid: 86400, options: [] }]);
  });

  it('refuses an option that runs past its container (the IA_NA that crashes dnsmasq 2.90)', () => {
    const bad = Buffer.from(`08abcdef0001000e${clientDuid.toString('hex')}0003004000000001`, 'hex');
    expect(() => decodeMessage6(bad)).toThrow(RangeError);
    expect(answer6(bad, ctx).kind).toBe('drop');
  });

  it("keeps the server's DUID and options in one allocation of their size, not in a slab of Node's 64 KiB pool", () => {
    const kept = [built.serverDuid, ...built.info.map((o) => o.data)];
    const total = kept.reduce((n, b) => n + b.length, 0);
    for (const b of kept) expect(b.buffer).toBe(built.serverDuid.buffer);
    expect(built.serverDuid.buffer.byteLength).toBe(total);
    expect(total).toBeLessThan(Buffer.poolSize);
  });

  it('SOLICIT -> ADVERTISE with the lease, server DUID, client DUID and IAID echoed, DNS and domain list', () => {
    const d = answer6(solicit(), ctx);
    expect(d.kind).toBe('reply');
    if (d.kind !== 'reply') return;
    const m = decodeMessage6(d.data);
    expect(m.type).toBe(Msg.Advertise);
    expect(m.xid).toBe(0xabcdef);
    expect(getOption6(m.options, Opt6.ServerId)!.toString('hex')).toBe('00030001020000aabbcc');
    expect(getOption6(m.options, Opt6.ClientId)!.equals(clientDuid)).toBe(true);
    const ia = decodeIaNa(getOption6(m.options, Opt6.IaNa)!);
    expect(ia).toMatchObject({
      iaid: 7,
      t1: 43200,
      t2: 69120,
      addrs: [{ address: 'fd00:10::5', preferred: 86400, valid: 86400 }],
    });
    expect(formatIpv6(getOption6(m.options, Opt6.DnsServers)!)).toBe('fd00:10::53');
    expect(getOption6(m.options, Opt6.DomainList)!.equals(encodeDomainList(['svc.cluster.local']))).toBe(true);
  });

  it('rapid commit: SOLICIT with option 14 -> REPLY with option 14', () => {
    const d = answer6(solicit([{ code: Opt6.RapidCommit, data: Buffer.alloc(0) }]), ctx);
    if (d.kind !== 'reply') throw new Error(d.kind);
    const m = decodeMessage6(d.data);
    expect(m.type).toBe(Msg.Reply);
    expect(getOption6(m.options, Opt6.RapidCommit)).toEqual(Buffer.alloc(0));
  });

  const withAddr = (type: number, addr: string, server = true) =>
    encodeMessage6({
      type,
      xid: 1,
      options: [
        { code: Opt6.ClientId, data: clientDuid },
        ...(server ? [{ code: Opt6.ServerId, data: built.serverDuid }] : []),
        {
          code: Opt6.IaNa,
          data: encodeIaNa({
            iaid: 7,
            t1: 0,
            t2: 0,
            options: [{ code: Opt6.IaAddr, data: encodeIaAddr({ address: addr, preferred: 0, valid: 0 }) }],
          }),
        },
      ],
    });
  const iaStatus = (data: Buffer) => {
    const ia = decodeIaNa(getOption6(decodeMessage6(data).options, Opt6.IaNa)!);
    const st = getOption6(ia.options, Opt6.StatusCode);
    return { ia, status: st ? decodeStatus(st).code : undefined };
  };

  it('RENEW of our address renews; of another one -> NoBinding; REBIND of another -> it at lifetime 0 and ours', () => {
    const ok = answer6(withAddr(Msg.Renew, 'fd00:10::5'), ctx);
    if (ok.kind !== 'reply') throw new Error(ok.kind);
    expect(iaStatus(ok.data).ia.addrs[0]).toMatchObject({ address: 'fd00:10::5', valid: 86400 });
    const nb = answer6(withAddr(Msg.Renew, 'fd00:10::9'), ctx);
    if (nb.kind !== 'reply') throw new Error(nb.kind);
    expect(iaStatus(nb.data).status).toBe(Status.NoBinding);
    const rb = answer6(withAddr(Msg.Rebind, 'fd00:99::9', false), ctx);
    if (rb.kind !== 'reply') throw new Error(rb.kind);
    expect(iaStatus(rb.data).ia.addrs.map((a) => [a.address, a.valid])).toEqual([
      ['fd00:99::9', 0],
      ['fd00:10::5', 86400],
    ]);
  });

  it('CONFIRM: Success on link, NotOnLink off it, silence without addresses', () => {
    const top = (data: Buffer) => decodeStatus(getOption6(decodeMessage6(data).options, Opt6.StatusCode)!).code;
    const on = answer6(withAddr(Msg.Confirm, 'fd00:10::5', false), ctx);
    const off = answer6(withAddr(Msg.Confirm, 'fd00:99::5', false), ctx);
    if (on.kind !== 'reply' || off.kind !== 'reply') throw new Error('no reply');
    expect(top(on.data)).toBe(Status.Success);
    expect(top(off.data)).toBe(Status.NotOnLink);
    const none = encodeMessage6({ type: Msg.Confirm, xid: 1, options: [{ code: Opt6.ClientId, data: clientDuid }] });
    expect(answer6(none, ctx).kind).toBe('ignore');
  });

  it('REQUEST naming an address outside the pod prefix -> NotOnLink in that IA_NA, no address (RFC 8415 18.3.2)', () => {
    const off = answer6(withAddr(Msg.Request, 'fd00:99::5'), ctx);
    if (off.kind !== 'reply') throw new Error(off.kind);
    expect(decodeMessage6(off.data).type).toBe(Msg.Reply);
    expect(iaStatus(off.data)).toMatchObject({ ia: { iaid: 7, addrs: [] }, status: Status.NotOnLink });
    expect(off.note).toBe('NotOnLink fd00:99::5');
    // inside the prefix, whatever address it names, the lease's address
    for (const addr of ['fd00:10::5', 'fd00:10::77']) {
      const on = answer6(withAddr(Msg.Request, addr), ctx);
      if (on.kind !== 'reply') throw new Error(on.kind);
      expect(iaStatus(on.data)).toMatchObject({
        ia: { addrs: [{ address: 'fd00:10::5', valid: 86400 }] },
        status: undefined,
      });
    }
    // a SOLICIT's address is a hint only: the lease is offered
    const hint = answer6(withAddr(Msg.Solicit, 'fd00:99::5', false), ctx);
    if (hint.kind !== 'reply') throw new Error(hint.kind);
    expect(iaStatus(hint.data).ia.addrs.map((a) => a.address)).toEqual(['fd00:10::5']);
  });

  it('RELEASE, DECLINE -> Success; INFORMATION-REQUEST -> DNS without IA; REQUEST for another server is ignored', () => {
    for (const t of [Msg.Release, Msg.Decline]) {
      const d = answer6(withAddr(t, 'fd00:10::5'), ctx);
      if (d.kind !== 'reply') throw new Error(d.kind);
      expect(decodeStatus(getOption6(decodeMessage6(d.data).options, Opt6.StatusCode)!).code).toBe(Status.Success);
    }
    const info = answer6(encodeMessage6({ type: Msg.InformationRequest, xid: 2, options: [] }), ctx);
    if (info.kind !== 'reply') throw new Error(info.kind);
    const m = decodeMessage6(info.data);
    expect(getOption6(m.options, Opt6.IaNa)).toBeUndefined();
    expect(getOption6(m.options, Opt6.DnsServers)).toBeDefined();
    const other = encodeMessage6({
      type: Msg.Request,
      xid: 3,
      options: [
        { code: Opt6.ClientId, data: clientDuid },
        { code: Opt6.ServerId, data: duidLl('02:00:00:00:00:01') },
      ],
    });
    expect(answer6(other, ctx).kind).toBe('ignore');
    // RFC 8415 16: SOLICIT must not carry a Server Identifier, REQUEST must carry a Client Identifier
    expect(answer6(solicit([{ code: Opt6.ServerId, data: built.serverDuid }]), ctx).kind).toBe('drop');
    expect(
      answer6(
        encodeMessage6({ type: Msg.Request, xid: 3, options: [{ code: Opt6.ServerId, data: built.serverDuid }] }),
        ctx,
      ).kind,
    ).toBe('drop');
  });
});

describe('RA codec (RFC 4861, RFC 8106)', () => {
  it('encodes the RA of a lease byte for byte', () => {
    const ra = encodeRa(raFromLease(lease, BR_MAC));
    const hex = ra.toString('hex');
    // type 134, code 0, checksum 0, hop limit 64, M|O, router lifetime 1800, reachable 0, retrans 0
    expect(hex.slice(0, 32)).toBe('86000000' + '40c0' + '0708' + '00000000' + '00000000');
    const opts = hex.slice(32);
    expect(opts).toContain('0101' + '020000aabbcc'); // source link-layer address
    expect(opts).toContain('0501' + '0000' + '000005aa'); // MTU 1450
    // prefix information: len 4, /64, L=1 A=0, valid 2592000, preferred 604800, reserved, prefix
    expect(opts).toContain(
      '0304' + '40' + '80' + '00278d00' + '00093a80' + '00000000' + 'fd000010000000000000000000000000',
    );
    // RDNSS: len 3, reserved, lifetime 1200, address
    expect(opts).toContain('1903' + '0000' + '000004b0' + 'fd000010000000000000000000000053');
    // DNSSL: len 4 (2 + 4 + 19 bytes, padded to 32), lifetime 1200, svc.cluster.local
    expect(opts).toContain(
      '1f04' + '0000' + '000004b0' + '03737663' + '07636c7573746572' + '056c6f63616c' + '00' + '0000000000',
    );
    expect(decodeRa(ra)).toMatchObject({
      managed: true,
      other: true,
      routerLifetime: 1800,
      mtu: 1450,
      prefixes: [{ prefix: 'fd00:10::', length: 64, onLink: true, autonomous: false }],
    });
  });

  it('router lifetime 0 without an IPv6 default route', () => {
    expect(decodeRa(encodeRa(raFromLease({ ...lease, defaultRoute: false }, BR_MAC))).routerLifetime).toBe(0);
  });

  it('answers an RS from the VM at once, unicast; not another MAC, not hop limit < 255', () => {
    const router = formatIpv6(linkLocalFromMac(BR_MAC));
    expect(answerRs(rs(VM_MAC), VM_MAC, router)).toEqual({
      kind: 'answer',
      dst: 'fe80::5054:ff:fe12:3456',
      dstMac: VM_MAC,
    });
    expect(answerRs(rs('52:54:00:99:99:99'), VM_MAC, router).kind).toBe('ignore');
    expect(answerRs(rs(VM_MAC, 64), VM_MAC, router).kind).toBe('drop');
    // option with length 0 (RFC 4861 4.6: invalid)
    expect(answerRs(rs(VM_MAC, 255, 'fe80::1', Buffer.from('85000000000000000100', 'hex')), VM_MAC, router).kind).toBe(
      'drop',
    );
  });

  /** an NS from `srcMac` at `src` for `target`, with a source link-layer address option unless from :: */
  const ns = (srcMac: string, target: string, src = 'fe80::5054:ff:fe12:3456', hopLimit = 255) => {
    const body = Buffer.alloc(24);
    body[0] = 135;
    parseIpv6(target)!.copy(body, 8);
    const slla = Buffer.from(`0101${srcMac.replace(/:/g, '')}`, 'hex');
    const t = parseIpv6(target)!;
    const dst = `ff02::1:ff${t[13]!.toString(16).padStart(2, '0')}:${t.readUInt16BE(14).toString(16)}`;
    return encodeIcmp6Frame(
      { srcMac, dstMac: formatMac(multicastMac(parseIpv6(dst)!)), src, dst, hopLimit },
      src === '::' ? body : Buffer.concat([body, slla]),
    );
  };
  const formatMac = (b: Buffer) => [...b].map((x) => x.toString(16).padStart(2, '0')).join(':');

  it('answers an NS for the router address from the VM (answerNs), nothing else', () => {
    const router = formatIpv6(linkLocalFromMac(BR_MAC));
    expect(answerNs(ns(VM_MAC, router), VM_MAC, router)).toEqual({
      kind: 'answer',
      dst: 'fe80::5054:ff:fe12:3456',
      dstMac: VM_MAC,
    });
    expect(answerNs(ns(VM_MAC, 'fe80::99'), VM_MAC, router).kind).toBe('ignore');
    expect(answerNs(ns('52:54:00:99:99:99', router), VM_MAC, router).kind).toBe('ignore');
    expect(answerNs(ns(VM_MAC, router, '::'), VM_MAC, router).kind).toBe('ignore');
    expect(answerNs(ns(VM_MAC, router, 'fe80::1', 64), VM_MAC, router).kind).toBe('drop');
    expect(answerNs(rs(VM_MAC), VM_MAC, router).kind).toBe('ignore');
    // the NA: R, S, O; target; target link-layer address option (RFC 4861 4.4)
    expect(encodeNa(router, BR_MAC).toString('hex')).toBe(
      `88000000e0000000${parseIpv6(router)!.toString('hex')}0201020000aabbcc`,
    );
  });

  it('RA server with answerNs: an NS for its address gets an NA into the tap; without it, NS is not its business', () => {
    const router = formatIpv6(linkLocalFromMac(BR_MAC));
    const silent = silentLogger();
    for (const answer of [true, false]) {
      const sent: Buffer[] = [];
      const filters: Buffer[] = [];
      const io = {
        packetSocketInNetns: (_n: string, _t: string, filter: Buffer) => (filters.push(filter), 3),
        pollReadable: () => ({ stop() {} }),
        recvFrame: () => null,
        writeAll: (_fd: number, b: Buffer) => void sent.push(b),
        close: () => {},
        closeOffLoop: async () => {},
      };
      const s = RaServer.start({
        nsPath: '/x',
        tap: 'tap0',
        routerMac: BR_MAC,
        routerIp: router,
        lease,
        log: silent,
        io,
        answerNs: answer,
      });
      const initial = sent.length;
      s.handle(ns(VM_MAC, router));
      // the socket's filter: 5 instructions + one test per ICMPv6 type + reject + accept
      expect(filters[0]!.length / 8).toBe(answer ? 9 : 8);
      if (answer) {
        expect(s.stats.neighbour).toBe(1);
        const f = decodeFrame6(sent[initial]!);
        expect({ src: f.src, dst: f.dst, dstMac: f.dstMac, hopLimit: f.hopLimit, type: f.payload[0] }).toEqual({
          src: router,
          dst: 'fe80::5054:ff:fe12:3456',
          dstMac: VM_MAC,
          hopLimit: 255,
          type: 136,
        });
      } else {
        expect(sent.length).toBe(initial);
        expect(s.stats.ignored).toBe(1);
      }
      s.stop();
    }
  });

  it('frames carry a correct ICMPv6 checksum', () => {
    const f = rs(VM_MAC);
    const d = decodeFrame6(f);
    expect(checksum6(parseIpv6(d.src)!, parseIpv6(d.dst)!, 58, d.payload)).toBe(0);
    const broken = Buffer.from(f);
    broken[broken.length - 1]! ^= 1;
    expect(() => decodeFrame6(broken)).toThrow(/checksum/);
  });
});

describe('checksum offload: frames whose checksum the guest left to be filled in', () => {
  /** What a sender with checksum offload leaves in the field (CHECKSUM_PARTIAL): the pseudo-header sum, folded. */
  function partial(frame: Buffer): Buffer {
    const f = Buffer.from(frame);
    const at = 14 + 40 + (f[20] === 17 ? 6 : 2);
    let sum = f.readUInt16BE(18) + f[20]!;
    for (let i = 22; i < 54; i += 2) sum += f.readUInt16BE(i);
    while (sum > 0xffff) sum = (sum & 0xffff) + (sum >>> 16);
    f.writeUInt16BE(sum, at);
    return f;
  }
  const guest = 'fe80::5054:ff:fe12:3456';
  const solicitFrame = partial(
    encodeUdp6Frame(
      { srcMac: VM_MAC, dstMac: '33:33:00:01:00:02', src: guest, dst: 'ff02::1:2', hopLimit: 1 },
      546,
      547,
      solicit(),
    ),
  );

  it("decodeFrame6 takes the socket's word (csumNotReady) and checks the lengths only", () => {
    expect(() => decodeFrame6(solicitFrame)).toThrow(/bad UDP checksum/);
    const d = decodeFrame6(solicitFrame, true);
    expect(decodeUdp6(d.payload)).toMatchObject({ srcPort: 546, dstPort: 547 });
    // a truncated frame is refused all the same
    expect(() => decodeFrame6(solicitFrame.subarray(0, solicitFrame.length - 1), true)).toThrow(/runs past/);
    expect(answerRs(partial(rs(VM_MAC)), VM_MAC, formatIpv6(linkLocalFromMac(BR_MAC)), true).kind).toBe('answer');
  });

  it("the DHCPv6 server answers such a SOLICIT; the same frame without the socket's word is dropped", () => {
    const sent: Buffer[] = [];
    const io = {
      packetSocketInNetns: () => 3,
      pollReadable: () => ({ stop() {} }),
      recvFrame: () => null,
      writeAll: (_fd: number, b: Buffer) => void sent.push(b),
      close: () => {},
      closeOffLoop: async () => {},
    };
    const silent = silentLogger();
    const s = Dhcp6Server.start({
      nsPath: '/x',
      tap: 'tap0',
      serverMac: BR_MAC,
      serverIp: formatIpv6(linkLocalFromMac(BR_MAC)),
      lease,
      log: silent,
      io,
    });
    s.handle(solicitFrame);
    expect(s.stats).toMatchObject({ dropped: 1, advertises: 0 });
    s.handle(solicitFrame, true);
    expect(s.stats).toMatchObject({ dropped: 1, advertises: 1 });
    // the answer carries a full checksum of its own
    const out = decodeFrame6(sent[0]!);
    expect(decodeMessage6(decodeUdp6(out.payload).data).type).toBe(Msg.Advertise);
    s.stop();
  });
});

describe('fuzz: random and mutated messages never throw and are never answered when malformed', () => {
  const seeds = [solicit(), solicit([{ code: Opt6.RapidCommit, data: Buffer.alloc(0) }])];
  it('DHCPv6 answer()', () => {
    for (let i = 0; i < 3000; i++) {
      let b: Buffer;
      if (i % 3 === 0) b = randomBytes(Math.floor(Math.random() * 120));
      else {
        b = Buffer.from(seeds[i % seeds.length]!);
        for (let k = 0; k < 1 + (i % 5); k++) b[Math.floor(Math.random() * b.length)] = Math.floor(Math.random() * 256);
        if (i % 7 === 0) b = b.subarray(0, Math.floor(Math.random() * b.length));
      }
      const d = answer6(b, ctx);
      if (d.kind === 'reply') {
        // a reply only for a message that decodes and whose IA options decode
        const m = decodeMessage6(b);
        for (const o of m.options) if (o.code === Opt6.IaNa) decodeIaNa(o.data);
      }
    }
  });

  it('DHCPv6 server handle() of mutated frames, checksum checked or not (offload): never throws, every answer a whole frame', () => {
    const sent: Buffer[] = [];
    const io = {
      packetSocketInNetns: () => 3,
      pollReadable: () => ({ stop() {} }),
      recvFrame: () => null,
      writeAll: (_fd: number, b: Buffer) => void sent.push(b),
      close: () => {},
      closeOffLoop: async () => {},
    };
    const silent = silentLogger();
    const s = Dhcp6Server.start({
      nsPath: '/x',
      tap: 'tap0',
      serverMac: BR_MAC,
      serverIp: formatIpv6(linkLocalFromMac(BR_MAC)),
      lease,
      log: silent,
      io,
      burst: 1e9,
      perSecond: 1e9,
    });
    const good = encodeUdp6Frame(
      { srcMac: VM_MAC, dstMac: '33:33:00:01:00:02', src: 'fe80::5054:ff:fe12:3456', dst: 'ff02::1:2', hopLimit: 1 },
      546,
      547,
      solicit(),
    );
    for (let i = 0; i < 2000; i++) {
      let b = Buffer.from(good);
      // mutate anywhere after the Ethernet header: lengths, next header, ports, the message
      for (let k = 0; k < 1 + (i % 3); k++)
        b[14 + Math.floor(Math.random() * (b.length - 14))] = Math.floor(Math.random() * 256);
      if (i % 5 === 0) b = b.subarray(0, Math.floor(Math.random() * b.length));
      s.handle(b, i % 2 === 0);
    }
    for (const f of sent)
      expect(decodeMessage6(decodeUdp6(decodeFrame6(f).payload).data).type).toBeOneOf([Msg.Advertise, Msg.Reply]);
    expect(s.stats.dropped + s.stats.ignored + s.stats.advertises + s.stats.replies).toBe(2000);
    s.stop();
  });

  it('RA server handle(): garbage frames are dropped, nothing sent', () => {
    const sent: Buffer[] = [];
    const io = {
      packetSocketInNetns: () => 3,
      pollReadable: () => ({ stop() {} }),
      recvFrame: () => null,
      writeAll: (_fd: number, b: Buffer) => void sent.push(b),
      close: () => {},
      closeOffLoop: async () => {},
    };
    const silent = silentLogger();
    const s = RaServer.start({
      nsPath: '/x',
      tap: 'tap0',
      routerMac: BR_MAC,
      routerIp: formatIpv6(linkLocalFromMac(BR_MAC)),
      lease,
      log: silent,
      io,
    });
    const initial = sent.length; // the unsolicited one at start
    const good = rs(VM_MAC);
    for (let i = 0; i < 2000; i++) {
      const b = Buffer.from(good);
      for (let k = 0; k < 1 + (i % 4); k++)
        b[14 + Math.floor(Math.random() * (b.length - 14))] = Math.floor(Math.random() * 256);
      s.handle(i % 2 ? b : randomBytes(Math.floor(Math.random() * 100)), i % 3 === 0);
    }
    // every sent frame answers something that decoded as a valid RS from the VM
    expect(sent.length - initial).toBeLessThanOrEqual(s.stats.solicited);
    expect(s.stats.dropped + s.stats.ignored + s.stats.solicited + s.stats.limited).toBe(2000);
    s.stop();
  });
});

describe('what the guest sees, from the CNI result', () => {
  const base = (
    ips: CniResult['ips'],
    routes: CniResult['routes'] = [{ dst: '::/0', gw: 'fd00:10::1' }],
  ): CniResult => ({
    cniVersion: '1.0.0',
    interfaces: [{ name: 'eth0', mac: VM_MAC, sandbox: '/x' }],
    ips,
    routes,
    dns: { nameservers: ['fd00:10::53', '10.96.0.10'], search: ['svc.cluster.local'] },
  });
  const g = (r: CniResult) => guestFromCni({ result: r, ifIndex: 0, mac: VM_MAC, podName: 'vm' });

  it('dual-stack: both leases, one DNS decision', () => {
    const n = g(
      base([
        { address: '10.1.0.5/24', gateway: '10.1.0.1', interface: 0 },
        { address: 'fd00:10::5/64', gateway: 'fd00:10::1', interface: 0 },
      ]),
    );
    expect(n.v4?.ip).toBe('10.1.0.5');
    expect(n.v4?.dns).toEqual(['10.96.0.10']);
    expect(n.v6).toMatchObject({
      ip: 'fd00:10::5',
      prefix: 'fd00:10::',
      prefixLength: 64,
      gateway: 'fd00:10::1',
      defaultRoute: true,
      dns: ['fd00:10::53'],
      search: ['svc.cluster.local'],
    });
  });

  it('IPv6 only: no IPv4 lease, no error', () => {
    const n = g(base([{ address: 'fd00:10::5/64', gateway: 'fd00:10::1', interface: 0 }]));
    expect(n.v4).toBeUndefined();
    expect(n.v6?.ip).toBe('fd00:10::5');
  });

  it('bad input names the field', () => {
    expect(() => g(base([{ address: 'fd00:10::5/128', interface: 0 }]))).toThrow(
      /ips\[0\]\.address fd00:10::5\/128: prefix \/128 is longer than \/64/,
    );
    expect(() => g(base([{ address: 'fd00:10::5/80', interface: 0 }]))).toThrow(
      /ips\[0\]\.address .* longer than \/64/,
    );
    expect(() => g(base([{ address: 'fe80::5/64', interface: 0 }]))).toThrow(
      /ips\[0\]\.address fe80::5\/64 is link-local/,
    );
    expect(() =>
      g(
        base([
          { address: 'fd00:10::5/64', interface: 0 },
          { address: 'fd00:10::6/64', interface: 0 },
        ]),
      ),
    ).toThrow(/2 IPv6 addresses for interface 0/);
    expect(() => g(base([{ address: 'fd00:10::5/64', gateway: 'fd00:99::1', interface: 0 }]))).toThrow(
      /ips\[0\]\.gateway fd00:99::1 is not on-link/,
    );
    expect(() => g(base([{ address: 'fd00:10::5/64', interface: 0 }], [{ dst: '::/0', gw: 'fd00:99::1' }]))).toThrow(
      /routes\[0\]\.gw fd00:99::1 is not on-link/,
    );
  });
});

describe('DHCPv6 warm-up', () => {
  it('asks what a guest asks, and each is answered with the lease: the whole answer path runs before the first guest', () => {
    const answers = warmUpMessages6(ctx).map((m) => answer6(encodeMessage6(m), ctx));
    expect(answers.map((d) => (d.kind === 'reply' ? `${d.request} -> ${d.type}` : d.kind))).toEqual([
      `SOLICIT -> ${Msg.Reply}`,
      `REQUEST -> ${Msg.Reply}`,
    ]);
    for (const d of answers) {
      if (d.kind !== 'reply') continue;
      const ia = decodeIaNa(getOption6(decodeMessage6(d.data).options, Opt6.IaNa)!);
      expect(ia.addrs.map((a) => a.address)).toEqual([lease.ip]);
    }
  });
});
