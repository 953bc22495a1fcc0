// The stored record's interface type: what podnet made for one VM NIC, kept in the pod's state record.
import type { VfSetupRecord } from '../devices/vf.js';

/** One network interface the VM gets. */
export interface PodInterface {
  /** position of this interface in the CNI result's interfaces[] (what ips[].interface points at) */
  index: number;
  /** the link the CNI plugin left in the pod netns (e.g. "virtlet-eth0") */
  cniName: string;
  type: 'tap' | 'vf';
  /**
   * colon-hex, the ORIGINAL veth MAC: the VM's NIC takes it so the outside sees the pod's MAC unchanged.
   * For a VF: the MAC its netdev had in the pod netns, set on the PF for the VF (the guest's VF driver gets it).
   */
  vmMac: string;
  /** the random locally administered MAC the veth got instead */
  vethMacNew?: string;
  mtu: number;
  /** '' for a VF (no tap, no bridge) */
  tapName: string;
  bridgeName: string;
  /** the bridge's link-local address, where the DHCP server answers from ('' for a VF) */
  bridgeIp: string;
  /** a VF's full PCI address (0000:bb:dd.f), as Virtlet's csn PCIAddress */
  pciAddress?: string;
  /** 802.1Q VLAN the PF tags the VF's traffic with (0 = none); always 0 for a tap */
  vlanId: number;
  /** a VF: its PF, index, original driver, MAC and VLAN (what release restores) */
  vf?: VfSetupRecord;
}
