// Virtlet's JSON payloads, field names exactly as Virtlet's Go code marshals them (docs/protocol.md).
import type { CniDns } from '../cni/types.js';

/** A pod's port mapping as CNI's portMappings capability carries it (containerd and cri-o fill it from hostPort). */
export interface PortMapping {
  hostPort: number;
  containerPort: number;
  protocol: 'tcp' | 'udp' | 'sctp';
  /** the node address to listen on; "" for all */
  hostIP: string;
}

/** A pod's traffic shaping as CNI's bandwidth capability carries it: rates in bits per second, bursts in bits. */
export interface Bandwidth {
  ingressRate?: number;
  ingressBurst?: number;
  egressRate?: number;
  egressBurst?: number;
}

/**
 * Virtlet's PodNetworkDesc. Note the upper-case "DNS" key. portMappings and bandwidth are ours (Virtlet's client never
 * sends them): the runtimeConfig of the plugins that declare those capabilities.
 */
export interface PodNetworkDesc {
  podId: string;
  podNs: string;
  podName: string;
  DNS?: CniDns | null;
  portMappings?: PortMapping[];
  bandwidth?: Bandwidth;
}

/** add (0) request payload. */
export interface GetFDPayload {
  podNetworkDesc: PodNetworkDesc;
}

/** Virtlet's network.InterfaceType */
export const InterfaceType = { Tap: 0, VF: 1 } as const;
export type InterfaceType = (typeof InterfaceType)[keyof typeof InterfaceType];

/** Virtlet's network.InterfaceDescription. HardwareAddr is Go-style base64 of the 6 MAC bytes on the wire. */
export interface NetIf {
  Type: InterfaceType;
  Name: string;
  HardwareAddr: string;
  PCIAddress: string;
  MTU: number;
  VlanID: number;
  /** ours (Go ignores unknown keys): the MAC in colon-hex for humans */
  mac?: string;
}

/**
 * The CNI result as Virtlet carries it: CNI 0.3.1-shaped (ips[].version present, "interface" omitted when 0).
 * Built by src/protocol/result.ts toV031().
 */
export interface CniResultV031 {
  cniVersion?: string;
  interfaces?: { name: string; mac?: string; sandbox?: string }[];
  ips?: { version: '4' | '6'; interface?: number; address: string; gateway?: string }[];
  routes?: { dst: string; gw?: string }[];
  dns?: CniDns;
}

/** Virtlet's network.ContainerSideNetwork: add's response payload and part of recover's request. */
export interface ContainerSideNetwork {
  Result: CniResultV031 | null;
  NsPath: string;
  Interfaces: NetIf[];
}

/** recover (3) request payload. */
export interface RecoverPayload {
  podNetworkDesc: PodNetworkDesc;
  csn: ContainerSideNetwork;
  HaveRunningContainers: boolean;
}

/** One element of get's (2) response array. mac is base64 of the 6 bytes. */
export interface GetInfo {
  type: InterfaceType;
  mac: string;
  fdIndex: number;
  pciAddress: string;
  /** ours (Go ignores unknown keys): the interface MTU, so vmwrapper can give the NIC host_mtu */
  mtu?: number;
  /**
   * ours (Go ignores unknown keys), taps only: the fd index of each of the tap's queues, in order; the first is
   * fdIndex. One element unless the get asked for more queues (GetRequest).
   */
  queueFdIndices?: number[];
}

/**
 * get (2) request payload, ours: how many queues the VM wants on each tap (multiqueue virtio-net). Virtlet's client
 * sends no payload, which asks for one.
 */
export interface GetRequest {
  queues: number;
}

/** The most queues one tap can have: the kernel's MAX_TAP_QUEUES (drivers/net/tun.c). */
export const MAX_TAP_QUEUES = 256;
