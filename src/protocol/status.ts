// Replies of our own commands list (4) and status (6): JSON shapes shared by tapmanager and tapctl (types only).

/** One entry of list's reply: a pod network tapmanager holds, ready or mid-operation. */
export interface PodSummary {
  key: string;
  podName: string;
  podNs: string;
  nsPath: string;
  /**
   * the state record's phase: adding, ready or releasing; quarantined (undo incomplete: release --force), corrupt;
   * degraded: ready, and its last check failed
   */
  state: string;
  /** when the record was created (ISO 8601) */
  createdAt: string;
  interfaces: {
    name: string;
    type: 'tap' | 'vf';
    mac: string;
    tap: string;
    /** how the interface meets its tap (docs/networking.md, "Bindings"): a VF has none */
    binding: 'bridge' | 'tc-redirect' | 'vf';
    /** the bridge joining them; empty under tc-redirect and for a VF */
    bridge: string;
    mtu: number;
    pciAddress: string;
    ip?: string;
  }[];
  dhcp: boolean;
  /** the pod's last check when it failed (state "degraded"): each reason and what was found; absent otherwise */
  degraded?: { at: string; failures: { reason: string; detail: string }[] };
  /** the last DHCP ACK that granted the lease (ISO 8601), null when none since tapmanager started */
  lastLease: string | null;
}

/** status (6): is tapmanager ready, and if not, why. */
export interface StatusReport {
  ready: boolean;
  /** one sentence per unmet condition, empty when ready */
  reasons: string[];
  restored: boolean;
  pods: number;
  pid: number;
  uptimeSeconds: number;
}

/** gc (7): what one CNI GC did (src/cni GcReport). */
export interface GcSummary {
  network: string;
  disabled?: true;
  removed: { containerId: string; ifName: string }[];
  pluginsAsked: string[];
  errors: string[];
}

/** check (8): one pod's check (src/podnet PodCheck). */
export interface CheckSummary {
  key: string;
  ok: boolean;
  failures: { reason: string; detail: string }[];
  cni: 'checked' | 'disabled' | 'unsupported' | 'not-run';
  at: string;
}
