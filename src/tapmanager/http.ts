// The optional HTTP listener (--http-listen): /healthz, /readyz, /metrics. Plain node:http; it knows nothing of
// prom-client (the daemon hands it a render function).
import type { Server } from 'node:http';
import type { Logger } from '../log.js';

export interface HttpEndpoints {
  /** null reasons = ready */
  readiness(): Promise<{ ready: boolean; reasons: string[] }>;
  metrics(): Promise<{ contentType: string; body: string }>;
  log: Logger;
}

export interface HttpListener {
  /** the bound address (the port is the real one when 0 was asked for) */
  host: string;
  port: number;
  close(): Promise<void>;
}

/** Listens, or rejects with one line naming the address and what to do. */
export function startHttp(addr: { host: string; port: number }, ep: HttpEndpoints): Promise<HttpListener> {
  // from the CommonJS loader: an ESM import of node:http builds its ESM facade, which reads every export, and so
  // loads undici (fetch, WebSocket) at the start of every process that imports this module (docs/performance.md)
  const { createServer } = process.getBuiltinModule('node:http');
  const server: Server = createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method !== 'GET' && req.method !== 'HEAD') {
      res.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain' }).end('method not allowed\n');
      return;
    }
    const fail = (e: unknown) => {
      ep.log.error({ err: e, path }, 'HTTP handler failed');
      if (!res.headersSent) res.writeHead(500, { 'content-type': 'text/plain' });
      res.end('internal error\n');
    };
    switch (path) {
      case '/healthz':
        // answered from the event loop: if this arrives, the loop turns
        res.writeHead(200, { 'content-type': 'text/plain' }).end('ok\n');
        return;
      case '/readyz':
        ep.readiness().then((r) => {
          const body = r.ready ? 'ready\n' : `not ready: ${r.reasons.join('; ')}\n`;
          res.writeHead(r.ready ? 200 : 503, { 'content-type': 'text/plain' }).end(body);
        }, fail);
        return;
      case '/metrics':
        ep.metrics().then((m) => res.writeHead(200, { 'content-type': m.contentType }).end(m.body), fail);
        return;
      default:
        res.writeHead(404, { 'content-type': 'text/plain' }).end('not found: try /healthz, /readyz or /metrics\n');
    }
  });
  server.keepAliveTimeout = 5000;
  server.headersTimeout = 10_000;
  server.requestTimeout = 10_000;
  const shown = addr.host.includes(':') ? `[${addr.host}]:${addr.port}` : `${addr.host}:${addr.port}`;
  return new Promise((resolve, reject) => {
    server.once('error', (e: NodeJS.ErrnoException) => {
      const hint =
        e.code === 'EADDRINUSE'
          ? 'another process holds this port: stop it or choose another port'
          : e.code === 'EADDRNOTAVAIL'
            ? 'no interface of this host has that address: use 127.0.0.1, 0.0.0.0 or one of its addresses'
            : e.code === 'EACCES'
              ? 'a port below 1024 needs root or CAP_NET_BIND_SERVICE: choose a higher port'
              : 'check the address';
      reject(new Error(`HTTP listen ${shown}: ${e.code ?? e.message}: ${hint} (--http-listen / VMPOD_HTTP_LISTEN)`));
    });
    server.listen(addr.port, addr.host, () => {
      const a = server.address();
      const port = typeof a === 'object' && a ? a.port : addr.port;
      server.on('error', (e) => ep.log.error({ err: e }, 'HTTP server error'));
      resolve({
        host: addr.host,
        port,
        close: () =>
          new Promise<void>((r) => {
            server.close(() => r());
            server.closeAllConnections();
          }),
      });
    });
  });
}
