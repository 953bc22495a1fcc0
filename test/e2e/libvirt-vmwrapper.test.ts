// The pair under a real libvirtd: the domain's <emulator> is a one-line script that execs vmwrapper, the domain has no
// <interface>, and vmwrapper's env comes through <qemu:env>. libvirt's capability probes pass through vmwrapper to
// qemu; a start gets the pod's tap from tapmanager, and the guest takes the pod's IP over DHCP.
import { existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { FdClient } from '../../src/client/fdclient.js';
import { makeCniConf, type CniTestNet } from '../helpers/cniconf.js';
import { BIN, REPO, removeDir, startDaemon, type Daemon } from '../helpers/daemon.js';
import {
  ensureGuest,
  GUEST_BUILD_TIMEOUT_MS,
  GUEST_CMDLINE,
  LEASE_LINE_RE,
  parseLeaseLine,
  QEMU_BINARY,
  waitForSerialLine,
  type GuestImages,
} from '../helpers/guest.js';
import { domainXml, startLibvirtd, type Libvirt } from '../helpers/libvirt.js';
import { uniqueName } from '../helpers/netns.js';
import {
  NOTHING_LEFT,
  POD_DNS,
  newPod,
  pingFromHost,
  podAddress,
  podLeftovers,
  processArgv,
  processExe,
} from '../helpers/pairvm.js';

const MTU = 1400;
const LIBVIRT_QEMU_LOG_DIR = '/var/log/libvirt/qemu';

/**
 * libvirt wants one executable path as <emulator>. A script with node's absolute path (libvirtd's PATH need not have
 * node) that execs the bundle: sh -> node -> qemu, all one PID. It lives at a fixed path under .cache/ and is only
 * rewritten when its text changes, because libvirt keys its capability cache on the emulator's path and ctime: a new
 * path every run would cost two probes (about 4 s) and leave one cache file per run in /var/cache/libvirt/qemu.
 */
function emulatorScript(): string {
  const dir = join(REPO, '.cache', 'e2e');
  const path = join(dir, 'vmwrapper-emulator');
  const text = `#!/bin/sh\n# libvirt <emulator> for vmpod-node's e2e tests (test/e2e/libvirt-vmwrapper.test.ts)\nexec ${process.execPath} ${BIN.vmwrapper} "$@"\n`;
  if (existsSync(path) && readFileSync(path, 'utf8') === text) return path;
  mkdirSync(dir, { recursive: true });
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, text, { mode: 0o755 });
  renameSync(tmp, path);
  return path;
}

describe('libvirtd + vmwrapper + tapmanager', () => {
  let guest: GuestImages;
  let lv: Libvirt | undefined;
  let net: CniTestNet | undefined;
  let d: Daemon | undefined;
  let dir: string | undefined;
  let domain: string | undefined;
  let podKey: string | undefined;

  beforeAll(async () => {
    guest = await ensureGuest();
    lv = await startLibvirtd();
    net = await makeCniConf({ mtu: MTU });
    d = await startDaemon({ confDir: net.confDir, binDirs: net.binDirs, cacheDir: net.cacheDir });
  }, GUEST_BUILD_TIMEOUT_MS);

  afterAll(async () => {
    if (lv !== undefined && domain !== undefined) {
      const names = (await lv.virsh(['list', '--all', '--name'])).split('\n');
      if (names.includes(domain)) {
        await lv.virsh(['destroy', domain]).catch(() => undefined); // may already be shut off
        await lv.virsh(['undefine', domain]);
      }
      await rm(join(LIBVIRT_QEMU_LOG_DIR, `${domain}.log`), { force: true });
    }
    if (d !== undefined && podKey !== undefined) {
      try {
        new FdClient(d.socket, { timeoutMs: 60_000 }).release(podKey);
      } catch {
        // the test's own assertions report the failure
      }
    }
    const code = await d?.stop();
    if (d) removeDir(d.dir);
    await net?.cleanup();
    await lv?.stop();
    if (dir !== undefined) await rm(dir, { recursive: true, force: true });
    expect(code).toBe(0);
  }, 120_000);

  async function domainLog(name: string): Promise<string> {
    return readFile(join(LIBVIRT_QEMU_LOG_DIR, `${name}.log`), 'utf8').catch(
      (e: Error) => `(no domain log: ${e.message})`,
    );
  }

  it('starts a domain whose emulator is vmwrapper; the guest gets the pod IP; destroy + release leave nothing', async () => {
    const v = lv as Libvirt;
    const daemon = d as Daemon;
    const cni = net as CniTestNet;
    const client = new FdClient(daemon.socket, { timeoutMs: 60_000 });
    dir = await mkdtemp(join(tmpdir(), 'vmpod-lvw-'));
    const emulator = emulatorScript();

    const { key, desc } = newPod('vmplv');
    podKey = key;
    const a = podAddress(client.add(key, desc));

    domain = uniqueName('vmpodvw');
    const serialLog = join(dir, 'serial.log');
    const xmlFile = join(dir, 'domain.xml');
    await writeFile(
      xmlFile,
      domainXml({
        name: domain,
        emulator,
        kernel: guest.kernel,
        initrd: guest.initrd,
        cmdline: GUEST_CMDLINE,
        env: { VIRTLET_EMULATOR: QEMU_BINARY, VIRTLET_NET_KEY: key, VIRTLET_FD_SERVER_SOCKET_PATH: daemon.socket },
        memoryMiB: 256,
        serialLog,
      }),
    );

    // define probes the emulator (unless its capabilities are cached): the probe passed through vmwrapper to qemu.
    await v.virsh(['define', xmlFile]);
    const caps = await v.virsh(['domcapabilities', '--emulatorbin', emulator, '--virttype', 'qemu']);
    expect(caps).toContain(`<path>${emulator}</path>`);
    expect(caps).toMatch(/<machine>pc-i440fx-/);

    await v.virsh(['start', domain]).catch(async (e: Error) => {
      throw new Error(`virsh start ${domain}: ${e.message}\ndomain log:\n${await domainLog(domain as string)}`);
    });
    let line: string;
    try {
      line = await waitForSerialLine(serialLog, LEASE_LINE_RE, 120_000, { intervalMs: 10 });
    } catch (e) {
      throw new Error(`${(e as Error).message}\ndomain log:\n${await domainLog(domain)}`);
    }
    const lease = parseLeaseLine(line);
    expect(`${lease.ip}/${lease.prefixLen}`).toBe(`${a.ip}/${a.prefixLen}`);
    expect(lease.mac).toBe(a.mac);
    expect(lease.routers).toEqual([cni.gateway]);
    expect(lease.mtu).toBe(MTU);
    expect(lease.hostname).toBe(desc.podName);
    expect(lease.dns).toContain(POD_DNS.nameservers[0]);

    // libvirt's qemu PID runs qemu (vmwrapper execve'd in place) with the tap vmwrapper appended to libvirt's argv.
    const pid = Number((await readFile(`/run/libvirt/qemu/${domain}.pid`, 'utf8')).trim());
    expect(processExe(pid)).toBe(QEMU_BINARY);
    const argv = processArgv(pid);
    expect(argv).toContain(`virtio-net-pci,netdev=vmpodnet0,id=vmpodnic0,mac=${a.mac},host_mtu=${a.mtu}`);
    expect(argv.join(' ')).toMatch(/-netdev tap,id=vmpodnet0,fd=\d+/);
    expect(await domainLog(domain)).toMatch(/"msg":"exec emulator"/);

    await pingFromHost(a.ip);

    await v.virsh(['destroy', domain]);
    expect((await v.virsh(['domstate', domain])).trim()).toBe('shut off');
    await v.virsh(['undefine', domain]);
    expect((await v.virsh(['list', '--all', '--name'])).split('\n')).not.toContain(domain);
    await rm(join(LIBVIRT_QEMU_LOG_DIR, `${domain}.log`), { force: true });
    domain = undefined;

    client.release(key);
    podKey = undefined;
    expect(await podLeftovers(cni, daemon.stateDir, key)).toEqual(NOTHING_LEFT);
  }, 400_000);
});
