import { describe, expect, it } from 'vitest';
import {
  cniArgProblems,
  keyProblems,
  podDescProblems,
  podIdProblems,
  podNameProblems,
  podNsProblems,
  validateKey,
  MAX_KEY_BYTES,
} from '../../src/identity.js';
import { KEY_SIZE } from '../../src/protocol/commands.js';
import { validateContainerId } from '../../src/cni/config.js';
import { decodeGetFDPayload, decodeRecoverPayload } from '../../src/protocol/codec.js';
import { encodeError } from '../../src/protocol/frames.js';
import { isVmpodError } from '../../src/errors.js';

const RULE = "libcni's container ID rule: ^[a-zA-Z0-9][a-zA-Z0-9_.-]*$, 1..64 bytes";

describe('validateKey: libcni container ID rule, at most 64 bytes', () => {
  it('the key limit is the header key field', () => {
    expect(MAX_KEY_BYTES).toBe(KEY_SIZE);
  });

  it.each([
    'a',
    'pod-1',
    '0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef',
    'A.b_c-D',
    'a..b',
    'a.',
    '9_',
  ])('accepts %j, and libcni accepts it too', (key) => {
    expect(validateKey(key)).toBe(key);
    expect(keyProblems(key)).toEqual([]);
    expect(() => validateContainerId(key)).not.toThrow();
  });

  it.each([
    ['', /bad key "": is empty/],
    ['.', /bad key ".": does not start with a letter or digit/],
    ['..', /bad key "..": does not start with a letter or digit/],
    ['...', /does not start with a letter or digit/],
    ['.x', /bad key ".x": does not start with a letter or digit/],
    ['-x', /bad key "-x": does not start with a letter or digit/],
    ['_x', /bad key "_x": does not start with a letter or digit/],
    ['.hidden', /does not start with a letter or digit/],
    ['a/b', /bad key "a\/b": has characters outside \[A-Za-z0-9_.-\]: "\/"/],
    ['a b', /bad key "a b": has characters outside .*: " "/],
    ['x'.repeat(65), /is 65 bytes, at most 64/],
    ['pöd', /bad key "pöd": has characters outside .*: "ö"/],
    ['../x', /has characters outside .*: "\/"; does not start with a letter or digit/],
    ['a\u0000', /bad key "a\\u0000"/],
    ['a\nb', /bad key "a\\nb"/],
    ['a;b', /has characters outside .*: ";"/],
    ['a=b', /has characters outside .*: "="/],
    ['/etc/passwd', /has characters outside/],
  ])('rejects %j, saying why', (key, msg) => {
    try {
      validateKey(key);
      expect.unreachable();
    } catch (e) {
      expect(isVmpodError(e) && e.code).toBe('BAD_KEY');
      expect((e as Error).message).toMatch(msg);
      expect((e as Error).message).toContain(RULE);
    }
    // whatever we refuse, libcni would refuse too (or the header cannot carry it)
    if (Buffer.byteLength(key) <= 64) expect(() => validateContainerId(key)).toThrow();
  });

  it('reports every problem at once', () => {
    const key = 'é/'.repeat(30);
    expect(keyProblems(key)).toEqual([
      'is 90 bytes, at most 64 fit in the header',
      'has characters outside [A-Za-z0-9_.-]: "é/"',
      'does not start with a letter or digit',
    ]);
  });
});

describe('pod names, namespaces and ids', () => {
  it.each(['default', 'kube-system', 'a', 'ns1', 'x'.repeat(63), ''])('namespace %j is a DNS-1123 label', (ns) => {
    expect(podNsProblems(ns)).toEqual([]);
  });
  it.each([
    ['Default', /not a DNS-1123 label/],
    ['a.b', /not a DNS-1123 label/],
    ['-a', /not a DNS-1123 label/],
    ['a-', /not a DNS-1123 label/],
    ['x'.repeat(64), /64 characters, at most 63/],
  ])('namespace %j is refused', (ns, msg) => {
    expect(podNsProblems(ns).join('; ')).toMatch(msg);
  });

  it.each(['vm', 'vm-1', 'c', 'my.vm-0', 'a'.repeat(253), ''])('pod name %j is a DNS-1123 subdomain', (n) => {
    expect(podNameProblems(n)).toEqual([]);
  });
  it.each([
    ['VM', /not a DNS-1123 subdomain/],
    ['vm_1', /not a DNS-1123 subdomain/],
    ['.vm', /not a DNS-1123 subdomain/],
    ['vm..x', /not a DNS-1123 subdomain/],
    ['a'.repeat(254), /254 characters, at most 253/],
  ])('pod name %j is refused', (n, msg) => {
    expect(podNameProblems(n).join('; ')).toMatch(msg);
  });

  it.each(['uid-1', '8f0c1a2e-4b5d-4c6e-9f70-112233445566', 'a', 'rec-ok', ''])('pod id %j is accepted', (id) => {
    expect(podIdProblems(id)).toEqual([]);
  });
  it.each([
    ['a b', /outside \[A-Za-z0-9._:-\]: " "/],
    ['a;b', /outside .*: ";"/],
    ['-a', /does not start with a letter or digit/],
    ['x'.repeat(129), /129 bytes, at most 128/],
  ])('pod id %j is refused', (id, msg) => {
    expect(podIdProblems(id).join('; ')).toMatch(msg);
  });

  it.each(['a;b', 'a=b', 'a\u0000b', 'a\nb', 'a\u007fb'])('%j cannot go into CNI_ARGS', (v) => {
    expect(cniArgProblems(v).join()).toMatch(/CNI_ARGS cannot carry/);
  });

  it('names every bad field', () => {
    expect(podDescProblems({ podId: 'ok', podNs: 'a;b', podName: 'X=1' }).map((p) => p.field)).toEqual([
      'podNs',
      'podNs',
      'podName',
      'podName',
    ]);
  });
});

describe('checked when the request is decoded', () => {
  const add = (desc: object): Buffer =>
    Buffer.from(JSON.stringify({ podNetworkDesc: { podId: 'uid-1', podNs: 'default', podName: 'vm', ...desc } }));

  it('a good add decodes', () => {
    expect(decodeGetFDPayload(add({})).podNetworkDesc.podName).toBe('vm');
  });

  it.each([
    [
      { podName: 'vm;K8S_POD_NAMESPACE=x' },
      /podNetworkDesc\.podName is not a DNS-1123 subdomain.*CNI_ARGS cannot carry/,
    ],
    [{ podNs: 'Kube_System' }, /podNetworkDesc\.podNs is not a DNS-1123 label/],
    [{ podId: 'a\u0000' }, /podNetworkDesc\.podId has characters outside/],
  ])('add %j is refused, naming the field', (desc, msg) => {
    expect(() => decodeGetFDPayload(add(desc))).toThrow(msg);
  });

  it('recover checks the same fields', () => {
    const buf = Buffer.from(
      JSON.stringify({
        podNetworkDesc: { podId: 'u', podNs: 'NS', podName: 'vm' },
        csn: { Result: null, NsPath: '/x', Interfaces: [] },
      }),
    );
    expect(() => decodeRecoverPayload(buf)).toThrow(/podNetworkDesc\.podNs is not a DNS-1123 label/);
  });
});

describe('error replies', () => {
  it('escape control characters, so a reply cannot carry a forged line', () => {
    const frame = encodeError('plugin said: boom\n{"level":50}\u001b[31m');
    const body = frame
      .subarray(frame.length - Buffer.byteLength('plugin said: boom\\n{"level":50}\\x1b[31m'))
      .toString();
    expect(body).toBe('plugin said: boom\\n{"level":50}\\x1b[31m');
    expect(frame.includes(0x0a)).toBe(false);
  });
});

describe('request DNS is checked when the request is decoded (before any pod network is built)', () => {
  const add = (DNS: object): Buffer =>
    Buffer.from(JSON.stringify({ podNetworkDesc: { podId: 'u', podNs: 'default', podName: 'vm', DNS } }));
  it('accepts a Kubernetes DNS config', () => {
    const d = decodeGetFDPayload(
      add({
        nameservers: ['10.96.0.10'],
        search: ['default.svc.cluster.local', 'svc.cluster.local'],
        options: ['ndots:5'],
      }),
    );
    expect(d.podNetworkDesc.DNS?.search).toHaveLength(2);
  });
  it.each([
    [
      { search: ['has space.example'] },
      /podNetworkDesc\.DNS\.search\[0\] search domain "has space\.example": bad label/,
    ],
    [{ search: [`${'a'.repeat(64)}.example`] }, /64 bytes, at most 63/],
    [{ domain: `bad_.${'x'.repeat(300)}` }, /podNetworkDesc\.DNS\.domain domain name/],
    [{ nameservers: ['not-an-ip'] }, /podNetworkDesc\.DNS\.nameservers\[0\]/],
  ])('refuses %j with the DHCP lease message', (dns, msg) => {
    expect(() => decodeGetFDPayload(add(dns))).toThrow(msg);
  });
});
