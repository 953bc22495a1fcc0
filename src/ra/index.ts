// Router Advertisements to the VM: codec (packet.ts), the RA of a lease (options.ts), server (server.ts).
export * from './packet.js';
export * from './options.js';
export { answerNs, answerRs, RaServer, type RaServerOptions, type RaStats, type RsDecision } from './server.js';
