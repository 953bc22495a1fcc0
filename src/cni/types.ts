// CNI data types (CNI spec, "Result" and "Error" sections). The in-memory result is normalised to the
// 1.0.0 shape; src/cni/result.ts converts from and to 0.3.x / 0.4.0 / 1.0.0 / 1.1.0.

export interface CniInterface {
  name: string;
  mac?: string;
  /** netns path for interfaces inside the container; absent for host-side interfaces */
  sandbox?: string;
  mtu?: number;
  pciID?: string;
  /** CNI 1.1.0: path of a socket (vhost-user and similar) that stands for the interface */
  socketPath?: string;
}

export interface CniIpConfig {
  /** CIDR, e.g. "10.1.90.5/24" */
  address: string;
  gateway?: string;
  /** index into interfaces[] */
  interface?: number;
}

export interface CniRoute {
  dst: string;
  gw?: string;
  mtu?: number;
  /** CNI 1.1.0 route attributes (rtnetlink RTAX_ADVMSS, RTA_PRIORITY, RTA_TABLE, rtm_scope) */
  advmss?: number;
  priority?: number;
  table?: number;
  scope?: number;
}

export interface CniDns {
  nameservers?: string[];
  domain?: string;
  search?: string[];
  options?: string[];
}

/** A normalised CNI result (1.0.0 shape: no "version" on ips). */
export interface CniResult {
  cniVersion: string;
  interfaces: CniInterface[];
  ips: CniIpConfig[];
  routes: CniRoute[];
  dns: CniDns;
}

/** The CNI error JSON (spec: "Error" section). */
export interface CniErrorJson {
  cniVersion?: string;
  code: number;
  msg: string;
  details?: string;
}

/** Well-known CNI error codes (spec). */
export const CniErrorCode = {
  IncompatibleVersion: 1,
  UnsupportedField: 2,
  UnknownContainer: 3,
  InvalidEnv: 4,
  IoFailure: 5,
  DecodeFailure: 6,
  InvalidNetworkConfig: 7,
  TryAgainLater: 11,
} as const;
