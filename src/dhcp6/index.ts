// Per-pod stateful DHCPv6 server: codec (packet.ts), pure option building (options.ts), server (server.ts); the
// lease comes from dhcp/lease.ts (guestFromCni), the one place that reads the CNI result for the guest.
export * from './packet.js';
export { buildOptions6, type Built6, leasedIaNa, statusIaNa } from './options.js';
export {
  answer6,
  type Answer6Context,
  type Decision6,
  Dhcp6Server,
  type Dhcp6ServerOptions,
  type Dhcp6Stats,
} from './server.js';
