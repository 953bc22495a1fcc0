// Devices: sysfs model (configurable root), vfio binding, SR-IOV VFs, and the VFIO devices a VM pod gets: each
// input (device-plugin env, CRI devices, CDI names, kubelet PodResources, tapmanager's VFs) as DeviceRequests,
// merged and checked in one step (merge.ts). kubelet.ts (the gRPC client) is not exported: it is imported lazily.
export { bindToVfio, restoreDriver } from './bind.js';
export {
  CDI_DEVICES_ENV,
  CDI_SPEC_DIRS_ENV,
  cdiRequests,
  cdiSpecDirs,
  loadCdiRegistry,
  parseCdiNames,
  parseQualifiedName,
  validateSpec,
  type CdiRegistry,
} from './cdi.js';
export { collectDevices, devicesOrThrow, type CollectedDevices, type CollectOptions } from './collect.js';
export {
  classifyCriDevices,
  criRequests,
  CRI_DEVICES_ENV,
  parseCriDevices,
  type CriDevice,
  type CriDeviceClasses,
} from './cri.js';
export { findHolders, functionFacts, groupFacts, hostRoot, readHostFacts } from './host.js';
export { isBridge, isVfioBound, leavesGroupViable, mergeDevices } from './merge.js';
export {
  isBridgeClass,
  isPciAddress,
  isVfioDriverName,
  parsePciAddress,
  PciClass,
  sysfsRoot,
  VFIO_DRIVERS,
  VFIO_PCI_DRIVER,
} from './pci.js';
export { EnvConvention, pluginEnvRequests } from './plugins.js';
export {
  DEFAULT_POD_RESOURCES_SOCKET,
  IdKind,
  parseResourceMap,
  podResourcesRequests,
  podResourcesTarget,
  type PodResourcesMsg,
  type PodResourcesTarget,
} from './podresources.js';
export type {
  DeviceReport,
  DeviceRequest,
  FunctionFacts,
  GroupFacts,
  Holder,
  HostFacts,
  ResolvedDevice,
} from './records.js';
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
