// The stored record's interface type: what podnet made for one VM NIC, kept in the pod's state record.
import type { VfSetupRecord } from '../devices/vf.js';

/** One network interface the VM gets. */
export interface PodInterface {
  /** position of this interface in the CNI result's interfaces[] (what ips[].interface points at) */
  index: number;
  /** the link the CNI plugin left in the pod netns (e.g. "virtlet-eth0") */
  cniName: string;
  type: 'tap' | 'vf';
  /** how a tap interface is joined to its CNI interface (src/podnet/binding.ts); absent in older records: bridge */
  binding?: 'bridge' | 'tc-redirect';
  /**
   * colon-hex, the ORIGINAL veth MAC: the VM's NIC takes it so the outside sees the pod's MAC unchanged.
   * For a VF: the MAC its netdev had in the pod netns, set on the PF for the VF (the guest's VF driver gets it).
   */
  vmMac: string;
  /** the random locally administered MAC the veth got instead (bridge binding; tc-redirect leaves the MAC alone) */
  vethMacNew?: string;
  mtu: number;
  /** '' for a VF (no tap, no bridge) */
  tapName: string;
  /**
   * the tap was made with IFF_MULTI_QUEUE (every tap since multiqueue taps): each open attaches another queue, and a
   * get may ask for several. Absent in records made before (single-queue taps).
   */
  multiQueue?: boolean;
  /** '' for a VF and for the tc-redirect binding (no bridge) */
  bridgeName: string;
  /** the bridge's link-local address, where the DHCP server answers from (tc-redirect: the tap's; '' for a VF) */
  bridgeIp: string;
  /**
   * IPv6: the bridge's (tc-redirect: the tap's) MAC and link-local address, the router and DHCPv6 server the guest sees
   * (absent: no IPv6)
   */
  bridgeMac?: string;
  bridgeIp6?: string;
  /**
   * tc-redirect IPv6: the pod netns routes the VM's IPv6 (its RA names a default router), as under the bridge binding
   * (absent: it does not; a macvlan's or ipvlan's network advertises its own routers)
   */
  routed6?: boolean;
  /** a VF's full PCI address (0000:bb:dd.f), as Virtlet's csn PCIAddress */
  pciAddress?: string;
  /** 802.1Q VLAN the PF tags the VF's traffic with (0 = none); always 0 for a tap */
  vlanId: number;
  /** a VF: its PF, index, original driver, MAC and VLAN (what release restores) */
  vf?: VfSetupRecord;
}
