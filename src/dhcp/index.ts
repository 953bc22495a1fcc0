// Per-pod DHCPv4 server: codec (packet.ts), pure option building (options.ts), lease from CNI (lease.ts), server.
export {
  type DhcpLease,
  type Lease6,
  type GuestNic,
  guestFromCni,
  leaseFromCni,
  DEFAULT_LEASE_SECONDS,
} from './lease.js';
export {
  buildOptions,
  type BuiltOptions,
  type Route4,
  encodeClasslessRoutes,
  decodeClasslessRoutes,
  encodeDomainSearch,
  decodeDomainSearch,
  leaseProblems,
} from './options.js';
export {
  DhcpServer,
  type DhcpServerOptions,
  type DhcpStats,
  type DhcpSocketIo,
  answer,
  DHCP_SERVER_PORT,
  DHCP_CLIENT_PORT,
} from './server.js';
export { decodePacket, encodePacket, type DhcpPacket, type DhcpOption, MessageType, Opt } from './packet.js';
