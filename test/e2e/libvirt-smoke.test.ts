// Proves the libvirt harness: libvirtd without systemd, a direct-kernel-boot domain with the plain qemu as
// <emulator>, the serial log in a file, and <qemu:env> reaching the emulator's environment.
// (Later the lead points <emulator> at vmwrapper.)
import { readFileSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  ensureGuest,
  GUEST_BUILD_TIMEOUT_MS,
  GUEST_CMDLINE,
  QEMU_BINARY,
  waitForSerialLine,
  type GuestImages,
} from '../helpers/guest.js';
import { domainXml, startLibvirtd, type Libvirt } from '../helpers/libvirt.js';
import { uniqueName } from '../helpers/netns.js';

describe('libvirt harness smoke', () => {
  let guest: GuestImages;
  let lv: Libvirt | undefined;
  let dir: string | undefined;
  let domain: string | undefined;

  beforeAll(async () => {
    guest = await ensureGuest();
    lv = await startLibvirtd();
  }, GUEST_BUILD_TIMEOUT_MS);

  afterAll(async () => {
    if (lv !== undefined && domain !== undefined) {
      const list = await lv.virsh(['list', '--all', '--name']);
      if (list.split('\n').includes(domain)) {
        await lv.virsh(['destroy', domain]).catch(() => undefined); // may already be shut off
        await lv.virsh(['undefine', domain]);
      }
    }
    await lv?.stop();
    if (dir !== undefined) await rm(dir, { recursive: true, force: true });
  });

  it('defines, starts, runs and removes a domain whose emulator is plain qemu', async () => {
    const v = lv as Libvirt;
    dir = await mkdtemp(join(tmpdir(), 'vmpod-lv-'));
    domain = uniqueName('vmpodsmk');
    const serialLog = join(dir, 'serial.log');
    const xml = domainXml({
      name: domain,
      emulator: QEMU_BINARY,
      kernel: guest.kernel,
      initrd: guest.initrd,
      cmdline: GUEST_CMDLINE,
      env: { VMPOD_SMOKE: `key ${domain} & <x>` },
      memoryMiB: 256,
      serialLog,
    });
    const xmlFile = join(dir, 'domain.xml');
    await writeFile(xmlFile, xml);

    await v.virsh(['define', xmlFile]);
    await v.virsh(['start', domain]);
    expect((await v.virsh(['domstate', domain])).trim()).toBe('running');

    // The guest's init writes on ttyS0, which libvirt sends to the file (no NIC here, so no lease).
    const boot = await waitForSerialLine(serialLog, /VMPOD-BOOT kernel=/, 120_000);
    expect(boot).toMatch(/^VMPOD-BOOT kernel=\S+/);

    // <qemu:env> arrives in the emulator's environment, XML escapes undone.
    const pid = Number((await readFile(`/run/libvirt/qemu/${domain}.pid`, 'utf8')).trim());
    const environ = readFileSync(`/proc/${pid}/environ`, 'latin1').split('\0');
    expect(environ).toContain(`VMPOD_SMOKE=key ${domain} & <x>`);

    await v.virsh(['destroy', domain]);
    expect((await v.virsh(['domstate', domain])).trim()).toBe('shut off');
    await v.virsh(['undefine', domain]);
    const names = (await v.virsh(['list', '--all', '--name'])).split('\n');
    expect(names).not.toContain(domain);
    // libvirt keeps the domain's log after undefine: it is ours, remove it
    await rm(`/var/log/libvirt/qemu/${domain}.log`, { force: true });
    domain = undefined;
  }, 300_000);
});

describe('domainXml', () => {
  it('renders the direct-boot domain with serial file, console and escaped env', () => {
    const xml = domainXml({
      name: 'd1',
      emulator: '/usr/bin/vmwrapper',
      kernel: '/k',
      initrd: '/i',
      cmdline: "console=ttyS0 a='b'",
      env: { VIRTLET_NET_KEY: 'ns/pod&1' },
      memoryMiB: 128,
      serialLog: '/tmp/s.log',
      type: 'qemu',
    });
    expect(xml).toBe(
      [
        "<domain type='qemu' xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>",
        '  <name>d1</name>',
        "  <memory unit='MiB'>128</memory>",
        '  <vcpu>1</vcpu>',
        '  <os>',
        "    <type arch='x86_64' machine='pc'>hvm</type>",
        '    <kernel>/k</kernel>',
        '    <initrd>/i</initrd>',
        '    <cmdline>console=ttyS0 a=&apos;b&apos;</cmdline>',
        '  </os>',
        '  <features><acpi/></features>',
        '  <on_poweroff>destroy</on_poweroff>',
        '  <on_reboot>destroy</on_reboot>',
        '  <on_crash>destroy</on_crash>',
        '  <devices>',
        '    <emulator>/usr/bin/vmwrapper</emulator>',
        "    <controller type='usb' model='none'/>",
        "    <serial type='file'><source path='/tmp/s.log'/><target port='0'/></serial>",
        "    <console type='file'><source path='/tmp/s.log'/><target type='serial' port='0'/></console>",
        "    <memballoon model='none'/>",
        '  </devices>',
        '  <qemu:commandline>',
        "    <qemu:env name='VIRTLET_NET_KEY' value='ns/pod&amp;1'/>",
        '  </qemu:commandline>',
        '</domain>',
        '',
      ].join('\n'),
    );
  });

  it('rejects env names qemu:env cannot carry', () => {
    expect(() =>
      domainXml({
        name: 'd',
        emulator: 'e',
        kernel: 'k',
        initrd: 'i',
        cmdline: '',
        serialLog: 's',
        env: { 'A B': '1' },
        type: 'qemu',
      }),
    ).toThrow(/bad env name/);
  });
});
