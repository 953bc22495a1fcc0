// The plain records every device input produces, and what the merge step makes of them. No I/O here.
//
// Each input (device-plugin env, CRI devices, CDI names, kubelet PodResources, tapmanager's VFs) turns its source
// into DeviceRequests; mergeDevices (merge.ts) resolves them against HostFacts (host.ts) and applies the checks;
// src/qemu renders the result. `tapctl devices` prints the same DeviceReport.

/** One thing an input names: a PCI function, an IOMMU group (a /dev/vfio/<N> node), or a mediated device. */
export type DeviceRequest =
  | {
      kind: 'pci';
      address: string;
      /**
       * where it came from: a variable name ("QAT0"), "tapmanager", "cdi nvidia.com/gpu=0", "podresources <resource>"
       */
      source: string;
      /** what the source said, for errors: the variable's value, the spec file ... */
      origin?: string;
      /** the group the source claims for it (the SR-IOV plugin's _INFO dev-mount): cross-checked with sysfs */
      group?: string;
      /** the source handed out /dev/vfio/noiommu-<N> for it */
      noiommu?: boolean;
    }
  | {
      kind: 'group';
      group: string;
      source: string;
      origin?: string;
      /** the device node as the source named it (/dev/vfio/67, /dev/vfio/noiommu-67) */
      path: string;
      noiommu: boolean;
      /** the functions of the group the source names (CDI env/annotations); absent: it does not say */
      only?: string[];
    }
  | { kind: 'mdev'; uuid: string; source: string; origin?: string };

/** What the host says about one PCI function. */
export interface FunctionFacts {
  address: string;
  exists: boolean;
  /** 24-bit class code */
  class: number;
  driver?: string;
  /** vfio-dev/vfio<N> under the device (Linux 6.1+): present exactly while a vfio driver is bound */
  vfioDev?: string;
  group?: string;
}

/** A process that holds a group's /dev/vfio/<N> open (found as fuser does: /proc/<pid>/fd links). */
export interface Holder {
  pid: number;
  /** /proc/<pid>/comm */
  comm: string;
  /** qemu's -name guest=<name>, when the holder is a qemu */
  guest?: string;
}

export interface GroupFacts {
  group: string;
  /** PCI members, bridges included */
  members: FunctionFacts[];
  /** mediated devices in the group */
  mdevs: { uuid: string; parent: string; sysfsdev: string }[];
  /** why it is a no-IOMMU group (sysfs name "vfio-noiommu", /dev/vfio/noiommu-<N>), undefined when it is not */
  noiommu?: string;
  holders: Holder[];
}

export interface HostFacts {
  /** where sysfs is read, for the paths in errors */
  sysfsRoot: string;
  functions: Map<string, FunctionFacts>;
  groups: Map<string, GroupFacts>;
  mdevs: Map<string, { parent?: string; sysfsdev: string } | null>;
}

/** One function (or mediated device) the VM gets. */
export interface ResolvedDevice {
  address: string;
  /** mediated device: its sysfs path, rendered as sysfsdev= */
  sysfsdev?: string;
  group?: string;
  driver?: string;
  source: string;
}

export interface DeviceReport {
  devices: ResolvedDevice[];
  /** refusals, each a full sentence naming the device, the reason and what to do */
  problems: string[];
  /** things an input saw and deliberately did not pass (not VFIO, not mapped): for the operator's report */
  skipped: string[];
}
