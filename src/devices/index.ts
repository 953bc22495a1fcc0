// Devices: sysfs model (configurable root), IOMMU groups, vfio binding, device-plugin env, SR-IOV VFs.
export { bindToVfio, restoreDriver } from './bind.js';
export { classifyCriDevices, parseCriDevices, type CriDevice, type CriDeviceClasses } from './cri.js';
export { isBridgeClass, isPciAddress, parsePciAddress, PciClass, sysfsRoot, VFIO_PCI_DRIVER } from './pci.js';
export { collectPluginDevices, EnvConvention } from './plugins.js';
export { Sysfs, type PciDeviceInfo, type VfInfo } from './sysfs.js';
export {
  applyVfSetup,
  describeVf,
  parseVfState,
  planVfSetup,
  undoVfSetup,
  vfLinkArgv,
  type RunArgv,
  type VfDescription,
  type VfLinkState,
  type VfSetupRecord,
} from './vf.js';
