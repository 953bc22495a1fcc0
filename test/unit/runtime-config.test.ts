// Runtime config of VM pods: the add request's optional portMappings and bandwidth (decoded strictly, absent from
// Virtlet's own requests), tapctl's --port and --bandwidth, the capability args they become for every CNI verb, and the
// binding flag.
import { describe, expect, it } from 'vitest';
import { decodeGetFDPayload, encodeGetFDPayload } from '../../src/protocol/codec.js';
import { parsePortFlag, parseTapctlArgs } from '../../src/bin/tapctl-options.js';
import { capabilityArgs, runtimeConf } from '../../src/podnet/podnetwork.js';
import { buildOneConfig } from '../../src/cni/config.js';
import { parseConfig } from '../../src/tapmanager/config.js';
import { isVmpodError } from '../../src/errors.js';

const base = { podId: 'id1', podNs: 'default', podName: 'vm1' };
const decode = (desc: unknown) => decodeGetFDPayload(Buffer.from(JSON.stringify({ podNetworkDesc: desc })));

function badRequest(f: () => unknown): string {
  try {
    f();
  } catch (e) {
    if (isVmpodError(e) && e.code === 'BAD_REQUEST') return e.message;
    throw e;
  }
  throw new Error('no error');
}

describe('podNetworkDesc.portMappings and bandwidth', () => {
  it('a Virtlet request (neither field) decodes and encodes as before', () => {
    const d = decode({ ...base, DNS: null }).podNetworkDesc;
    expect(d).toEqual({ ...base, DNS: null });
    expect(JSON.parse(encodeGetFDPayload({ podNetworkDesc: d }).toString())).toEqual({
      podNetworkDesc: { ...base, DNS: null },
    });
  });

  it('decodes both, the protocol in lower case (CRI writes TCP), hostIP "" by default, and encodes them back', () => {
    const d = decode({
      ...base,
      portMappings: [
        { hostPort: 8080, containerPort: 80, protocol: 'TCP' },
        { hostPort: 5353, containerPort: 53, protocol: 'udp', hostIP: '10.0.0.5' },
      ],
      bandwidth: { ingressRate: 1000000, egressRate: 2000000, egressBurst: 64000 },
    }).podNetworkDesc;
    expect(d.portMappings).toEqual([
      { hostPort: 8080, containerPort: 80, protocol: 'tcp', hostIP: '' },
      { hostPort: 5353, containerPort: 53, protocol: 'udp', hostIP: '10.0.0.5' },
    ]);
    expect(d.bandwidth).toEqual({ ingressRate: 1000000, egressRate: 2000000, egressBurst: 64000 });
    expect(
      decode(JSON.parse(encodeGetFDPayload({ podNetworkDesc: d }).toString()).podNetworkDesc).podNetworkDesc,
    ).toEqual(d);
  });

  it('refuses bad ones, naming each field', () => {
    const msg = badRequest(() =>
      decode({
        ...base,
        portMappings: [{ hostPort: 0, containerPort: 70000, protocol: 'icmp', hostIP: 'x' }, 'p'],
        bandwidth: { ingressRate: -1 },
      }),
    );
    for (const f of [
      'portMappings[0].hostPort',
      'portMappings[0].containerPort',
      'portMappings[0].protocol',
      'portMappings[0].hostIP',
      'portMappings[1]',
      'bandwidth.ingressRate',
    ]) {
      expect(msg).toContain(`podNetworkDesc.${f}`);
    }
    expect(badRequest(() => decode({ ...base, portMappings: [{ containerPort: 80 }] }))).toContain(
      'portMappings[0].hostPort is required',
    );
    expect(badRequest(() => decode({ ...base, bandwidth: 5 }))).toContain('podNetworkDesc.bandwidth must be an object');
  });
});

describe('the capability args every CNI verb of the pod gets', () => {
  const desc = {
    ...base,
    portMappings: [{ hostPort: 8080, containerPort: 80, protocol: 'tcp' as const, hostIP: '' }],
    bandwidth: { ingressRate: 1000 },
  };

  it('come from the record, only those the pod has', () => {
    expect(capabilityArgs(base)).toBeUndefined();
    expect(
      runtimeConf({ key: 'k1', nsPath: '/var/run/netns/k1', desc: base }, 'virtlet-eth0').capabilityArgs,
    ).toBeUndefined();
    expect(runtimeConf({ key: 'k1', nsPath: '/var/run/netns/k1', desc }, 'virtlet-eth0').capabilityArgs).toEqual({
      portMappings: desc.portMappings,
      bandwidth: desc.bandwidth,
    });
  });

  it('reach only the plugins that declare the capability, as runtimeConfig', () => {
    const caps = capabilityArgs(desc);
    const list = { name: 'n', cniVersion: '1.0.0' };
    expect(
      buildOneConfig(list, { type: 'portmap', capabilities: { portMappings: true } }, undefined, caps).runtimeConfig,
    ).toEqual({ portMappings: desc.portMappings });
    expect(
      buildOneConfig(list, { type: 'bandwidth', capabilities: { bandwidth: true } }, undefined, caps).runtimeConfig,
    ).toEqual({ bandwidth: desc.bandwidth });
    expect(buildOneConfig(list, { type: 'bridge' }, undefined, caps).runtimeConfig).toBeUndefined();
  });
});

describe('tapctl add --port and --bandwidth', () => {
  it('--port HOST:VM[/tcp|udp], repeatable', () => {
    const p = parseTapctlArgs(['add', 'k', '--port', '8080:80', '--port', '5353:53/udp', '--port', '2222:22/tcp']);
    expect(p.errors).toEqual([]);
    expect(p.lists.get('--port')!.map(parsePortFlag)).toEqual([
      { hostPort: 8080, containerPort: 80, protocol: 'tcp', hostIP: '' },
      { hostPort: 5353, containerPort: 53, protocol: 'udp', hostIP: '' },
      { hostPort: 2222, containerPort: 22, protocol: 'tcp', hostIP: '' },
    ]);
    for (const bad of ['80', '0:80', '8080:70000', '8080:80/icmp', 'a:b', '8080:80/'])
      expect(parsePortFlag(bad)).toBeUndefined();
  });
});

describe('tapmanager --binding', () => {
  it('takes bridge, tc-redirect and auto from the flag or VMPOD_BINDING', () => {
    for (const b of ['bridge', 'tc-redirect', 'auto']) {
      const r = parseConfig(['--binding', b], {});
      expect(r.ok && r.config.binding).toBe(b);
    }
    const env = parseConfig([], { VMPOD_BINDING: 'tc-redirect' });
    expect(env.ok && env.config.binding).toBe('tc-redirect');
  });

  it('refuses anything else', () => {
    expect(parseConfig(['--binding', 'macvtap'], {})).toEqual({
      ok: false,
      errors: ['--binding / VMPOD_BINDING "macvtap" is not one of auto, bridge, tc-redirect'],
    });
  });
});
