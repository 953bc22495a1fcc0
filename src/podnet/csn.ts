// Virtlet's ContainerSideNetwork (pure): built from an add's result and interfaces for its reply and record, and read
// back by recover into what the netns looked like before the add (so that the planner yields the same undo steps).
import type { CniResult } from '../cni/types.js';
import type { ContainerSideNetwork, CniResultV031 } from '../protocol/payloads.js';
import { InterfaceType } from '../protocol/payloads.js';
import { macToBase64, parseMac } from '../protocol/mac.js';
import type { PodInterface } from '../state/types.js';
import { hasSandbox } from './result.js';
import type { Observed, ObservedRoute } from './types.js';

/** Virtlet's ContainerSideNetwork for add's reply (and the record). */
export function buildCsn(result: CniResultV031, nsPath: string, interfaces: PodInterface[]): ContainerSideNetwork {
  return {
    Result: result,
    NsPath: nsPath,
    Interfaces: interfaces.map((i) => ({
      Type: i.type === 'vf' ? InterfaceType.VF : InterfaceType.Tap,
      Name: i.cniName,
      HardwareAddr: macToBase64(i.vmMac),
      PCIAddress: i.pciAddress ?? '',
      MTU: i.mtu,
      VlanID: i.vlanId,
      mac: i.vmMac,
    })),
  };
}

/**
 * recover: the links exist already and the veth was stripped, so what it looked like before comes from the
 * csn (Virtlet's recover did the same): its IPs from the result, the routes of the result through it, the
 * VM's MAC as its original MAC. The planner then yields the same undo steps add recorded.
 */
export function observedBeforeFromCsn(live: Observed, result: CniResult, csn: ContainerSideNetwork): Observed {
  const links = live.links.map((l) => ({ ...l, addrs4: [...l.addrs4] }));
  const routes4: ObservedRoute[] = [];
  const routes6: ObservedRoute[] = [];
  csn.Interfaces.forEach((ni, ord) => {
    const link = links.find((l) => l.name === ni.Name);
    if (!link) return;
    link.mac = parseMac(ni.mac ?? ni.HardwareAddr);
    const idx = result.interfaces.findIndex((ci) => ci.name === ni.Name && hasSandbox(ci));
    link.addrs4 = [];
    link.addrs6 = [];
    for (const a of result.ips) {
      if ((a.interface ?? -1) !== idx) continue;
      const [local, p] = a.address.split('/');
      if (local && p && !local.includes(':')) link.addrs4.push({ local, prefixlen: Number(p) });
      else if (local && p) (link.addrs6 ??= []).push({ local, prefixlen: Number(p), scope: 'global' });
    }
    // CNI routes carry no interface: they belong to the first interface (as Virtlet assumed)
    if (ord === 0) {
      for (const r of result.routes) {
        if (r.dst.includes(':')) {
          const dst = r.dst === '::/0' ? 'default' : r.dst;
          routes6.push({ dst, dev: link.name, ...(r.gw ? { gateway: r.gw } : { scope: 'link' }), flags: [] });
          continue;
        }
        const dst = r.dst === '0.0.0.0/0' ? 'default' : r.dst.endsWith('/32') ? r.dst.slice(0, -3) : r.dst;
        routes4.push({ dst, dev: link.name, ...(r.gw ? { gateway: r.gw } : { scope: 'link' }), flags: [] });
      }
    }
  });
  return { links, routes4, routes6 };
}
