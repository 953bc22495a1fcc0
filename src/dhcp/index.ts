// Per-pod DHCPv4 server: codec (packet.ts), pure option building (options.ts), lease from CNI (lease.ts), server.
export { guestFromCni } from './lease.js';
export {
  DhcpServer,
  type DhcpServerOptions,
} from './server.js';
