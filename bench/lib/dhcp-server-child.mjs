// Child process for bench/dhcp-answer.mjs: runs the project's DhcpServer (dist/dhcp) in a process of its own, as
// tapmanager does, with tapmanager's logger (pino, synchronous, fd 2, level from the config; the parent points fd 2
// at a log file).
//   node bench/lib/dhcp-server-child.mjs '<json: { nsPath, bridge, serverIp, lease, logLevel }>'
// Prints "ready <fd>" on stdout once the socket is open and watched. Stops (closing the socket) when stdin ends
// (the parent exited, whatever the way) or on SIGTERM/SIGINT, then prints its stats on fd 2 and exits 0.
import { importDist } from './dist.mjs';

const cfg = JSON.parse(process.argv[2] ?? '{}');
const { DhcpServer } = await importDist('dhcp/index.js');
const { createLogger } = await importDist('log.js');

const log = createLogger('tapmanager', cfg.logLevel ?? 'info');
const server = DhcpServer.start({
  nsPath: cfg.nsPath,
  bridge: cfg.bridge,
  serverIp: cfg.serverIp,
  lease: cfg.lease,
  log,
});

let stopping = false;
function stop() {
  if (stopping) return;
  stopping = true;
  server.stop();
  process.exit(0);
}
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
process.stdin.on('end', stop);
process.stdin.on('close', stop);
process.stdin.resume();
process.stdout.write(`ready ${server.socketFd}\n`);
