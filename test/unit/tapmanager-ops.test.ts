// The pure parts of the operations surface: metrics exposition, sd_notify config, --http-listen, tapctl's table.
import { describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import { createMetrics } from '../../src/tapmanager/metrics.js';
import { notifyConfig, SystemdNotifier } from '../../src/tapmanager/notify.js';
import { parseListen } from '../../src/cliargs.js';
import { parseConfig } from '../../src/tapmanager/config.js';
import { podTable, shortAge } from '../../src/client/podtable.js';
import { silentLogger } from '../../src/log.js';
import type { PluginExec } from '../../src/cni/index.js';
import type { PodSummary } from '../../src/protocol/status.js';

/** One sample's value from the text exposition. */
function sample(text: string, name: string, labels = ''): number | undefined {
  const line = text.split('\n').find((l) => l.startsWith(`${name}${labels ? `{${labels}}` : ''} `));
  return line === undefined ? undefined : Number(line.split(' ').pop());
}

describe('metrics', () => {
  it('counts requests, DHCP packets, leases, restore and pods by state under vmpod_, with build_info and the standard process metrics', async () => {
    let pods: Record<string, number> = { ready: 2, corrupt: 1 };
    const m = createMetrics(() => pods);
    m.hooks.onRequest('add', 'ok', 0.3);
    m.hooks.onRequest('add', 'cni', 0.02);
    m.hooks.onRequest('get', 'ok', 0.002);
    m.hooks.onDhcpPacket('received', 'discover');
    m.hooks.onDhcpPacket('sent', 'offer');
    m.hooks.onDhcpLease();
    m.hooks.onRestored(1.5);
    const { contentType, body } = await m.render();
    expect(contentType).toMatch(/^text\/plain; version=0\.0\.4/);
    expect(sample(body, 'vmpod_requests_total', 'command="add",result="ok"')).toBe(1);
    expect(sample(body, 'vmpod_requests_total', 'command="add",result="cni"')).toBe(1);
    expect(sample(body, 'vmpod_request_duration_seconds_count', 'command="add"')).toBe(2);
    expect(sample(body, 'vmpod_request_duration_seconds_bucket', 'le="0.005",command="get"')).toBe(1);
    expect(sample(body, 'vmpod_dhcp_packets_total', 'direction="received",type="discover"')).toBe(1);
    expect(sample(body, 'vmpod_dhcp_packets_total', 'direction="sent",type="nak"')).toBe(0);
    expect(sample(body, 'vmpod_dhcp_leases_served_total')).toBe(1);
    expect(sample(body, 'vmpod_restore_duration_seconds_sum')).toBe(1.5);
    expect(sample(body, 'vmpod_restored')).toBe(1);
    expect(sample(body, 'vmpod_pods', 'state="ready"')).toBe(2);
    expect(sample(body, 'vmpod_pods', 'state="adding"')).toBe(0);
    expect(sample(body, 'vmpod_pods', 'state="corrupt"')).toBe(1);
    expect(sample(body, 'process_cpu_seconds_total')).toBeGreaterThan(0);
    expect(body).toMatch(/^nodejs_eventloop_lag_seconds /m);
    // prom-client's defaults keep their standard names: none carries our prefix
    expect(body).not.toMatch(/^vmpod_(process|nodejs)_/m);
    const version = (JSON.parse(readFileSync('package.json', 'utf8')) as { version: string }).version;
    expect(body).toContain(`vmpod_build_info{version="${version}"} 1`);
    // every name is ours (prefixed) or prom-client's standard process_/nodejs_; counters end in _total
    for (const l of body.split('\n').filter((x) => x.startsWith('# TYPE '))) {
      const [, , name, type] = l.split(' ');
      expect(name).toMatch(/^(vmpod|process|nodejs)_/);
      if (type === 'counter') expect(name).toMatch(/_total$/);
    }
    pods = { ready: 1 };
    expect(sample((await m.render()).body, 'vmpod_pods', 'state="corrupt"')).toBeUndefined();
  });

  it('times each CNI plugin run by plugin, command and result', async () => {
    const m = createMetrics(() => ({}));
    const inner: PluginExec = {
      run: async (o) => {
        if (o.env.CNI_COMMAND === 'DEL') throw new Error('plugin failed');
        return { stdout: Buffer.from('{}'), stderr: Buffer.alloc(0) };
      },
    };
    const timed = m.timedExec(inner);
    const run = (cmd: string) =>
      timed.run({
        pluginPath: '/usr/lib/cni/bridge',
        env: { CNI_COMMAND: cmd },
        stdin: Buffer.alloc(0),
        timeoutMs: 1000,
      });
    await run('ADD');
    await expect(run('DEL')).rejects.toThrow('plugin failed');
    const { body } = await m.render();
    expect(sample(body, 'vmpod_cni_plugin_duration_seconds_count', 'plugin="bridge",command="add",result="ok"')).toBe(
      1,
    );
    expect(
      sample(body, 'vmpod_cni_plugin_duration_seconds_count', 'plugin="bridge",command="del",result="error"'),
    ).toBe(1);
  });
});

describe('sd_notify', () => {
  it('reads NOTIFY_SOCKET and WATCHDOG_USEC (half the period, only for our PID)', () => {
    expect(notifyConfig({})).toEqual({});
    expect(notifyConfig({ NOTIFY_SOCKET: '/run/systemd/notify' })).toEqual({ socket: '/run/systemd/notify' });
    expect(notifyConfig({ NOTIFY_SOCKET: '@x', WATCHDOG_USEC: '20000000' }, 7)).toEqual({
      socket: '@x',
      watchdogMs: 10_000,
    });
    expect(notifyConfig({ NOTIFY_SOCKET: '@x', WATCHDOG_USEC: '20000000', WATCHDOG_PID: '7' }, 7)).toEqual({
      socket: '@x',
      watchdogMs: 10_000,
    });
    expect(notifyConfig({ NOTIFY_SOCKET: '@x', WATCHDOG_USEC: '20000000', WATCHDOG_PID: '8' }, 7)).toEqual({
      socket: '@x',
    });
    expect(notifyConfig({ WATCHDOG_USEC: '20000000' })).toEqual({});
    expect(notifyConfig({ NOTIFY_SOCKET: '@x', WATCHDOG_USEC: 'soon' })).toEqual({ socket: '@x' });
  });

  it('sends nothing without a socket, and a failing send does not throw', () => {
    const sent: string[] = [];
    new SystemdNotifier({}, silentLogger(), (_p, d) => sent.push(d.toString())).ready('x');
    expect(sent).toEqual([]);
    const n = new SystemdNotifier({ socket: '/nonexistent/notify' }, silentLogger(), () => {
      throw new Error('ECONNREFUSED');
    });
    expect(() => n.stopping('bye')).not.toThrow();
  });
});

describe('--http-listen', () => {
  it('parses ADDR:PORT and [v6]:PORT, rejects the rest', () => {
    expect(parseListen('127.0.0.1:9731')).toEqual({ host: '127.0.0.1', port: 9731 });
    expect(parseListen('0.0.0.0:0')).toEqual({ host: '0.0.0.0', port: 0 });
    expect(parseListen('[::1]:80')).toEqual({ host: '::1', port: 80 });
    expect(parseListen('localhost:80')).toEqual({ host: 'localhost', port: 80 });
    for (const bad of ['9731', ':9731', '127.0.0.1:', '127.0.0.1:70000', '::1:80', '127.0.0.1:80x', 'a b:1'])
      expect(parseListen(bad)).toBeUndefined();
  });

  it('is off by default, set by flag or VMPOD_HTTP_LISTEN, and a bad value is a usage error', () => {
    const ok = (argv: string[], env: Record<string, string> = {}) => {
      const r = parseConfig(argv, env);
      if (!r.ok) throw new Error(r.errors.join('; '));
      return r.config.httpListen;
    };
    expect(ok([])).toBeUndefined();
    expect(ok([], { VMPOD_HTTP_LISTEN: '127.0.0.1:9731' })).toEqual({ host: '127.0.0.1', port: 9731 });
    expect(ok(['--http-listen', '[::]:1234'], { VMPOD_HTTP_LISTEN: '127.0.0.1:9731' })).toEqual({
      host: '::',
      port: 1234,
    });
    const bad = parseConfig(['--http-listen=9731'], {});
    expect(bad.ok).toBe(false);
    expect(!bad.ok && bad.errors.join()).toMatch(/--http-listen \/ VMPOD_HTTP_LISTEN "9731" is not ADDR:PORT/);
  });
});

describe('tapctl list table', () => {
  const now = Date.parse('2026-01-02T12:00:00Z');
  const pod = (over: Partial<PodSummary>): PodSummary => ({
    key: 'k1',
    podName: 'vm-a',
    podNs: 'default',
    nsPath: '/var/run/netns/k1',
    state: 'ready',
    createdAt: '2026-01-02T09:00:00Z',
    interfaces: [
      {
        name: 'eth0',
        type: 'tap',
        mac: '02:aa:bb:cc:dd:ee',
        tap: 'tap0',
        binding: 'bridge',
        bridge: 'br0',
        mtu: 1500,
        pciAddress: '',
        ip: '10.1.2.3/24',
      },
    ],
    dhcp: true,
    lastLease: '2026-01-02T11:59:15Z',
    ...over,
  });

  it('one aligned row per pod: key, pod, namespace, IPs, MAC, state, age, last lease', () => {
    const t = podTable(
      [
        pod({}),
        pod({
          key: 'a-much-longer-key',
          podName: '',
          state: 'adding',
          createdAt: '2026-01-02T11:59:58Z',
          interfaces: [],
          lastLease: null,
        }),
      ],
      now,
    );
    expect(t.split('\n')).toEqual([
      'KEY                 POD    NAMESPACE   IPS           MAC                 STATE    AGE   LAST LEASE',
      'k1                  vm-a   default     10.1.2.3/24   02:aa:bb:cc:dd:ee   ready    3h    45s ago',
      'a-much-longer-key   -      default     -             -                   adding   2s    -',
    ]);
  });

  it('ages read like kubectl', () => {
    expect([0, 119_000, 120_000, 7_199_000, 7_200_000, 172_799_000, 172_800_000, -1].map(shortAge)).toEqual([
      '0s',
      '119s',
      '2m',
      '119m',
      '2h',
      '47h',
      '2d',
      '-',
    ]);
  });
});
