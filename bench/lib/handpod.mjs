// The baseline pod of the first-answer benches (dhcp-first, dhcp6-first): a netns of the pod network's shape made by
// hand (br0 with a veth and tap0 in it, as tapmanager builds it; no CNI, no tapmanager) and the dnsmasq argv that
// serves the same lease there. The netns goes in cleanup(); dnsmasq is started and stopped by the C helper, by its
// PID. docs/performance.md says how it differs from ours.
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { mustRun, run } from './cleanup.mjs';

/** the VM's MAC on the baseline's side (ours: the one tapmanager's add replies with) */
export const BASE_MAC = '0a:58:0a:f4:07:05';
/** the pod's DNS (add payload and dnsmasq alike): an IPv6 and an IPv4 name server, Kubernetes' search list */
export const POD_DNS = {
  nameservers: ['fd53::53', '10.96.0.10'],
  search: ['default.svc.cluster.local', 'svc.cluster.local'],
};

/**
 * DUID-LL (RFC 8415 11.4) of a MAC, as dnsmasq's `id:` wants it: `00:03:00:01:<mac>` (bench/c/dhcp-first.c sends it)
 */
export const duidLl = (mac) => `00:03:00:01:${mac}`;

/**
 * Makes the netns and returns { nsPath, mac, argv }. w: the podWorld (its subnet, subnet6, dir).
 * ipv4: serve DHCPv4 (the lease of dhcp-first); ipv6: serve RA + stateful DHCPv6 of the world's IPv6 prefix.
 * IPv6 needs, for dnsmasq, an address in the prefix on br0 (`<prefix>::2/64`, a global one: ours has only the
 * link-local) beside the link-local `fe80::2/64`; both without DAD (ours: `nodad` too), forwarding on (as ours).
 */
export async function handMadePod(cleanup, w, { ipv4 = true, ipv6 = false, dns = false } = {}) {
  const ns = `vmpbh-${randomBytes(3).toString('hex')}`;
  await mustRun('ip', ['netns', 'add', ns]);
  cleanup.push(`delete netns ${ns}`, () => mustRun('ip', ['netns', 'del', ns]));
  const lines = [
    'link set dev lo up',
    'link add name br0 type bridge ageing_time 0',
    ...(ipv4 ? ['addr add 169.254.254.2/24 dev br0'] : []),
    ...(ipv6
      ? [
          'link set dev br0 addrgenmode none',
          'addr add fe80::2/64 dev br0 nodad',
          `addr add ${w.prefix6}:2/64 dev br0 nodad`,
        ]
      : []),
    'link add name virtlet-eth0 type veth peer name vmpbpeer0',
    'link set dev virtlet-eth0 master br0',
    'tuntap add dev tap0 mode tap',
    'link set dev tap0 master br0',
    'link set dev virtlet-eth0 up',
    'link set dev vmpbpeer0 up',
    'link set dev tap0 up',
    'link set dev br0 up',
  ];
  const r = await run('ip', ['-n', ns, '-batch', '-'], { input: `${lines.join('\n')}\n` });
  if (r.code !== 0) throw new Error(`hand-made pod: ${r.stderr}`);
  if (ipv6) await mustRun('ip', ['netns', 'exec', ns, 'sysctl', '-q', '-w', 'net.ipv6.conf.all.forwarding=1']);
  const mac = BASE_MAC;
  const argv = [
    '/usr/sbin/dnsmasq',
    '--keep-in-foreground',
    '--conf-file=/dev/null',
    '--port=0',
    '--no-resolv',
    '--no-hosts',
    `--log-facility=${join(w.dir, 'dnsmasq.log')}`,
    `--pid-file=${join(w.dir, 'dnsmasq.pid')}`,
    '--leasefile-ro',
    '--no-ping',
    '--interface=br0',
    '--bind-interfaces',
    '--except-interface=lo',
  ];
  if (ipv4) {
    const prefix = w.subnet.split('.').slice(0, 3).join('.');
    const ip = `${prefix}.250`;
    argv.push(
      `--shared-network=br0,${prefix}.0`,
      `--dhcp-range=${ip},static,255.255.252.0,86400`,
      `--dhcp-host=${mac},${ip},bench-vm`,
      `--dhcp-option=option:router,${prefix}.1`,
      `--dhcp-option=121,0.0.0.0/0,${prefix}.1`,
      '--dhcp-option=option:mtu,1500',
    );
    if (dns)
      argv.push(
        `--dhcp-option=option:dns-server,${POD_DNS.nameservers.filter((s) => !s.includes(':')).join(',')}`,
        `--dhcp-option=option:domain-search,${POD_DNS.search.join(',')}`,
      );
  }
  if (ipv6) {
    // stateful DHCPv6 of the one address given by --dhcp-host (as ours: the CNI address, nothing else),
    // RAs with M and O
    argv.push(
      '--enable-ra',
      `--dhcp-range=${w.prefix6}:,static,64,86400`,
      `--dhcp-host=id:${duidLl(mac)},[${w.prefix6}:fa],bench-vm`,
    );
    if (dns)
      argv.push(
        `--dhcp-option=option6:dns-server,${POD_DNS.nameservers
          .filter((s) => s.includes(':'))
          .map((s) => `[${s}]`)
          .join(',')}`,
        `--dhcp-option=option6:domain-search,${POD_DNS.search.join(',')}`,
      );
  }
  return { nsPath: `/var/run/netns/${ns}`, mac, argv };
}
