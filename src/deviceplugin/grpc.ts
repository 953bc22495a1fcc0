// The gRPC edge: one DevicePlugin server per resource on its own Unix socket in kubelet's device-plugins dir, and
// the Register call to kubelet's Registration service, both on kubelet's device plugin API v1beta1
// (proto/kubelet/deviceplugin/v1beta1/api.proto, loaded with @grpc/proto-loader as the PodResources one is).
import { lstatSync, rmSync } from 'node:fs';
import { createConnection } from 'node:net';
import * as grpc from '@grpc/grpc-js';
import * as loader from '@grpc/proto-loader';
import { protoPath } from '../devices/kubelet.js';

export const DEVICE_PLUGIN_PROTO = 'proto/kubelet/deviceplugin/v1beta1/api.proto';
export const API_VERSION = 'v1beta1';

interface Pkg {
  v1beta1: {
    DevicePlugin: { service: grpc.ServiceDefinition };
    Registration: new (
      target: string,
      creds: grpc.ChannelCredentials,
      options: grpc.ChannelOptions,
    ) => grpc.Client & {
      Register(req: object, opts: grpc.CallOptions, cb: (e: grpc.ServiceError | null) => void): void;
    };
  };
}

let pkg: Pkg | undefined;
/** The API's package, loaded once (keepCase: the messages' own field names, as kubelet sends them). */
export function devicePluginApi(): Pkg {
  pkg ??= grpc.loadPackageDefinition(
    loader.loadSync(protoPath(DEVICE_PLUGIN_PROTO), { keepCase: true, longs: Number, defaults: true, arrays: true }),
  ) as unknown as Pkg;
  return pkg;
}

export interface DeviceMsg {
  ID: string;
  health: string;
  topology?: { nodes: { ID: number }[] };
}

/** What one resource's server answers; a thrown GrpcFailure becomes the call's status. */
export interface DevicePluginHandlers {
  /** the current list, sent first on every ListAndWatch */
  list(): DeviceMsg[];
  preferred(req: {
    container_requests: { available_deviceIDs: string[]; must_include_deviceIDs: string[]; allocation_size: number }[];
  }): object;
  allocate(req: { container_requests: { devices_ids: string[] }[] }): object;
}

export class GrpcFailure extends Error {
  constructor(
    readonly code: grpc.status,
    message: string,
  ) {
    super(message);
  }
}

export class SocketTakenError extends Error {
  constructor(readonly socket: string) {
    super(
      `another process serves on ${socket} (another vfio-device-plugin with a resource of the same name?): stop it, ` +
        `or rename the resource`,
    );
  }
}

/** Something accepts connections on the Unix socket `path` (a stale file refuses them: ECONNREFUSED). */
export function isServed(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const c = createConnection(path);
    const done = (served: boolean) => {
      c.destroy();
      resolve(served);
    };
    c.setTimeout(2000, () => done(true)); // accepted but silent is still served
    c.once('connect', () => done(true));
    c.once('error', () => done(false));
  });
}

/** A socket file's identity (inode and change time): a file made again under the same name has another. */
export function fileIdentity(path: string): string | undefined {
  try {
    const s = lstatSync(path);
    return `${s.dev}:${s.ino}:${s.ctimeMs}`;
  } catch {
    return undefined;
  }
}

type Unary<Q> = (call: grpc.ServerUnaryCall<Q, object>, cb: grpc.sendUnaryData<object>) => void;

function unary<Q>(fn: (req: Q) => object): Unary<Q> {
  return (call, cb) => {
    try {
      cb(null, fn(call.request));
    } catch (e) {
      if (e instanceof GrpcFailure)
        cb({ code: e.code, details: e.message, name: 'GrpcFailure', message: e.message }, null);
      else
        cb(
          { code: grpc.status.INTERNAL, details: (e as Error).message, name: 'Error', message: (e as Error).message },
          null,
        );
    }
  };
}

/** One resource's DevicePlugin server on `socket`. */
export class ResourceServer {
  #server: grpc.Server | undefined;
  #streams = new Set<grpc.ServerWritableStream<object, object>>();
  /** the identity of the socket this server made */
  #identity: string | undefined;

  constructor(
    readonly socket: string,
    private readonly handlers: DevicePluginHandlers,
  ) {}

  /**
   * Listens on a fresh socket. A stale file of an earlier run is removed first; a socket another process still
   * serves on is not: SocketTakenError (two plugins on one socket would take it from each other every tick).
   */
  async start(): Promise<void> {
    if (await isServed(this.socket)) throw new SocketTakenError(this.socket);
    rmSync(this.socket, { force: true });
    const server = new grpc.Server();
    server.addService(devicePluginApi().v1beta1.DevicePlugin.service, {
      GetDevicePluginOptions: unary(() => ({ pre_start_required: false, get_preferred_allocation_available: true })),
      ListAndWatch: (call: grpc.ServerWritableStream<object, object>) => {
        this.#streams.add(call);
        const drop = () => this.#streams.delete(call);
        call.on('cancelled', drop);
        call.on('close', drop);
        call.on('error', drop);
        call.write({ devices: this.handlers.list() });
      },
      GetPreferredAllocation: unary((req: Parameters<DevicePluginHandlers['preferred']>[0]) =>
        this.handlers.preferred(req),
      ),
      Allocate: unary((req: Parameters<DevicePluginHandlers['allocate']>[0]) => this.handlers.allocate(req)),
      PreStartContainer: unary(() => ({})),
    });
    await new Promise<void>((resolve, reject) =>
      server.bindAsync(`unix://${this.socket}`, grpc.ServerCredentials.createInsecure(), (e) =>
        e ? reject(e) : resolve(),
      ),
    );
    this.#server = server;
    this.#identity = fileIdentity(this.socket);
  }

  /** Our socket is still there: not removed, not replaced. */
  intact(): boolean {
    return this.#server !== undefined && this.#identity !== undefined && fileIdentity(this.socket) === this.#identity;
  }

  /** The whole list again to every ListAndWatch stream. */
  send(devices: DeviceMsg[]): void {
    for (const s of this.#streams) s.write({ devices });
  }

  get streams(): number {
    return this.#streams.size;
  }

  /** Ends the streams and the server; removes the socket if it is still the one this server made. */
  stop(): void {
    for (const s of this.#streams) s.end();
    this.#streams.clear();
    this.#server?.forceShutdown();
    this.#server = undefined;
    if (this.#identity !== undefined && fileIdentity(this.socket) === this.#identity)
      rmSync(this.socket, { force: true });
    this.#identity = undefined;
  }
}

/** grpc status codes after which a registration is tried again: kubelet not there (yet), or not answering. */
export function isRetryable(e: { code?: number }): boolean {
  return e.code === grpc.status.UNAVAILABLE || e.code === grpc.status.DEADLINE_EXCEEDED;
}

/** Register with kubelet: our socket's name (relative to its dir), the resource, GetPreferredAllocation offered. */
export function register(
  kubeletSocket: string,
  endpoint: string,
  resourceName: string,
  timeoutMs: number,
): Promise<void> {
  // a channel of its own (not grpc-js's shared subchannel pool): one to a kubelet.sock that is gone stays in its
  // reconnect backoff, and a new kubelet there would be reached only when that backoff ends
  const client = new (devicePluginApi().v1beta1.Registration)(
    `unix://${kubeletSocket}`,
    grpc.credentials.createInsecure(),
    { 'grpc.use_local_subchannel_pool': 1 },
  );
  const req = {
    version: API_VERSION,
    endpoint,
    resource_name: resourceName,
    options: { pre_start_required: false, get_preferred_allocation_available: true },
  };
  return new Promise<void>((resolve, reject) =>
    client.Register(req, { deadline: new Date(Date.now() + timeoutMs) }, (e) => {
      client.close();
      if (e) reject(e);
      else resolve();
    }),
  );
}
