// The qemu argv builder (pure). See docs/devices.md.
export { buildQemuArgv } from './argv.js';
export { escapeQemuValue, IdAllocator, parseQemuOptValue, splitQemuOpts, usedIds } from './ids.js';
export { isQ35, usedPcieNumbers } from './machine.js';
export { QemuNetdev } from './netdev.js';
export { IdPrefix, MAX_QUEUES, NetdevBackend, QemuDriver, type TapNet, type VfioDev } from './types.js';
export { QemuPcieRootPort, QemuVfioDevice } from './vfio.js';
