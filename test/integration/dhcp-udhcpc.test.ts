// The DHCP server against a real client (busybox udhcpc) across a real bridge and veth.
// netns A is the "pod": bridges vmd<rand>[12] with 169.254.254.2/24, each with a veth port. netns B1/B2 are
// "guests" holding the other veth ends as eth0 with the lease's MAC.
import { randomBytes } from 'node:crypto';
import { chmodSync, existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa, type ResultPromise } from 'execa';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { native, type RecvFrameResult, type RecvFromResult } from '../../src/native.js';
import type { DhcpLease } from '../../src/dhcp/lease.js';
import { decodeClasslessRoutes } from '../../src/dhcp/options.js';
import {
  chaddrMac,
  decodePacket,
  type DhcpOption,
  type DhcpPacket,
  encodePacket,
  getOption,
  macToBytes,
  MessageType,
  messageType,
  Opt,
  optionIp,
} from '../../src/dhcp/packet.js';
import { answer, DhcpServer } from '../../src/dhcp/server.js';
import { buildOptions } from '../../src/dhcp/options.js';

const SFX = randomBytes(3).toString('hex');
const NS_A = `vmdA${SFX}`;
const NS_B1 = `vmdB1${SFX}`;
const NS_B2 = `vmdB2${SFX}`;
const BR1 = `vmd${SFX}1`;
const BR2 = `vmd${SFX}2`;
const VETH1 = `vmv${SFX}1`;
const VETH2 = `vmv${SFX}2`;
const SERVER_IP = '169.254.254.2';
const MAC1 = `02:5a:${SFX.slice(0, 2)}:${SFX.slice(2, 4)}:${SFX.slice(4, 6)}:01`;
const MAC2 = `02:5a:${SFX.slice(0, 2)}:${SFX.slice(2, 4)}:${SFX.slice(4, 6)}:02`;
const nsPath = (ns: string) => `/var/run/netns/${ns}`;

const lease1: DhcpLease = {
  mac: MAC1.toUpperCase(),
  ip: '10.1.90.5',
  prefixLength: 24,
  gateway: '10.1.90.1',
  routes: [
    { dst: '0.0.0.0/0', gw: '10.1.90.1' },
    { dst: '10.17.0.0/16', gw: '10.1.90.254' },
  ],
  dns: ['10.96.0.10', '8.8.4.4'],
  search: ['default.svc.cluster.local', 'svc.cluster.local', 'cluster.local'],
  domain: 'cluster.local',
  hostname: 'vm-pod-1',
  mtu: 1450,
  leaseSeconds: 3600,
};
const lease2: DhcpLease = {
  mac: MAC2,
  ip: '192.168.77.9',
  prefixLength: 26,
  gateway: '192.168.77.1',
  routes: [],
  dns: ['192.168.77.53'],
  search: ['example.test'],
  hostname: 'vm-pod-2',
  mtu: 1400,
  leaseSeconds: 86400,
};

async function ip(...args: string[]): Promise<string> {
  return (await execa('ip', args, { timeout: 10_000 })).stdout;
}

/** Polls cond every 50 ms until it holds; fails after timeoutMs (no assertion on the time itself). */
async function waitFor(what: string, cond: () => boolean, timeoutMs = 20_000): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** The first datagram on fd, read when the fd polls readable. */
function nextDatagram(fd: number, timeoutMs = 20_000): Promise<RecvFromResult> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      poller.stop();
      reject(new Error(`no datagram on fd ${fd} within ${timeoutMs} ms`));
    }, timeoutMs);
    const poller = native().pollReadable(fd, (err) => {
      if (err) {
        clearTimeout(timer);
        poller.stop();
        reject(err);
        return;
      }
      const d = native().recvFrom(fd, 2048);
      if (d) {
        clearTimeout(timer);
        poller.stop();
        resolve(d);
      }
    });
  });
}

/** Every frame link `dev` in netns `ns` receives from now until stop(), as a packet socket sees it. */
function capture(ns: string, dev: string): { frames: RecvFrameResult[]; stop(): void } {
  const fd = native().packetSocketInNetns(nsPath(ns), dev, Buffer.from([0x06, 0, 0, 0, 0, 0, 0x04, 0])); // ret #0x40000: all
  const frames: RecvFrameResult[] = [];
  const poller = native().pollReadable(fd, () => {
    for (let f = native().recvFrame(fd, 2048); f; f = native().recvFrame(fd, 2048)) frames.push(f);
  });
  return {
    frames,
    stop() {
      poller.stop();
      native().close(fd);
    },
  };
}

/** An IPv4 UDP frame from `src` to port `dport`. */
const isUdp4 = (f: Buffer, src: string, dport: number): boolean =>
  f.length >= 42 &&
  f.readUInt16BE(12) === 0x0800 &&
  f[23] === 17 &&
  [...f.subarray(26, 30)].join('.') === src &&
  f.readUInt16BE(36) === dport;

// ---- udhcpc with a hook script that records every event's environment ----

let work: string;
const children: ResultPromise[] = [];

function writeScript(dir: string): string {
  const script = join(dir, 'hook.sh');
  writeFileSync(
    script,
    `#!/bin/sh
# udhcpc hook: record the event's environment, then apply the lease like a guest would.
env > "${dir}/$1.$(cat /proc/sys/kernel/random/uuid)"
case "$1" in
  deconfig)
    ip -4 addr flush dev "$interface"
    ip link set dev "$interface" up
    ;;
  bound|renew)
    ip addr replace "$ip/$mask" dev "$interface"
    set -- $staticroutes
    while [ $# -ge 2 ]; do
      if [ "$2" = 0.0.0.0 ]; then ip route replace "$1" dev "$interface"; else ip route replace "$1" via "$2" dev "$interface"; fi
      shift 2
    done
    ;;
esac
exit 0
`,
  );
  chmodSync(script, 0o755);
  return script;
}

function udhcpc(ns: string, dir: string, extra: string[]): ResultPromise {
  const p = execa(
    'ip',
    ['netns', 'exec', ns, 'busybox', 'udhcpc', '-i', 'eth0', '-f', '-n', '-T', '1', '-s', writeScript(dir), ...extra],
    {
      timeout: 40_000,
      reject: false,
      all: true,
    },
  );
  children.push(p);
  return p;
}

function events(dir: string, event: string): Record<string, string>[] {
  return readdirSync(dir)
    .filter((f) => f.startsWith(`${event}.`))
    .map((f) => {
      const env: Record<string, string> = {};
      for (const line of readFileSync(join(dir, f), 'utf8').split('\n')) {
        const i = line.indexOf('=');
        if (i > 0) env[line.slice(0, i)] = line.slice(i + 1);
      }
      return env;
    });
}

function newDir(): string {
  return mkdtempSync(join(work, 'run-'));
}

// ---- a capturing logger ----

function capturingLogger() {
  const lines: Record<string, unknown>[] = [];
  const log = pino(
    { level: 'debug' },
    { write: (s: string) => void lines.push(JSON.parse(s) as Record<string, unknown>) },
  );
  return { log, lines };
}

// ---- hand-built client packets from a socket in a guest netns ----

function clientPacket(mac: string, type: number, ciaddr: string, options: DhcpOption[]): Buffer {
  const chaddr = Buffer.alloc(16);
  macToBytes(mac).copy(chaddr);
  return encodePacket({
    op: 1,
    htype: 1,
    hlen: 6,
    hops: 0,
    xid: randomBytes(4).readUInt32BE(0),
    secs: 0,
    flags: 0,
    ciaddr,
    yiaddr: '0.0.0.0',
    siaddr: '0.0.0.0',
    giaddr: '0.0.0.0',
    chaddr,
    options: [{ code: Opt.MessageType, data: Buffer.from([type]) }, ...options],
  });
}

/** Sends one request from netns ns (eth0, port 68) to dst:67 and returns the decoded reply. */
async function exchange(ns: string, dst: string, req: Buffer): Promise<DhcpPacket> {
  const fd = native().udpSocketInNetns(nsPath(ns), 'eth0', 68);
  try {
    const reply = nextDatagram(fd);
    native().sendTo(fd, req, dst, 67);
    return decodePacket((await reply).data);
  } finally {
    native().close(fd);
  }
}

const servers: DhcpServer[] = [];
function startServer(bridge: string, lease: DhcpLease, log = capturingLogger().log): DhcpServer {
  const s = DhcpServer.start({ nsPath: nsPath(NS_A), bridge, serverIp: SERVER_IP, lease, log });
  servers.push(s);
  return s;
}

async function ours(): Promise<{ netns: string[]; links: string[] }> {
  const netns = (await ip('netns', 'list')).split('\n').filter((l) => l.includes(SFX));
  const links = (await ip('-o', 'link', 'show')).split('\n').filter((l) => l.includes(SFX));
  return { netns, links };
}

beforeAll(async () => {
  work = mkdtempSync(join(tmpdir(), 'vmpod-dhcp-'));
  for (const ns of [NS_A, NS_B1, NS_B2]) await ip('netns', 'add', ns);
  for (const [br, veth, ns, mac] of [
    [BR1, VETH1, NS_B1, MAC1],
    [BR2, VETH2, NS_B2, MAC2],
  ] as const) {
    await ip('-n', NS_A, 'link', 'add', br, 'type', 'bridge');
    await ip('-n', NS_A, 'addr', 'add', `${SERVER_IP}/24`, 'dev', br);
    await ip('-n', NS_A, 'link', 'set', br, 'up');
    await ip('-n', NS_A, 'link', 'add', veth, 'type', 'veth', 'peer', 'name', 'eth0', 'address', mac, 'netns', ns);
    await ip('-n', NS_A, 'link', 'set', veth, 'master', br, 'up');
    await ip('-n', ns, 'link', 'set', 'eth0', 'up');
    await ip('-n', ns, 'link', 'set', 'lo', 'up');
  }
});

afterEach(async () => {
  while (servers.length) servers.pop()!.stop();
  // end only the udhcpc processes this file started, by pid
  for (const c of children.splice(0)) {
    if (c.pid !== undefined && c.exitCode === null) c.kill('SIGTERM');
    await c;
  }
});

afterAll(async () => {
  for (const ns of [NS_A, NS_B1, NS_B2]) await execa('ip', ['netns', 'del', ns], { reject: false, timeout: 10_000 });
  if (work) rmSync(work, { recursive: true, force: true });
  expect(await ours()).toEqual({ netns: [], links: [] });
  for (const ns of [NS_A, NS_B1, NS_B2]) expect(existsSync(nsPath(ns))).toBe(false);
});

describe('DHCP server with busybox udhcpc', () => {
  it('captures a real DISCOVER from udhcpc and decodes it', async () => {
    const fd = native().udpSocketInNetns(nsPath(NS_A), BR1, 67);
    try {
      const got = nextDatagram(fd);
      const client = udhcpc(NS_B1, newDir(), ['-t', '3', '-x', 'hostname:guest1']);
      const d = await got;
      client.kill('SIGTERM');
      await client;
      expect(d.address).toBe('0.0.0.0');
      expect(d.port).toBe(68);
      const p = decodePacket(d.data);
      expect(p.op).toBe(1);
      expect([p.htype, p.hlen]).toEqual([1, 6]);
      expect(chaddrMac(p)).toBe(MAC1);
      expect(messageType(p)).toBe(MessageType.Discover);
      expect(p.ciaddr).toBe('0.0.0.0');
      expect(getOption(p, Opt.HostName)!.toString()).toBe('guest1');
      // busybox sends its MAC as client id (type 1) unless -C, and asks for the usual options
      expect(getOption(p, Opt.ClientId)!.toString('hex')).toBe(`01${MAC1.replace(/:/g, '')}`);
      const prl = [...getOption(p, Opt.ParameterList)!];
      for (const code of [1, 3, 6, 12, 15]) expect(prl).toContain(code);
      // and our pure core answers it with an OFFER for the lease
      const dec = answer(d.data, { lease: lease1, built: buildOptions(lease1, SERVER_IP) });
      expect(dec.kind).toBe('reply');
      if (dec.kind === 'reply') {
        const offer = decodePacket(dec.data);
        expect(messageType(offer)).toBe(MessageType.Offer);
        expect(offer.xid).toBe(p.xid);
        expect(offer.yiaddr).toBe(lease1.ip);
        expect(getOption(offer, Opt.ClientId)!.equals(getOption(p, Opt.ClientId)!)).toBe(true);
      }
    } finally {
      native().close(fd);
    }
  });

  it('gives udhcpc the whole lease: address, mask, router, routes, DNS, domain, search, host name, MTU, lease, server id', async () => {
    const server = startServer(BR1, lease1);
    const dir = newDir();
    const r = await udhcpc(NS_B1, dir, ['-q', '-t', '5']);
    expect(r.exitCode, String(r.all)).toBe(0);
    const [env] = events(dir, 'bound');
    expect(env).toBeDefined();
    expect(env.interface).toBe('eth0');
    expect(env.ip).toBe('10.1.90.5');
    expect(env.subnet).toBe('255.255.255.0');
    expect(env.mask).toBe('24');
    expect(env.router.trim()).toBe('10.1.90.1');
    expect(env.dns.trim().split(/\s+/)).toEqual(['10.96.0.10', '8.8.4.4']);
    expect(env.domain).toBe('cluster.local');
    expect(env.search.trim().split(/\s+/)).toEqual(['default.svc.cluster.local', 'svc.cluster.local', 'cluster.local']);
    expect(env.hostname).toBe('vm-pod-1');
    expect(env.mtu).toBe('1450');
    expect(env.lease).toBe('3600');
    expect(env.serverid).toBe(SERVER_IP);
    // option 121 in wire order: the server's on-link host route first, the default route last
    expect(env.staticroutes.trim()).toBe('169.254.254.2/32 0.0.0.0 10.17.0.0/16 10.1.90.254 0.0.0.0/0 10.1.90.1');
    // one exchange; a client that retransmits its REQUEST on a loaded machine gets its ACK again, never a NAK
    expect(server.stats).toMatchObject({ naks: 0, dropped: 0 });
    expect(server.stats.offers).toBeGreaterThanOrEqual(1);
    expect(server.stats.acks).toBeGreaterThanOrEqual(1);
    // the hook applied the lease in the guest: address and the on-link route to the server id
    expect(await ip('-n', NS_B1, '-4', 'addr', 'show', 'dev', 'eth0')).toContain('10.1.90.5/24');
    expect(await ip('-n', NS_B1, 'route', 'get', SERVER_IP)).toMatch(/169\.254\.254\.2 dev eth0/);
  });

  it('ACKs a unicast renewal sent to the server id (udhcpc SIGUSR1)', async () => {
    const { log, lines } = capturingLogger();
    const server = startServer(BR1, lease1, log);
    const dir = newDir();
    const client = udhcpc(NS_B1, dir, ['-t', '5']);
    // a client that retransmits its REQUEST on a loaded machine gets its ACK again: count none of them exactly
    await waitFor('the first lease', () => events(dir, 'bound').length === 1 && server.stats.acks >= 1);
    expect(client.pid).toBeDefined();
    // what reaches the pod side of the guest's veth: the guest's eth0 has tx checksum offload on (a veth's default),
    // as a virtio-net guest has, so its unicast renewal (an ordinary UDP socket) leaves the checksum to be filled in
    const cap = capture(NS_A, VETH1);
    // and the server's ACK (the pod netns's own UDP, out of the bridge and the veth with tx offload) reaches the
    // guest with its checksum left to fill in, as a virtio-net guest with VIRTIO_NET_F_GUEST_CSUM receives it
    const capGuest = capture(NS_B1, 'eth0');
    process.kill(client.pid!, 'SIGUSR1');
    await waitFor('the renewal', () => events(dir, 'renew').length >= 1);
    cap.stop();
    capGuest.stop();
    const renewal = cap.frames.find((f) => isUdp4(f.data, '10.1.90.5', 67));
    expect(renewal?.csumNotReady, 'the unicast REQUEST arrived with its checksum left to fill in').toBe(true);
    const ack = capGuest.frames.find((f) => isUdp4(f.data, SERVER_IP, 68));
    expect(ack?.csumNotReady, 'the ACK arrived with its checksum left to fill in').toBe(true);
    expect(server.stats.acks).toBeGreaterThanOrEqual(2);
    const [renew] = events(dir, 'renew');
    expect(renew.ip).toBe('10.1.90.5');
    expect(renew.serverid).toBe(SERVER_IP);
    // the renewing REQUEST came from the guest's leased address (unicast with ciaddr, not from 0.0.0.0)
    const acks = lines.filter((l) => l.msg === 'dhcp: ACK');
    expect(acks[0]?.state).toBe('selecting');
    const renewals = acks.filter((l) => l.state === 'renewing/rebinding');
    expect(renewals.length).toBeGreaterThanOrEqual(1);
    expect(acks.every((l) => l.state === 'selecting' || l.state === 'renewing/rebinding')).toBe(true);
    for (const r of renewals) expect(r.from).toBe('10.1.90.5:68');
  });

  it('answers hand-built requests: NAK for a wrong address, ACK for a unicast RENEWING request', async () => {
    const server = startServer(BR1, lease1);
    const nak = await exchange(
      NS_B1,
      '255.255.255.255',
      clientPacket(MAC1, MessageType.Request, '0.0.0.0', [
        { code: Opt.RequestedIp, data: Buffer.from([10, 1, 90, 99]) },
      ]),
    );
    expect(messageType(nak)).toBe(MessageType.Nak);
    expect(nak.yiaddr).toBe('0.0.0.0');
    expect(optionIp(nak, Opt.ServerId)).toBe(SERVER_IP);
    expect(getOption(nak, Opt.Message)!.toString()).toContain('10.1.90.99');
    expect(server.stats.naks).toBe(1);

    // RENEWING: from the leased address, unicast to the server id over the option 121 host route
    await ip('-n', NS_B1, 'addr', 'replace', '10.1.90.5/24', 'dev', 'eth0');
    await ip('-n', NS_B1, 'route', 'replace', `${SERVER_IP}/32`, 'dev', 'eth0');
    const ack = await exchange(NS_B1, SERVER_IP, clientPacket(MAC1, MessageType.Request, '10.1.90.5', []));
    expect(messageType(ack)).toBe(MessageType.Ack);
    expect(ack.yiaddr).toBe('10.1.90.5');
    expect(ack.ciaddr).toBe('10.1.90.5');
    expect(getOption(ack, Opt.LeaseTime)!.readUInt32BE(0)).toBe(3600);
    expect(decodeClasslessRoutes(getOption(ack, Opt.ClasslessRoutes)!)[0]).toEqual({
      dst: SERVER_IP,
      prefix: 32,
      gw: '0.0.0.0',
    });
    expect(server.stats).toMatchObject({ acks: 1, naks: 1 });
  });

  it('runs two servers on two bridges of one pod, each serving its own lease', async () => {
    const s1 = startServer(BR1, lease1);
    const s2 = startServer(BR2, lease2);
    const d1 = newDir();
    const d2 = newDir();
    const [r1, r2] = await Promise.all([udhcpc(NS_B1, d1, ['-q', '-t', '5']), udhcpc(NS_B2, d2, ['-q', '-t', '5'])]);
    expect(r1.exitCode, String(r1.all)).toBe(0);
    expect(r2.exitCode, String(r2.all)).toBe(0);
    const [e1] = events(d1, 'bound');
    const [e2] = events(d2, 'bound');
    expect([e1.ip, e1.hostname, e1.mtu]).toEqual(['10.1.90.5', 'vm-pod-1', '1450']);
    expect([e2.ip, e2.mask, e2.hostname, e2.mtu, e2.search.trim(), e2.dns.trim()]).toEqual([
      '192.168.77.9',
      '26',
      'vm-pod-2',
      '1400',
      'example.test',
      '192.168.77.53',
    ]);
    expect(e2.staticroutes.trim()).toBe('169.254.254.2/32 0.0.0.0 0.0.0.0/0 192.168.77.1');
    // each server saw only its own client (udhcpc sends a second DISCOVER when an OFFER is slow, as on a loaded
    // machine, and each DISCOVER is answered: at least one OFFER each, one ACK each, nothing from the other bridge)
    for (const s of [s1, s2]) {
      expect(s.stats).toMatchObject({ acks: 1, ignored: 0 });
      expect(s.stats.offers).toBeGreaterThanOrEqual(1);
    }
  });

  it('overflows a reply longer than 576 bytes into file and sname (option 52), which udhcpc reads', async () => {
    // 243 bytes of option 119 after compression: with the rest the options need more than the 308-byte field
    const search = Array.from({ length: 8 }, (_, i) => `team${i}-${'x'.repeat(20)}.example.org`);
    const server = startServer(BR1, { ...lease1, search });
    const dir = newDir();
    const r = await udhcpc(NS_B1, dir, ['-q', '-t', '5']);
    expect(r.exitCode, String(r.all)).toBe(0);
    const [env] = events(dir, 'bound');
    expect(env.search.trim().split(/\s+/)).toEqual(search);
    expect(env.hostname).toBe('vm-pod-1');
    expect(env.mtu).toBe('1450');
    expect(server.stats.acks).toBe(1);
    // the same OFFER, computed for a client asking for 576 bytes like udhcpc: option 52 in use, within the limit
    const discover = clientPacket(MAC1, MessageType.Discover, '0.0.0.0', [
      { code: Opt.MaxMessageSize, data: Buffer.from([0x02, 0x40]) },
    ]);
    const dec = answer(discover, {
      lease: { ...lease1, search },
      built: buildOptions({ ...lease1, search }, SERVER_IP),
    });
    if (dec.kind !== 'reply') throw new Error(`expected a reply, got ${JSON.stringify(dec)}`);
    expect(dec.data.length).toBeLessThanOrEqual(548);
    expect(getOption(decodePacket(dec.data), Opt.Overload)).toBeDefined();
  });

  it('INFORM (a client with its own address asking for options only): an ACK with options and no address', async () => {
    const server = startServer(BR1, lease1);
    await ip('-n', NS_B1, 'addr', 'replace', '10.1.90.5/24', 'dev', 'eth0');
    const ack = await exchange(NS_B1, '255.255.255.255', clientPacket(MAC1, MessageType.Inform, '10.1.90.5', []));
    expect(messageType(ack)).toBe(MessageType.Ack);
    expect(ack.yiaddr).toBe('0.0.0.0');
    expect(ack.ciaddr).toBe('10.1.90.5');
    expect(getOption(ack, Opt.LeaseTime)).toBeUndefined();
    expect(getOption(ack, Opt.DnsServers)).toEqual(Buffer.from([10, 96, 0, 10, 8, 8, 4, 4]));
    expect(optionIp(ack, Opt.ServerId)).toBe(SERVER_IP);
    expect(server.stats.acks).toBe(1);
    await ip('-n', NS_B1, 'addr', 'flush', 'dev', 'eth0');
  });

  it('DECLINE from udhcpc -a (another host answers ARP for the address): a warning naming the address and that host, then no offer loop', async () => {
    // the conflicting host: a third netns on the same bridge, holding the lease's address
    const nsC = `vmdC${SFX}`;
    const vethC = `vmc${SFX}1`;
    const macC = `02:5a:${SFX.slice(0, 2)}:${SFX.slice(2, 4)}:${SFX.slice(4, 6)}:03`;
    await ip('netns', 'add', nsC);
    try {
      await ip('-n', NS_A, 'link', 'add', vethC, 'type', 'veth', 'peer', 'name', 'eth0', 'address', macC, 'netns', nsC);
      await ip('-n', NS_A, 'link', 'set', vethC, 'master', BR1, 'up');
      await ip('-n', nsC, 'addr', 'add', '10.1.90.5/24', 'dev', 'eth0');
      await ip('-n', nsC, 'link', 'set', 'eth0', 'up');
      const { log, lines } = capturingLogger();
      const server = startServer(BR1, lease1, log);
      const dir = newDir();
      // -a: ARP-check the offered address before taking it; -A 1: retry one second after a DECLINE
      const p = execa(
        'ip',
        [
          'netns',
          'exec',
          NS_B1,
          'busybox',
          'udhcpc',
          '-i',
          'eth0',
          '-f',
          '-a',
          '-A',
          '1',
          '-T',
          '1',
          '-s',
          writeScript(dir),
        ],
        { reject: false, timeout: 60_000 },
      );
      children.push(p);
      await waitFor(
        'a DECLINE and DISCOVERs after it',
        () => server.stats.declines === 1 && server.stats.ignored >= 2,
        40_000,
      );
      await waitFor(
        'the DECLINE warning',
        () => lines.some((l) => typeof l.msg === 'string' && l.msg.startsWith('dhcp: DECLINE')),
        20_000,
      );
      p.kill('SIGTERM');
      await p;
      const warn = lines.find((l) => typeof l.msg === 'string' && l.msg.startsWith('dhcp: DECLINE'))!;
      expect(warn).toMatchObject({
        level: 40,
        address: '10.1.90.5',
        vmMac: MAC1.toLowerCase(),
        conflictingMac: macC,
        backoffMs: 10_000,
      });
      // the DISCOVERs that followed got no offer: one OFFER, one ACK (the one udhcpc declined), no more
      expect(server.stats).toMatchObject({ offers: 1, acks: 1, declines: 1 });
      expect(events(dir, 'bound')).toEqual([]);
    } finally {
      await execa('ip', ['netns', 'del', nsC], { reject: false, timeout: 10_000 });
    }
  });

  it('answers nothing once stopped, and stop() is idempotent', async () => {
    const server = startServer(BR1, lease1);
    server.stop();
    server.stop();
    expect(server.running).toBe(false);
    expect(server.socketFd).toBe(-1);
    const dir = newDir();
    const r = await udhcpc(NS_B1, dir, ['-q', '-t', '2']);
    expect(r.exitCode).not.toBe(0); // -n: exit with failure when no lease was obtained
    expect(events(dir, 'bound')).toHaveLength(0);
    expect(server.stats).toMatchObject({ offers: 0, acks: 0 });
  });
});
