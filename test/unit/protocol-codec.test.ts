import { describe, expect, it } from 'vitest';
import {
  decodeCsn,
  decodeGetFDPayload,
  decodeGetInfo,
  decodeRecoverPayload,
  encodeCsn,
  encodeGetFDPayload,
  encodeGetInfo,
  encodeRecoverPayload,
} from '../../src/protocol/codec.js';
import type { ContainerSideNetwork } from '../../src/protocol/payloads.js';
import { errOf } from '../helpers/errors.js';

const b = (s: string) => Buffer.from(s, 'utf8');

// docs/protocol.md, "Example"
const EXAMPLE_CSN =
  '{"Result":{"interfaces":[{"name":"eth0","mac":"42:a4:a6:22:80:2e","sandbox":"/var/run/netns/ID"}],"ips":[{"version":"4","address":"10.1.90.5/24","gateway":"10.1.90.1"}],"routes":[{"dst":"0.0.0.0/0","gw":"10.1.90.1"}],"dns":{}},"NsPath":"/var/run/netns/ID","Interfaces":[{"Type":0,"Name":"eth0","HardwareAddr":"QqSmIoAu","PCIAddress":"","MTU":1500,"VlanID":0}]}';
const EXAMPLE_INFO = '[{"type":0,"mac":"QqSmIoAu","fdIndex":0,"pciAddress":""}]';

describe('the protocol doc example', () => {
  it('round-trips the ContainerSideNetwork byte for byte', () => {
    const csn = decodeCsn(b(EXAMPLE_CSN));
    expect(csn.Interfaces[0]).toEqual({
      Type: 0,
      Name: 'eth0',
      HardwareAddr: 'QqSmIoAu',
      PCIAddress: '',
      MTU: 1500,
      VlanID: 0,
      mac: '42:a4:a6:22:80:2e',
    });
    expect(encodeCsn(csn, { withMac: false }).toString()).toBe(EXAMPLE_CSN);
    // by default our colon-hex copy follows the Virtlet fields
    expect(encodeCsn(csn).toString()).toBe(EXAMPLE_CSN.replace('"VlanID":0}', '"VlanID":0,"mac":"42:a4:a6:22:80:2e"}'));
    expect(decodeCsn(encodeCsn(csn))).toEqual(csn);
  });

  it('round-trips the get info byte for byte', () => {
    const infos = decodeGetInfo(b(EXAMPLE_INFO));
    expect(infos).toEqual([{ type: 0, mac: 'QqSmIoAu', fdIndex: 0, pciAddress: '' }]);
    expect(encodeGetInfo(infos).toString()).toBe(EXAMPLE_INFO);
  });
});

describe('decoders', () => {
  it('decodes an add payload, ignoring unknown fields', () => {
    const p = decodeGetFDPayload(
      b(
        '{"podNetworkDesc":{"podId":"id1","podNs":"default","podName":"vm","DNS":{"nameservers":["10.96.0.10"],"search":["svc"]},"extra":1},"x":true}',
      ),
    );
    expect(p).toEqual({
      podNetworkDesc: {
        podId: 'id1',
        podNs: 'default',
        podName: 'vm',
        DNS: { nameservers: ['10.96.0.10'], search: ['svc'] },
      },
    });
    expect(
      decodeGetFDPayload(b('{"podNetworkDesc":{"podId":"","podNs":"","podName":"","DNS":null}}')).podNetworkDesc.DNS,
    ).toBeNull();
  });

  it('reports malformed JSON', () => {
    const e = errOf(() => decodeGetFDPayload(b('{"podNetworkDesc":')));
    expect(e.code).toBe('BAD_REQUEST');
    expect(e.message).toMatch(/^add payload is not JSON: /);
    expect(errOf(() => decodeRecoverPayload(b('nope'))).message).toMatch(/^recover payload is not JSON: /);
    expect(errOf(() => decodeGetInfo(b(''))).message).toMatch(/^get info is not JSON: /);
  });

  it('reports every problem of an add payload at once, with the bad values', () => {
    const e = errOf(() =>
      decodeGetFDPayload(b('{"podNetworkDesc":{"podId":5,"podName":null,"DNS":{"nameservers":["x",7],"domain":3}}}')),
    );
    expect(e.code).toBe('BAD_REQUEST');
    expect(e.message).toBe(
      'add payload is invalid: ' +
        [
          'podNetworkDesc.podId must be a string (got 5)',
          'podNetworkDesc.podNs must be a string (got nothing)',
          'podNetworkDesc.podName must be a string (got null)',
          'podNetworkDesc.DNS.nameservers[1] must be a string (got 7)',
          'podNetworkDesc.DNS.nameservers[0] must be an IP address (got "x")',
          'podNetworkDesc.DNS.domain must be a string (got 3)',
        ].join('; '),
    );
    expect(errOf(() => decodeGetFDPayload(b('[1]'))).message).toBe(
      'add payload is invalid: payload must be an object (got [1])',
    );
    expect(errOf(() => decodeGetFDPayload(b('{}'))).message).toBe(
      'add payload is invalid: podNetworkDesc must be an object (got nothing)',
    );
  });

  it('decodes a recover payload, normalising colon-hex MACs to base64 plus mac', () => {
    const csn = JSON.parse(EXAMPLE_CSN);
    csn.Interfaces[0].HardwareAddr = '42:A4:A6:22:80:2E';
    csn.Interfaces.push({
      Type: 1,
      Name: 'eth1',
      HardwareAddr: 'fe-ed-00-00-00-01',
      PCIAddress: '0000:03:00.1',
      MTU: 9000,
      VlanID: 100,
    });
    const p = decodeRecoverPayload(
      b(JSON.stringify({ podNetworkDesc: { podId: 'a', podNs: 'b', podName: 'c' }, csn, HaveRunningContainers: true })),
    );
    expect(p.HaveRunningContainers).toBe(true);
    expect(p.podNetworkDesc).toEqual({ podId: 'a', podNs: 'b', podName: 'c', DNS: null });
    expect(p.csn.Interfaces.map((i) => [i.HardwareAddr, i.mac])).toEqual([
      ['QqSmIoAu', '42:a4:a6:22:80:2e'],
      ['/u0AAAAB', 'fe:ed:00:00:00:01'],
    ]);
    expect(p.csn.Interfaces[1]).toMatchObject({ Type: 1, PCIAddress: '0000:03:00.1', MTU: 9000, VlanID: 100 });
    // HaveRunningContainers, Type, PCIAddress, MTU, VlanID default to Go's zero values
    const min = decodeRecoverPayload(
      b(
        '{"podNetworkDesc":{"podId":"a","podNs":"b","podName":"c"},"csn":{"Result":null,"NsPath":"/n","Interfaces":[{"Name":"e","HardwareAddr":"QqSmIoAu"}]}}',
      ),
    );
    expect(min.HaveRunningContainers).toBe(false);
    expect(min.csn.Interfaces[0]).toEqual({
      Type: 0,
      Name: 'e',
      HardwareAddr: 'QqSmIoAu',
      PCIAddress: '',
      MTU: 0,
      VlanID: 0,
      mac: '42:a4:a6:22:80:2e',
    });
    expect(decodeCsn(b('{"Result":null,"NsPath":"/n","Interfaces":null}'))).toEqual({
      Result: null,
      NsPath: '/n',
      Interfaces: [],
    });
  });

  it('reports every problem of a recover payload at once', () => {
    const bad = {
      podNetworkDesc: { podId: 'a', podNs: 'b', podName: [] },
      csn: {
        Result: {
          interfaces: [{ name: 'eth0', mac: 'zz' }, 3],
          ips: [
            { version: 4, address: '10.0.0.1' },
            { version: '6', address: 'fd00::1/64', gateway: 'fd00::g', interface: -1 },
          ],
          routes: [{ dst: '0.0.0.0/33' }, { gw: '1.2.3.4' }],
          dns: [],
        },
        NsPath: 7,
        Interfaces: [
          { Type: 2, Name: 'eth0', HardwareAddr: 'QqSmIoA', PCIAddress: '03:00', MTU: 70000, VlanID: 4095 },
          null,
        ],
      },
      HaveRunningContainers: 'yes',
    };
    const e = errOf(() => decodeRecoverPayload(b(JSON.stringify(bad))));
    expect(e.code).toBe('BAD_REQUEST');
    expect(e.message.startsWith('recover payload is invalid: ')).toBe(true);
    const problems = e.message.slice('recover payload is invalid: '.length).split('; ');
    expect(problems).toEqual([
      'podNetworkDesc.podName must be a string (got [])',
      'csn.Result.interfaces[0].mac must be a MAC (base64 of 6 bytes or colon-hex) (got "zz")',
      'csn.Result.interfaces[1] must be an object (got 3)',
      'csn.Result.ips[0].version must be "4" or "6" (got 4)',
      'csn.Result.ips[0].address must be an address with prefix length (CIDR) (got "10.0.0.1")',
      'csn.Result.ips[1].interface must be an integer in 0..65535 (got -1)',
      'csn.Result.ips[1].gateway must be an IP address (got "fd00::g")',
      'csn.Result.routes[0].dst must be an address with prefix length (CIDR) (got "0.0.0.0/33")',
      'csn.Result.routes[1].dst must be a string (got nothing)',
      'csn.Result.dns must be an object (got [])',
      'csn.NsPath must be a string (got 7)',
      'csn.Interfaces[0].Type must be 0 (tap) or 1 (VF) (got 2)',
      'csn.Interfaces[0].HardwareAddr must be a MAC (base64 of 6 bytes or colon-hex) (got "QqSmIoA")',
      'csn.Interfaces[0].PCIAddress must be a PCI address like 0000:03:00.1 or "" (got "03:00")',
      'csn.Interfaces[0].MTU must be an integer in 0..65535 (got 70000)',
      'csn.Interfaces[0].VlanID must be an integer in 0..4094 (got 4095)',
      'csn.Interfaces[1] must be an object (got null)',
      'HaveRunningContainers must be a boolean (got "yes")',
    ]);
  });

  it('reports a missing csn', () => {
    expect(
      errOf(() => decodeRecoverPayload(b('{"podNetworkDesc":{"podId":"a","podNs":"b","podName":"c"}}'))).message,
    ).toBe('recover payload is invalid: csn must be an object (got nothing)');
  });

  it('decodes get info with colon-hex MACs and VFs, and checks fdIndex', () => {
    const infos = decodeGetInfo(
      b(
        '[{"type":0,"mac":"42:a4:a6:22:80:2e","fdIndex":1,"pciAddress":""},{"type":1,"mac":"/u0AAAAB","fdIndex":0,"pciAddress":"0000:03:00.1","x":1}]',
      ),
    );
    expect(infos).toEqual([
      { type: 0, mac: 'QqSmIoAu', fdIndex: 1, pciAddress: '' },
      { type: 1, mac: '/u0AAAAB', fdIndex: 0, pciAddress: '0000:03:00.1' },
    ]);
    expect(decodeGetInfo(b('null'))).toEqual([]);
    expect(decodeGetInfo(b('[]'))).toEqual([]);
    const e = errOf(() =>
      decodeGetInfo(
        b(
          '[{"type":3,"mac":"x","fdIndex":0},{"mac":"QqSmIoAu","fdIndex":0,"pciAddress":1},{"mac":"QqSmIoAu","fdIndex":4},7]',
        ),
      ),
    );
    expect(e.message).toBe(
      'get info is invalid: ' +
        [
          '[0].type must be 0 (tap) or 1 (VF) (got 3)',
          '[0].mac must be a MAC (base64 of 6 bytes or colon-hex) (got "x")',
          '[1].fdIndex repeats an fd index of [0] (got 0)',
          '[1].pciAddress must be a string (got 1)',
          '[2].fdIndex must be an integer in 0..3 (got 4)',
          '[3] must be an object (got 7)',
        ].join('; '),
    );
    expect(errOf(() => decodeGetInfo(b('{"a":1}'))).message).toBe(
      'get info is invalid: get info must be an array (got {"a":1})',
    );
  });

  it('truncates long bad values in messages', () => {
    const e = errOf(() =>
      decodeGetFDPayload(b(JSON.stringify({ podNetworkDesc: { podId: 'a'.repeat(200).split('') } }))),
    );
    expect(e.message).toMatch(/podId must be a string \(got \["a","a",.*\.\.\.\)/);
  });
});

describe('encoders', () => {
  const csn: ContainerSideNetwork = {
    Result: {
      cniVersion: '0.3.1',
      interfaces: [{ name: 'eth0', mac: '42:a4:a6:22:80:2e' }],
      ips: [{ version: '4', interface: 0, address: '10.1.90.5/24' }],
      routes: [],
    },
    NsPath: '/var/run/netns/k',
    Interfaces: [{ Type: 0, Name: 'eth0', HardwareAddr: '42:a4:a6:22:80:2e', PCIAddress: '', MTU: 1450, VlanID: 0 }],
  };

  it('follows Go field order and omitempty, and emits base64 HardwareAddr plus mac', () => {
    expect(encodeCsn(csn).toString()).toBe(
      '{"Result":{"cniVersion":"0.3.1","interfaces":[{"name":"eth0","mac":"42:a4:a6:22:80:2e"}],"ips":[{"version":"4","interface":0,"address":"10.1.90.5/24"}],"dns":{}},' +
        '"NsPath":"/var/run/netns/k","Interfaces":[{"Type":0,"Name":"eth0","HardwareAddr":"QqSmIoAu","PCIAddress":"","MTU":1450,"VlanID":0,"mac":"42:a4:a6:22:80:2e"}]}',
    );
    expect(encodeCsn({ Result: null, NsPath: '/n', Interfaces: [] }).toString()).toBe(
      '{"Result":null,"NsPath":"/n","Interfaces":[]}',
    );
  });

  it('encodes request payloads that decode back', () => {
    const desc = { podId: 'id', podNs: 'ns', podName: 'n', DNS: { nameservers: ['10.96.0.10'] } };
    const add = encodeGetFDPayload({ podNetworkDesc: desc });
    expect(add.toString()).toBe(
      '{"podNetworkDesc":{"podId":"id","podNs":"ns","podName":"n","DNS":{"nameservers":["10.96.0.10"]}}}',
    );
    expect(decodeGetFDPayload(add)).toEqual({ podNetworkDesc: desc });
    expect(encodeGetFDPayload({ podNetworkDesc: { podId: 'a', podNs: 'b', podName: 'c' } }).toString()).toContain(
      '"DNS":null',
    );
    const rec = encodeRecoverPayload({ podNetworkDesc: desc, csn, HaveRunningContainers: true });
    const back = decodeRecoverPayload(rec);
    expect(back.HaveRunningContainers).toBe(true);
    expect(back.csn.Interfaces[0]!.HardwareAddr).toBe('QqSmIoAu');
    expect(encodeCsn(back.csn)).toEqual(encodeCsn(csn));
  });

  it('encodes get info MACs as base64 whatever the input form', () => {
    expect(
      encodeGetInfo([{ type: 1, mac: 'fe:ed:00:00:00:01', fdIndex: 0, pciAddress: '0000:03:00.1' }]).toString(),
    ).toBe('[{"type":1,"mac":"/u0AAAAB","fdIndex":0,"pciAddress":"0000:03:00.1"}]');
    expect(() => encodeGetInfo([{ type: 0, mac: 'bad', fdIndex: 0, pciAddress: '' }])).toThrow(/bad MAC "bad"/);
  });
});

describe('get info mtu (our extra field)', () => {
  it('is emitted after Virtlet fields when known, read back, and checked', async () => {
    const { encodeGetInfo, decodeGetInfo } = await import('../../src/protocol/codec.js');
    const buf = encodeGetInfo([{ type: 0, mac: '42:a4:a6:22:80:2e', fdIndex: 0, pciAddress: '', mtu: 1400 }]);
    expect(buf.toString()).toBe('[{"type":0,"mac":"QqSmIoAu","fdIndex":0,"pciAddress":"","mtu":1400}]');
    expect(decodeGetInfo(buf)[0]!.mtu).toBe(1400);
    expect(() =>
      decodeGetInfo(Buffer.from('[{"type":0,"mac":"QqSmIoAu","fdIndex":0,"pciAddress":"","mtu":9}]')),
    ).toThrow(/mtu/);
  });
});

describe('multiqueue get (ours: {"queues": N} and queueFdIndices)', () => {
  it("reads the request: none is Virtlet's one queue; a number from 1 to 256; anything else is named", async () => {
    const { decodeGetRequest, encodeGetRequest } = await import('../../src/protocol/codec.js');
    expect(decodeGetRequest(Buffer.alloc(0))).toEqual({ queues: 1 });
    expect(decodeGetRequest(b('{"queues":4}'))).toEqual({ queues: 4 });
    expect(decodeGetRequest(b('{"queues":256,"x":1}'))).toEqual({ queues: 256 });
    expect(decodeGetRequest(b('{}'))).toEqual({ queues: 1 });
    expect(encodeGetRequest({ queues: 1 })).toBeNull();
    expect(encodeGetRequest({ queues: 8 })!.toString()).toBe('{"queues":8}');
    expect(errOf(() => decodeGetRequest(b('{"queues":0}'))).message).toBe(
      'get payload is invalid: queues must be an integer in 1..256 (got 0)',
    );
    expect(errOf(() => decodeGetRequest(b('{"queues":"4"}'))).message).toBe(
      'get payload is invalid: queues must be an integer in 1..256 (got "4")',
    );
    expect(errOf(() => decodeGetRequest(b('[4]'))).message).toBe(
      'get payload is invalid: payload must be an object (got [4])',
    );
    expect(errOf(() => decodeGetRequest(b('x'))).message).toMatch(/^get payload is not JSON: /);
  });

  it('round-trips queueFdIndices after the Virtlet fields; every index counts once', () => {
    const infos = [
      { type: 0 as const, mac: '42:a4:a6:22:80:2e', fdIndex: 0, pciAddress: '', mtu: 1500, queueFdIndices: [0, 1, 2] },
      { type: 1 as const, mac: 'fe:ed:00:00:00:01', fdIndex: 3, pciAddress: '0000:03:00.1' },
      { type: 0 as const, mac: '42:a4:a6:22:80:2f', fdIndex: 4, pciAddress: '', queueFdIndices: [4, 5] },
    ];
    const buf = encodeGetInfo(infos);
    expect(buf.toString()).toBe(
      '[{"type":0,"mac":"QqSmIoAu","fdIndex":0,"pciAddress":"","mtu":1500,"queueFdIndices":[0,1,2]},' +
        '{"type":1,"mac":"/u0AAAAB","fdIndex":3,"pciAddress":"0000:03:00.1"},' +
        '{"type":0,"mac":"QqSmIoAv","fdIndex":4,"pciAddress":"","queueFdIndices":[4,5]}]',
    );
    expect(decodeGetInfo(buf).map((i) => i.queueFdIndices)).toEqual([[0, 1, 2], undefined, [4, 5]]);
  });

  it('refuses indices out of range, repeated, or a first queue that is not fdIndex', () => {
    const e = errOf(() =>
      decodeGetInfo(
        b(
          '[{"type":0,"mac":"QqSmIoAu","fdIndex":0,"pciAddress":"","queueFdIndices":[0,1,6]},' +
            '{"type":0,"mac":"QqSmIoAv","fdIndex":3,"pciAddress":"","queueFdIndices":[2,1]},' +
            '{"type":0,"mac":"QqSmIoAw","fdIndex":4,"pciAddress":"","queueFdIndices":[]}]',
        ),
      ),
    );
    expect(e.message).toBe(
      'get info is invalid: ' +
        [
          '[0].queueFdIndices[2] must be an integer in 0..5 (got 6)',
          '[1].queueFdIndices[0] must be fdIndex (got 2)',
          '[1].queueFdIndices[1] repeats an fd index of [0] (got 1)',
          '[2].queueFdIndices must hold 1..256 fd indices (got [])',
        ].join('; '),
    );
  });
});
