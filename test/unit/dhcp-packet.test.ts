import { describe, expect, it } from 'vitest';
import { isVmpodError } from '../../src/errors.js';
import {
  BOOTP_MIN_REPLY_LEN,
  chaddrMac,
  decodePacket,
  encodeOption,
  encodePacket,
  getOption,
  messageType,
  MessageType,
  Opt,
  optionIp,
} from '../../src/dhcp/packet.js';

/** A DISCOVER laid out by hand from RFC 2131 figure 1 and RFC 2132. */
function handDiscover(): Buffer {
  const b = Buffer.alloc(300);
  b[0] = 1; // op BOOTREQUEST
  b[1] = 1; // htype Ethernet (RFC 1700 ARP hardware types)
  b[2] = 6; // hlen
  b[3] = 0; // hops
  b.writeUInt32BE(0x3903f326, 4); // xid
  b.writeUInt16BE(3, 8); // secs
  b.writeUInt16BE(0x8000, 10); // flags: B
  // ciaddr 12..15, yiaddr 16..19, siaddr 20..23, giaddr 24..27 all zero
  Buffer.from([0x02, 0x42, 0xac, 0x11, 0x00, 0x02]).copy(b, 28); // chaddr (16 bytes, 6 used)
  // sname 44..107, file 108..235 zero
  Buffer.from([99, 130, 83, 99]).copy(b, 236); // magic cookie
  let i = 240;
  for (const byte of [
    53,
    1,
    1, // DHCP message type DISCOVER (RFC 2132 9.6)
    61,
    7,
    1,
    0x02,
    0x42,
    0xac,
    0x11,
    0x00,
    0x02, // client id: type 1 + MAC (9.14)
    50,
    4,
    10,
    1,
    2,
    3, // requested IP (9.1)
    55,
    4,
    1,
    3,
    6,
    121, // parameter request list (9.8)
    0,
    0, // pads
    57,
    2,
    0x02,
    0x40, // max message size 576 (9.10)
    255, // end
  ])
    b[i++] = byte;
  return b;
}

describe('dhcp packet codec', () => {
  it('decodes a DISCOVER laid out byte by byte from RFC 2131', () => {
    const p = decodePacket(handDiscover());
    expect(p).toMatchObject({ op: 1, htype: 1, hlen: 6, hops: 0, xid: 0x3903f326, secs: 3, flags: 0x8000 });
    expect([p.ciaddr, p.yiaddr, p.siaddr, p.giaddr]).toEqual(['0.0.0.0', '0.0.0.0', '0.0.0.0', '0.0.0.0']);
    expect(chaddrMac(p)).toBe('02:42:ac:11:00:02');
    expect(messageType(p)).toBe(MessageType.Discover);
    expect(optionIp(p, Opt.RequestedIp)).toBe('10.1.2.3');
    expect([...getOption(p, Opt.ParameterList)!]).toEqual([1, 3, 6, 121]);
    expect(getOption(p, Opt.ClientId)!.toString('hex')).toBe('010242ac110002');
    expect(getOption(p, Opt.MaxMessageSize)!.readUInt16BE(0)).toBe(576);
    expect(p.options.map((o) => o.code)).toEqual([53, 61, 50, 55, 57]);
  });

  it('re-encodes the same DISCOVER byte for byte', () => {
    const raw = handDiscover();
    const p = decodePacket(raw);
    const again = encodePacket(p);
    // our encoder writes no pads: compare the decoded forms and the fixed header bytes
    expect(again.subarray(0, 240).equals(raw.subarray(0, 240))).toBe(true);
    expect(decodePacket(again)).toEqual(p);
  });

  it('pads replies to 300 bytes and ends the options with 255', () => {
    const p = decodePacket(handDiscover());
    const out = encodePacket({ ...p, op: 2, options: [{ code: 53, data: Buffer.from([2]) }] });
    expect(out.length).toBe(BOOTP_MIN_REPLY_LEN);
    expect([...out.subarray(236, 244)]).toEqual([99, 130, 83, 99, 53, 1, 2, 255]);
  });

  it('encodes options as code, length, data (RFC 2132) and splits > 255 bytes (RFC 3396)', () => {
    expect([...encodeOption({ code: 1, data: Buffer.from([255, 255, 255, 0]) })]).toEqual([1, 4, 255, 255, 255, 0]);
    expect([...encodeOption({ code: 26, data: Buffer.from([0x05, 0xdc]) })]).toEqual([26, 2, 5, 220]);
    const long = Buffer.alloc(300, 7);
    const enc = encodeOption({ code: 119, data: long });
    expect(enc.length).toBe(304);
    expect([enc[0], enc[1], enc[257], enc[258]]).toEqual([119, 255, 119, 45]);
    // and the decoder concatenates them again
    const p = decodePacket(handDiscover());
    const out = encodePacket({
      ...p,
      options: [
        { code: 119, data: long },
        { code: 53, data: Buffer.from([1]) },
      ],
    });
    expect(getOption(decodePacket(out), 119)!.equals(long)).toBe(true);
  });

  it('overflows options into file and then sname with option 52 when maxLen is tight, and reads them back', () => {
    const p = decodePacket(handDiscover());
    const options = [
      { code: 53, data: Buffer.from([2]) },
      { code: 119, data: Buffer.alloc(250, 1) },
      { code: 15, data: Buffer.alloc(100, 0x61) },
      { code: 12, data: Buffer.alloc(60, 0x62) },
      { code: 26, data: Buffer.from([5, 0xdc]) },
    ];
    const out = encodePacket({ ...p, op: 2, options }, 548);
    expect(out.length).toBeLessThanOrEqual(548);
    expect(out[108]).toBe(15); // file holds option 15
    expect(out[44]).toBe(12); // sname holds option 12
    const back = decodePacket(out);
    expect([...getOption(back, Opt.Overload)!]).toEqual([3]);
    for (const o of options) expect(getOption(back, o.code)!.equals(o.data), `option ${o.code}`).toBe(true);
    expect(() => encodePacket({ ...p, options: [...options, { code: 6, data: Buffer.alloc(200) }] }, 548)).toThrow(
      /do not fit a 548-byte message/,
    );
  });

  it('reads options from file and sname when option 52 overloads them (RFC 2131 4.1)', () => {
    const b = handDiscover();
    // put option 52 = 3 before end, file holds option 12 "vm", sname holds option 15 "lab"
    const end = b.indexOf(255, 240);
    Buffer.from([52, 1, 3, 255]).copy(b, end);
    Buffer.from([12, 2, 0x76, 0x6d, 255]).copy(b, 108);
    Buffer.from([15, 3, 0x6c, 0x61, 0x62, 255]).copy(b, 44);
    const p = decodePacket(b);
    expect(getOption(p, 12)!.toString()).toBe('vm');
    expect(getOption(p, 15)!.toString()).toBe('lab');
  });

  it('rejects short, long, cookie-less, overrunning and unterminated packets with VmpodError(Protocol)', () => {
    const good = handDiscover();
    const cases: [string, Buffer][] = [
      ['short', good.subarray(0, 239)],
      ['long', Buffer.concat([good, Buffer.alloc(1300)])],
      ['cookie', Buffer.from(good).fill(0, 236, 237)],
      [
        'overrun',
        (() => {
          const b = Buffer.from(good.subarray(0, 244));
          b[240] = 12;
          b[241] = 200;
          b[242] = 1;
          return b;
        })(),
      ],
      [
        'no end',
        (() => {
          const b = Buffer.from(good.subarray(0, 243));
          b[240] = 53;
          b[241] = 1;
          b[242] = 1;
          return b;
        })(),
      ],
      [
        'no length byte',
        (() => {
          const b = Buffer.from(good.subarray(0, 241));
          b[240] = 53;
          return b;
        })(),
      ],
    ];
    for (const [name, buf] of cases) {
      let err: unknown;
      try {
        decodePacket(buf);
      } catch (e) {
        err = e;
      }
      expect(isVmpodError(err), name).toBe(true);
      expect((err as { code: string }).code, name).toBe('PROTOCOL');
    }
  });

  it('rejects the DISCOVER truncated at every offset, never with anything but VmpodError', () => {
    const good = handDiscover();
    const end = good.indexOf(255, 240);
    for (let n = 0; n <= end; n++) {
      expect(() => decodePacket(good.subarray(0, n)), `truncated to ${n}`).toThrow(/malformed DHCP packet/);
    }
    expect(() => decodePacket(good.subarray(0, end + 1))).not.toThrow();
  });
});
