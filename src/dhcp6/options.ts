// The DHCPv6 options of one guest's IPv6 lease (pure): the server's DUID, the IA_NA with the CNI address and its
// times, DNS servers (23) and the domain search list (24).
import type { Lease6 } from '../dhcp/lease.js';
import { ErrorCode, VmpodError } from '../errors.js';
import { unpooled } from '../buffers.js';
import {
  duidLl,
  encodeAddressList,
  encodeDomainList,
  encodeIaAddr,
  encodeIaNa,
  type Option6,
  Opt6,
  statusOption,
} from './packet.js';

export interface Built6 {
  /** DUID-LL of the pod bridge's MAC: stable across tapmanager restarts, so clients' RENEWs still name us */
  serverDuid: Buffer;
  t1: number;
  t2: number;
  preferred: number;
  valid: number;
  /** options every reply carries that is not about addresses (23, 24) */
  info: Option6[];
}

/** Validates what the lease cannot encode (VmpodError(Config)) and builds what does not change between replies. */
export function buildOptions6(lease: Lease6, serverMac: string): Built6 {
  const info: Option6[] = [];
  try {
    if (lease.dns.length > 0) info.push({ code: Opt6.DnsServers, data: encodeAddressList(lease.dns) });
    if (lease.search.length > 0) info.push({ code: Opt6.DomainList, data: encodeDomainList(lease.search) });
  } catch (e) {
    throw new VmpodError(ErrorCode.Config, `DHCPv6 options for ${lease.mac}: ${(e as Error).message}`, {
      op: 'dhcp6 options',
    });
  }
  const valid = lease.leaseSeconds;
  // a server keeps these for its pod's life: out of the shared pool (buffers.ts)
  const [serverDuid, ...infoData] = unpooled([duidLl(serverMac), ...info.map((o) => o.data)]);
  return {
    serverDuid: serverDuid!,
    // RFC 8415 21.4: T1 0.5 and T2 0.8 of the preferred lifetime are the recommended values
    t1: Math.floor(valid / 2),
    t2: Math.floor((valid * 4) / 5),
    preferred: valid,
    valid,
    info: info.map((o, i) => ({ code: o.code, data: infoData[i]! })),
  };
}

/** An IA_NA option holding the lease's address with its lifetimes. */
export function leasedIaNa(iaid: number, lease: Lease6, b: Built6): Option6 {
  return {
    code: Opt6.IaNa,
    data: encodeIaNa({
      iaid,
      t1: b.t1,
      t2: b.t2,
      options: [
        { code: Opt6.IaAddr, data: encodeIaAddr({ address: lease.ip, preferred: b.preferred, valid: b.valid }) },
      ],
    }),
  };
}

/**
 * An IA_NA option with no usable address: a status, and (REBIND of foreign addresses) those addresses at lifetime 0.
 */
export function statusIaNa(iaid: number, status: number, message: string, zeroed: readonly string[] = []): Option6 {
  return {
    code: Opt6.IaNa,
    data: encodeIaNa({
      iaid,
      t1: 0,
      t2: 0,
      options: [
        ...zeroed.map((address) => ({ code: Opt6.IaAddr, data: encodeIaAddr({ address, preferred: 0, valid: 0 }) })),
        statusOption(status, message),
      ],
    }),
  };
}
