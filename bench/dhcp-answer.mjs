#!/usr/bin/env node
// DHCP answer time, DISCOVER -> OFFER, of the project's DhcpServer (dist/dhcp, i.e. after `npm run build`), with
// dnsmasq serving the same lease on the same bridge as the baseline. Root only.
//   node bench/dhcp-answer.mjs [--count N] [--warmup N] [--log-level info|silent|...]
//
// Topology, made per run with unique names and removed at the end (also on error, SIGINT, SIGTERM, time bound):
//   netns vmbp<hex> ("pod"):   lo up; br0 (mtu 1450, ageing 0, 169.254.254.2/24) <- port virtlet-eth0 (veth)
//   netns vmbg<hex> ("guest"): eth0 = the veth's peer, with the lease's MAC (the VM's NIC in a real pod)
// The client is a UDP socket made by the addon inside the guest netns (udpSocketInNetns(guest, 'eth0', 68)). Each
// exchange builds a DISCOVER with the project's encoder (src/dhcp/packet.ts; busybox udhcpc's options, broadcast
// flag set since the socket cannot receive a unicast to an address eth0 does not have), takes
// process.hrtime.bigint(), sends it to 255.255.255.255:67, and takes the time again when the OFFER with its xid has
// been read (uv_poll wake-up + recvfrom). One exchange at a time.
//
// Measurement sets, in this order (one server at a time on the bridge):
//   vmpod           DhcpServer in a child node process, tapmanager's logger at --log-level (default info, as
//                   tapmanager) writing to a file: what a pod gets
//   vmpod-inprocess the same server in this process (client and server share one event loop)
//   dnsmasq         dnsmasq-base, same lease and options, its default DHCP logging to a file
//   answer-only     the server's pure answer() on the same DISCOVER bytes, no sockets: the share of the time that
//                   is our code rather than the kernel and the event loop
// Output: one JSON line per set, a JSON summary line (with the ratio vmpod/dnsmasq), a human summary.
// Bounded: everything is torn down and the process exits 1 if it still runs after 55 s.
import { randomBytes, randomInt } from 'node:crypto';
import { spawn } from 'node:child_process';
import { mkdtempSync, openSync, closeSync, readFileSync, rmSync, existsSync } from 'node:fs';
import { cpus, release, tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { Cleanup, mustRun, run, stopChild } from './lib/cleanup.mjs';
import { importDist, repo } from './lib/dist.mjs';
import { ratio, summarize } from './lib/stats.mjs';
import { figure } from './lib/figure.mjs';

const samplesOf = {};

const BENCH = 'dhcp-answer';
const BOUND_MS = 55_000;
const SERVER_IP = '169.254.254.2';
const BRIDGE = 'br0';
const POD_VETH = 'virtlet-eth0';
const GUEST_IF = 'eth0';
const MTU = 1450;
/** per-exchange wait for the OFFER; a lost exchange is counted, more than 5% lost fails the set */
const EXCHANGE_TIMEOUT_MS = 1_000;
const ANSWER_ONLY_ITERATIONS = 5_000;

// ---- what the pod looks like to leaseFromCni: a bridge-plugin CNI result and Kubernetes' pod DNS config ----

function cniFixture(podNsPath, mac) {
  return {
    result: {
      cniVersion: '1.0.0',
      interfaces: [
        { name: 'cni0', mac: '0a:58:0a:f4:07:01' },
        { name: 'vethb3f1c2a9', mac: '6e:1c:3f:aa:20:01' },
        { name: POD_VETH, mac, sandbox: podNsPath, mtu: MTU },
      ],
      ips: [{ address: '10.244.7.5/24', gateway: '10.244.7.1', interface: 2 }],
      routes: [{ dst: '0.0.0.0/0' }],
      dns: {},
    },
    podDns: {
      nameservers: ['10.96.0.10'],
      search: ['default.svc.cluster.local', 'svc.cluster.local', 'cluster.local'],
      options: ['ndots:5'],
    },
    podName: 'bench-vm',
  };
}

// ---- the topology ----

async function makeTopology(cleanup, sfx, mac) {
  const pod = `vmbp${sfx}`;
  const guest = `vmbg${sfx}`;
  for (const ns of [pod, guest]) {
    await mustRun('ip', ['netns', 'add', ns]);
    cleanup.push(`delete netns ${ns}`, () => mustRun('ip', ['netns', 'del', ns]));
  }
  // one ip -batch per netns; the veth is made inside the pod netns, so no name ever exists in the host's
  await mustRun('ip', ['-n', pod, '-batch', '-'], {
    input: [
      'link set dev lo up',
      `link add name ${BRIDGE} mtu ${MTU} type bridge ageing_time 0`,
      `addr add ${SERVER_IP}/24 dev ${BRIDGE}`,
      `link add name ${POD_VETH} mtu ${MTU} type veth peer name ${GUEST_IF} mtu ${MTU} netns ${guest}`,
      `link set dev ${POD_VETH} address ${randomLaaMac()} master ${BRIDGE} up`,
      `link set dev ${BRIDGE} up`,
      '',
    ].join('\n'),
  });
  await mustRun('ip', ['-n', guest, '-batch', '-'], {
    input: ['link set dev lo up', `link set dev ${GUEST_IF} address ${mac} up`, ''].join('\n'),
  });
  return { pod, guest, podPath: `/var/run/netns/${pod}`, guestPath: `/var/run/netns/${guest}` };
}

function randomLaaMac() {
  return ['02', ...[...randomBytes(5)].map((b) => b.toString(16).padStart(2, '0'))].join(':');
}

// ---- the client: a UDP socket on the guest's eth0, one exchange at a time ----

class Probe {
  constructor(native, pkt, nsPath) {
    this.native = native;
    this.pkt = pkt;
    this.pending = undefined;
    this.stray = 0;
    this.fd = native.udpSocketInNetns(nsPath, GUEST_IF, 68);
    this.poller = native.pollReadable(this.fd, (err) => this.onReadable(err));
  }

  onReadable(err) {
    if (err) {
      this.pending?.reject(err);
      return;
    }
    for (;;) {
      const d = this.native.recvFrom(this.fd, 2048);
      const t1 = process.hrtime.bigint();
      if (!d) return;
      const p = this.pending;
      let reply;
      try {
        reply = this.pkt.decodePacket(d.data);
      } catch {
        this.stray++;
        continue;
      }
      if (!p || reply.xid !== p.xid || reply.op !== 2 || this.pkt.messageType(reply) !== this.pkt.MessageType.Offer) {
        this.stray++;
        continue;
      }
      this.pending = undefined;
      clearTimeout(p.timer);
      p.resolve({ ns: t1 - p.t0, reply, bytes: d.data.length });
    }
  }

  /** one DISCOVER -> OFFER; resolves { ns, reply, bytes } or null after timeoutMs */
  exchange(buf, xid, timeoutMs) {
    return new Promise((resolve, reject) => {
      const p = { xid, resolve, reject, t0: 0n, timer: undefined };
      p.timer = setTimeout(() => {
        if (this.pending === p) this.pending = undefined;
        resolve(null);
      }, timeoutMs);
      this.pending = p;
      p.t0 = process.hrtime.bigint();
      this.native.sendTo(this.fd, buf, '255.255.255.255', 67);
    });
  }

  close() {
    this.poller?.stop();
    this.poller = undefined;
    if (this.fd >= 0) this.native.close(this.fd);
    this.fd = -1;
  }
}

/** busybox udhcpc's DISCOVER (client id, max size 576, vendor class, a parameter list asking for all we serve) */
function discover(pkt, mac, xid) {
  const { Opt, MessageType } = pkt;
  const hw = pkt.macToBytes(mac);
  const chaddr = Buffer.alloc(16);
  hw.copy(chaddr);
  const u16 = (n) => Buffer.from([n >> 8, n & 0xff]);
  return pkt.encodePacket({
    op: 1,
    htype: 1,
    hlen: 6,
    hops: 0,
    xid,
    secs: 0,
    flags: pkt.BROADCAST_FLAG,
    ciaddr: '0.0.0.0',
    yiaddr: '0.0.0.0',
    siaddr: '0.0.0.0',
    giaddr: '0.0.0.0',
    chaddr,
    options: [
      { code: Opt.MessageType, data: Buffer.from([MessageType.Discover]) },
      { code: Opt.ClientId, data: Buffer.concat([Buffer.from([1]), hw]) },
      { code: Opt.MaxMessageSize, data: u16(576) },
      { code: 60, data: Buffer.from('udhcp 1.36.1', 'ascii') },
      { code: Opt.ParameterList, data: Buffer.from([1, 3, 6, 12, 15, 26, 28, 42, 51, 54, 58, 59, 119, 121]) },
    ],
  });
}

/**
 * Waits for the server to answer (up to ~5 s, DISCOVERs every 100 ms), runs `warmup` unmeasured exchanges, then
 * `count` measured ones. Every OFFER is checked: yiaddr is the lease's address, option 54 is the bridge's.
 */
async function measure(set, probe, pkt, lease, count, warmup) {
  const { Opt } = pkt;
  const one = (timeoutMs) => {
    const xid = randomInt(0, 2 ** 32);
    return probe.exchange(discover(pkt, lease.mac, xid), xid, timeoutMs);
  };
  // the first answered DISCOVER is the cold one: for our server, code not yet compiled by V8's JIT
  let first = null;
  for (let i = 0; i < 50 && !first; i++) first = await one(100);
  if (!first) throw new Error(`${set}: no OFFER within 5 s: the server is not answering`);
  for (let i = 0; i < warmup; i++) await one(EXCHANGE_TIMEOUT_MS);

  const samplesUs = [];
  let lost = 0;
  let bad = 0;
  for (let i = 0; i < count; i++) {
    const r = await one(EXCHANGE_TIMEOUT_MS);
    if (!r) {
      lost++;
      if (lost > count / 20)
        throw new Error(`${set}: ${lost} of ${i + 1} DISCOVERs got no OFFER within ${EXCHANGE_TIMEOUT_MS} ms`);
      continue;
    }
    if (r.reply.yiaddr !== lease.ip || pkt.optionIp(r.reply, Opt.ServerId) !== SERVER_IP) bad++;
    samplesUs.push(Number(r.ns) / 1000);
  }
  return {
    samplesUs,
    lost,
    bad,
    firstUs: Number(first.ns) / 1000,
    offerBytes: first.bytes,
    options: first.reply.options.map((o) => o.code),
    firstReply: first.reply,
  };
}

function report(set, what, m, extra = {}) {
  samplesOf[set] = m.samplesUs;
  const line = {
    bench: BENCH,
    set,
    what,
    unit: 'us',
    ...summarize(m.samplesUs),
    firstUs: Number(m.firstUs.toFixed(1)),
    lost: m.lost,
    badOffers: m.bad,
    offerBytes: m.offerBytes,
    offerOptions: m.options,
    ...extra,
  };
  console.log(JSON.stringify(line));
  return line;
}

// ---- the servers ----

/** DhcpServer in a child node process (bench/lib/dhcp-server-child.mjs); resolves once it is listening */
async function startChildServer(cleanup, cfg, logFile) {
  const logFd = openSync(logFile, 'a');
  const child = spawn(process.execPath, [join(repo, 'bench', 'lib', 'dhcp-server-child.mjs'), JSON.stringify(cfg)], {
    stdio: ['pipe', 'pipe', logFd],
  });
  closeSync(logFd);
  cleanup.push(`stop the DHCP server child (pid ${child.pid})`, () => stopChild(child));
  let ready = () => {};
  await new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(
      () => reject(new Error(`DhcpServer child: not ready after 10 s; log ${tail(logFile)}`)),
      10_000,
    );
    child.stdout.on('data', (b) => {
      out += b;
      if (out.includes('ready')) {
        clearTimeout(timer);
        resolve();
      }
    });
    const onExit = (code, sig) => {
      clearTimeout(timer);
      reject(new Error(`DhcpServer child exited (${code ?? sig}) before it was ready; log ${tail(logFile)}`));
    };
    child.once('exit', onExit);
    child.once('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    ready = () => child.off('exit', onExit);
  });
  ready();
  return child;
}

/** dnsmasq serving the same lease (address, mask, router, option 121 routes, DNS, search, hostname, MTU, lease time) */
async function startDnsmasq(cleanup, topo, lease, built, dir) {
  const mask = intToIp(lease.prefixLength === 0 ? 0 : (0xffffffff << (32 - lease.prefixLength)) >>> 0);
  const net = intToIp((ipToInt(lease.ip) & ipToInt(mask)) >>> 0);
  const router = built.options.some((o) => o.code === 3) ? [`--dhcp-option=option:router,${lease.gateway}`] : [];
  const routes121 = built.routes.flatMap((r) => [`${r.dst}/${r.prefix}`, r.gw]).join(',');
  const args = [
    'netns',
    'exec',
    topo.pod,
    'dnsmasq',
    '--no-daemon',
    '--conf-file=/dev/null',
    '--port=0',
    '--no-resolv',
    '--no-hosts',
    `--log-facility=${join(dir, 'dnsmasq.log')}`,
    `--pid-file=${join(dir, 'dnsmasq.pid')}`,
    '--leasefile-ro',
    '--no-ping',
    `--interface=${BRIDGE}`,
    '--bind-interfaces',
    '--except-interface=lo',
    // the bridge only has 169.254.254.2/24 (the server id, as for our server): shared-network lets dnsmasq serve
    // the pod's subnet from it
    `--shared-network=${BRIDGE},${net}`,
    `--dhcp-range=${lease.ip},static,${mask},${lease.leaseSeconds}`,
    `--dhcp-host=${lease.mac},${lease.ip},${lease.hostname}`,
    ...router,
    `--dhcp-option=121,${routes121}`,
    `--dhcp-option=option:dns-server,${lease.dns.join(',')}`,
    `--dhcp-option=option:domain-search,${lease.search.join(',')}`,
    ...(lease.domain ? [`--dhcp-option=option:domain-name,${lease.domain}`] : []),
    `--dhcp-option=option:mtu,${lease.mtu}`,
  ];
  // `ip netns exec` execs dnsmasq in place: the child's PID is dnsmasq's, and that is the PID we stop
  const child = spawn('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (b) => (stderr = (stderr + b).slice(-4000)));
  cleanup.push(`stop dnsmasq (pid ${child.pid})`, () => stopChild(child));
  const exited = new Promise((resolve) => child.once('exit', (code, sig) => resolve(code ?? sig)));
  return { child, args: args.slice(3), exited, stderr: () => stderr };
}

/**
 * Do both servers hand out the same lease? yiaddr and every option both sent, byte for byte, except those that
 * legitimately differ: 51/58/59 are equal by configuration, 61 is our RFC 6842 echo; 119 may be compressed differently.
 */
function compareOffers(a, b) {
  const differ = [];
  if (a.yiaddr !== b.yiaddr) differ.push(`yiaddr ${a.yiaddr} vs ${b.yiaddr}`);
  for (const o of a.options) {
    const other = b.options.find((x) => x.code === o.code);
    if (other && !other.data.equals(o.data) && o.code !== 119)
      differ.push(`option ${o.code}: ${o.data.toString('hex')} vs ${other.data.toString('hex')}`);
  }
  const onlyOurs = a.options.filter((o) => !b.options.some((x) => x.code === o.code)).map((o) => o.code);
  const onlyTheirs = b.options.filter((o) => !a.options.some((x) => x.code === o.code)).map((o) => o.code);
  return { differ, onlyOurs, onlyTheirs };
}

function ipToInt(s) {
  return s.split('.').reduce((n, o) => ((n << 8) | Number(o)) >>> 0, 0);
}
function intToIp(n) {
  return [24, 16, 8, 0].map((s) => (n >>> s) & 0xff).join('.');
}

function tail(file, n = 2000) {
  try {
    return JSON.stringify(readFileSync(file, 'utf8').slice(-n));
  } catch {
    return '(no log)';
  }
}

// ---- main ----

async function main() {
  const { values } = parseArgs({
    options: {
      count: { type: 'string', default: '300' },
      warmup: { type: 'string', default: '20' },
      'log-level': { type: 'string', default: 'info' },
    },
  });
  const count = Number(values.count);
  const warmup = Number(values.warmup);
  if (!Number.isInteger(count) || count < 10 || count > 5000)
    throw new Error(`--count ${values.count}: expected 10 to 5000`);
  if (!Number.isInteger(warmup) || warmup < 0 || warmup > 1000)
    throw new Error(`--warmup ${values.warmup}: expected 0 to 1000`);
  const logLevel = values['log-level'];
  if (process.getuid?.() !== 0) throw new Error('needs root (network namespaces, veth, bridge)');

  // the modules themselves, not src/dhcp/index.ts (which exports only what tapmanager imports)
  const dhcp = {
    ...(await importDist('dhcp/lease.js')),
    ...(await importDist('dhcp/options.js')),
    ...(await importDist('dhcp/server.js')),
  };
  const pkt = await importDist('dhcp/packet.js');
  const { native } = await importDist('native.js');
  const { isLogLevel } = await importDist('log.js');
  if (!isLogLevel(logLevel)) throw new Error(`--log-level ${logLevel}: not a pino level`);
  const { pino } = await import('pino');
  const addon = native();

  const cleanup = new Cleanup();
  cleanup.installGuards(BENCH, BOUND_MS);
  const t0 = performance.now();
  const sfx = randomBytes(3).toString('hex');
  const dir = mkdtempSync(join(tmpdir(), `vmpod-${BENCH}-`));
  cleanup.push(`remove ${dir}`, () => rmSync(dir, { recursive: true, force: true }));
  const names = { netns: [`vmbp${sfx}`, `vmbg${sfx}`], pids: [] };
  const lines = {};
  try {
    // the bridge CNI plugin's MAC for 10.244.7.5 (0a:58 + the address)
    const mac = '0a:58:0a:f4:07:05';
    const topo = await makeTopology(cleanup, sfx, mac);
    const fx = cniFixture(topo.podPath, mac);
    const lease = dhcp.leaseFromCni({
      result: fx.result,
      ifIndex: 2,
      podDns: fx.podDns,
      podName: fx.podName,
      mtu: MTU,
      mac,
    });
    const built = dhcp.buildOptions(lease, SERVER_IP);

    const probe = new Probe(addon, pkt, topo.guestPath);
    cleanup.push('close the client socket', () => probe.close());

    // 1. our server in its own process, as in tapmanager
    const serverCfg = { nsPath: topo.podPath, bridge: BRIDGE, serverIp: SERVER_IP, lease, logLevel };
    const child = await startChildServer(cleanup, serverCfg, join(dir, 'vmpod.log'));
    names.pids.push(child.pid);
    const mv = await measure('vmpod', probe, pkt, lease, count, warmup);
    const vmpodReply = mv.firstReply;
    lines.vmpod = report('vmpod', `DhcpServer (dist/) in a child node process, tapmanager logger at ${logLevel}`, mv);
    await stopChild(child);

    // 2. our server in this process
    const inLog = pino(
      { name: 'tapmanager', level: logLevel, base: { pid: process.pid }, timestamp: pino.stdTimeFunctions.isoTime },
      pino.destination({ dest: join(dir, 'inprocess.log'), sync: true }),
    );
    const server = dhcp.DhcpServer.start({
      nsPath: topo.podPath,
      bridge: BRIDGE,
      serverIp: SERVER_IP,
      lease,
      log: inLog,
    });
    cleanup.push('stop the in-process DhcpServer', () => server.stop());
    lines.inprocess = report(
      'vmpod-inprocess',
      "DhcpServer (dist/) in the client's process and event loop",
      await measure('vmpod-inprocess', probe, pkt, lease, count, warmup),
      { stats: { ...server.stats } },
    );
    server.stop();

    // 3. dnsmasq, the same lease, on the same bridge, with our server stopped
    const dm = await startDnsmasq(cleanup, topo, lease, built, dir);
    names.pids.push(dm.child.pid);
    const dmVersion = (await run('dnsmasq', ['--version'])).stdout.split('\n')[0];
    let m;
    try {
      m = await Promise.race([
        measure('dnsmasq', probe, pkt, lease, count, warmup),
        dm.exited.then((c) =>
          Promise.reject(new Error(`dnsmasq exited (${c}): ${dm.stderr()} ${tail(join(dir, 'dnsmasq.log'))}`)),
        ),
      ]);
    } catch (e) {
      throw new Error(`${e.message}; dnsmasq ${dm.args.join(' ')}`, { cause: e });
    }
    const pidFile = join(dir, 'dnsmasq.pid');
    const filePid = existsSync(pidFile) ? Number(readFileSync(pidFile, 'utf8').trim()) : undefined;
    if (filePid !== undefined && filePid !== dm.child.pid)
      console.error(`${BENCH}: warning: dnsmasq's pid file says ${filePid}, we spawned ${dm.child.pid}`);
    lines.dnsmasq = report('dnsmasq', `${dmVersion}, --no-ping, default DHCP logging to a file`, m);
    lines.sameLease = compareOffers(vmpodReply, m.firstReply);
    await stopChild(dm.child);

    // 4. the pure part of our answer, same DISCOVER bytes
    const ctx = { lease, built };
    const buf = discover(pkt, lease.mac, 0x12345678);
    for (let i = 0; i < 500; i++) dhcp.answer(buf, ctx);
    const pure = [];
    for (let i = 0; i < ANSWER_ONLY_ITERATIONS; i++) {
      const a = process.hrtime.bigint();
      const d = dhcp.answer(buf, ctx);
      pure.push(Number(process.hrtime.bigint() - a) / 1000);
      if (d.kind !== 'reply') throw new Error(`answer-only: answer() said ${d.kind}: ${d.why}`);
    }
    lines.pure = {
      bench: BENCH,
      set: 'answer-only',
      what: 'dhcp answer(): decode DISCOVER, order options, encode OFFER; no sockets',
      unit: 'us',
      ...summarize(pure, 2),
    };
    console.log(JSON.stringify(lines.pure));
  } finally {
    const failures = await cleanup.run();
    const ns = (await run('ip', ['netns', 'list'])).stdout;
    const leftNs = names.netns.filter((n) => new RegExp(`^${n}\\b`, 'm').test(ns));
    const leftPids = names.pids.filter((pid) => {
      try {
        process.kill(pid, 0);
        return true;
      } catch {
        return false;
      }
    });
    lines.leaked = { netns: leftNs, pids: leftPids, cleanupFailures: failures.length };
    if (leftNs.length + leftPids.length > 0) console.error(`${BENCH}: left behind: ${JSON.stringify(lines.leaked)}`);
  }

  const v = lines.vmpod;
  const d = lines.dnsmasq;
  const summary = {
    bench: BENCH,
    summary: true,
    count,
    warmup,
    logLevel,
    node: process.version,
    kernel: release(),
    cpus: cpus().length,
    vmpodMedianUs: v.median,
    vmpodP99Us: v.p99,
    vmpodFirstUs: v.firstUs,
    inprocessMedianUs: lines.inprocess.median,
    dnsmasqMedianUs: d.median,
    dnsmasqP99Us: d.p99,
    answerOnlyMedianUs: lines.pure.median,
    ratioMedian: ratio(v.median, d.median),
    ratioP99: ratio(v.p99, d.p99),
    sameLease: lines.sameLease,
    leaked: lines.leaked.netns.length + lines.leaked.pids.length,
    wallMs: Math.round(performance.now() - t0),
  };
  console.log(JSON.stringify(summary));
  figure('dhcp-exchange', 'us', samplesOf.vmpod, samplesOf.dnsmasq, {
    what: 'DISCOVER -> OFFER, warm, our server in a child process',
    baselineWhat: 'dnsmasq on the same bridge',
  });
  const us = (l) =>
    `median ${l.median} us, p99 ${l.p99} (min ${l.min}, max ${l.max}, mean ${l.mean}; first, cold: ${l.firstUs})`;
  console.log(
    [
      `${BENCH}: DISCOVER -> OFFER over a veth + bridge, ${count} exchanges per server after ${warmup} warm-up, ${summary.cpus} CPUs, node ${process.version}`,
      `  vmpod (child process) ${us(v)}`,
      `  vmpod (in-process)    ${us(lines.inprocess)}`,
      `  dnsmasq               ${us(d)}`,
      `  ours/dnsmasq: median x${summary.ratioMedian}, p99 x${summary.ratioP99}; answer() alone median ${lines.pure.median} us`,
      `  same lease: ${lines.sameLease.differ.length === 0 ? 'yes' : `NO: ${lines.sameLease.differ.join('; ')}`} (options only ours: ${lines.sameLease.onlyOurs.join(',') || '-'}, only dnsmasq's: ${lines.sameLease.onlyTheirs.join(',') || '-'})`,
      `  lost ${v.lost}/${lines.inprocess.lost}/${d.lost}, bad OFFERs ${v.badOffers}/${lines.inprocess.badOffers}/${d.badOffers}, left behind ${summary.leaked}, ${summary.wallMs} ms`,
    ].join('\n'),
  );
  if (summary.leaked > 0) process.exitCode = 1;
}

main().then(
  () => process.exit(process.exitCode ?? 0),
  (e) => {
    console.error(`${BENCH}: ${e?.stack ?? e}`);
    process.exit(1);
  },
);
