// Binding a PCI function to vfio-pci and back (devices.md "Binding"). Each step is one sysfs write.
//
// driver_override (Linux 3.16+) makes the next probe of this one device pick the named driver, and only this
// device: unlike vfio-pci/new_id (what Virtlet wrote, and never removed), it does not also capture every other
// device with the same vendor:device ids.
import { ErrorCode, VmpodError } from '../errors.js';
import { parsePciAddress, VFIO_PCI_DRIVER } from './pci.js';
import type { Sysfs } from './sysfs.js';

function devDir(addr: string): string {
  return `bus/pci/devices/${addr}`;
}

/**
 * unbind from the current driver, driver_override=vfio-pci, drivers_probe; then check that vfio-pci took it.
 * A no-op (previousDriver "vfio-pci") when it is bound already. Returns what restoreDriver needs.
 */
export function bindToVfio(sysfs: Sysfs, addr: string): { previousDriver?: string } {
  const address = parsePciAddress(addr);
  const dev = sysfs.pciDevice(address);
  if (dev === undefined)
    throw new VmpodError(
      ErrorCode.Device,
      `bind ${address} to vfio-pci: no such device under ${sysfs.path('bus/pci/devices')}`,
    );
  if (dev.driver === VFIO_PCI_DRIVER) return { previousDriver: VFIO_PCI_DRIVER };
  const op = `bind ${address} to vfio-pci`;
  try {
    if (dev.driver !== undefined) sysfs.write(`${devDir(address)}/driver/unbind`, address);
    sysfs.write(`${devDir(address)}/driver_override`, VFIO_PCI_DRIVER);
    sysfs.write('bus/pci/drivers_probe', address);
  } catch (e) {
    throw new VmpodError(ErrorCode.Device, `${op} (was ${dev.driver ?? 'no driver'})`, { cause: e });
  }
  const now = sysfs.pciDevice(address)?.driver;
  if (now !== VFIO_PCI_DRIVER)
    throw new VmpodError(
      ErrorCode.Device,
      `${op}: after the probe it is bound to ${now ?? 'no driver'} (is the vfio-pci module loaded?)`,
    );
  return dev.driver === undefined ? {} : { previousDriver: dev.driver };
}

/**
 * Undo bindToVfio: unbind from vfio-pci, clear driver_override (a write of "\n" clears it), drivers_probe, so the
 * kernel gives the device back to its own driver. Nothing to do when it was on vfio-pci before us.
 * Keeps going past a failing step and reports all failures.
 */
export function restoreDriver(sysfs: Sysfs, addr: string, previousDriver?: string): void {
  const address = parsePciAddress(addr);
  if (previousDriver === VFIO_PCI_DRIVER) return;
  const dev = sysfs.pciDevice(address);
  if (dev === undefined)
    throw new VmpodError(
      ErrorCode.Device,
      `restore driver of ${address}: no such device under ${sysfs.path('bus/pci/devices')}`,
    );
  const errors: unknown[] = [];
  const step = (f: () => void) => {
    try {
      f();
    } catch (e) {
      errors.push(e);
    }
  };
  if (dev.driver === VFIO_PCI_DRIVER) step(() => sysfs.write(`${devDir(address)}/driver/unbind`, address));
  step(() => sysfs.write(`${devDir(address)}/driver_override`, '\n'));
  step(() => sysfs.write('bus/pci/drivers_probe', address));
  if (errors.length > 0)
    throw new VmpodError(ErrorCode.Device, `restore driver ${previousDriver ?? '(none)'} of ${address}`, {
      cause: errors.length === 1 ? errors[0] : new AggregateError(errors, `${errors.length} steps failed`),
    });
}
