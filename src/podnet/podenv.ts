// What the pod network's operations (add.ts, release.ts, restore.ts) work with, built once by PodNetwork, and the
// state of a live pod network they hand back.
import type { Logger } from '../log.js';
import type { ContainerSideNetwork, PodNetworkDesc } from '../protocol/payloads.js';
import type { CniClient, NetworkConfigList, RuntimeConf } from '../cni/index.js';
import type { StateStore } from '../state/store.js';
import type { PodRecord } from '../state/record.js';
import type { PodInterface } from '../state/types.js';
import type { StepDeps } from './steps.js';
import type { SpareNetns } from './sparens.js';
import type { BindingMode } from './binding.js';

export interface PodEnv {
  deps: StepDeps;
  store: StateStore;
  cni: CniClient;
  loadConfList: () => Promise<NetworkConfigList>;
  spares: SpareNetns;
  /** CNI_IFNAME of the pod's interface */
  ifName: string;
  enableSriov: boolean;
  /** how CNI interfaces are joined to their taps (binding.ts) */
  binding: BindingMode;
  log: Logger;
}

export interface PodNetworkState {
  key: string;
  nsPath: string;
  csn: ContainerSideNetwork;
  interfaces: PodInterface[];
  /** one fd per interface, in order: the tap; for a VF /dev/null (see openFds) */
  fds: number[];
  desc: PodNetworkDesc;
}

/**
 * The CNI attachment of a pod: its key as the container id, the K8S_* args kubelet's CRI runtime would pass, and the
 * request's port mappings and bandwidth as capability args (runtimeConfig of the plugins that declare them). All of it
 * comes from the record, so DEL (and a restart's) gets what ADD got.
 */
export function runtimeConf(rec: Pick<PodRecord, 'key' | 'nsPath' | 'desc'>, ifName: string): RuntimeConf {
  const caps = capabilityArgs(rec.desc);
  return {
    ...(caps ? { capabilityArgs: caps } : {}),
    containerId: rec.key,
    netns: rec.nsPath,
    ifName,
    args: [
      ['IgnoreUnknown', '1'],
      ['K8S_POD_NAMESPACE', rec.desc.podNs],
      ['K8S_POD_NAME', rec.desc.podName],
      ['K8S_POD_INFRA_CONTAINER_ID', rec.key],
    ],
  };
}

/** The capability args of a pod (CNI conventions: portMappings, bandwidth); undefined when it has none. */
export function capabilityArgs(desc: PodNetworkDesc): Record<string, unknown> | undefined {
  const caps: Record<string, unknown> = {};
  if (desc.portMappings && desc.portMappings.length > 0) caps['portMappings'] = desc.portMappings;
  if (desc.bandwidth) caps['bandwidth'] = desc.bandwidth;
  return Object.keys(caps).length > 0 ? caps : undefined;
}
