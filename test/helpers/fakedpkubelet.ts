// A fake kubelet for device plugins, on the plugin API's own .proto (proto/kubelet/deviceplugin/v1beta1): a
// Registration server on <dir>/kubelet.sock that, as kubelet does, dials each plugin that registers and keeps its
// ListAndWatch stream open; and a client of the plugin's DevicePlugin service for the tests' own calls. restart()
// does what a kubelet restart does to the dir: every socket in it removed, kubelet.sock made again.
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as loader from '@grpc/proto-loader';
import { protoPath } from '../../src/devices/kubelet.js';

export interface DeviceMsg {
  ID: string;
  health: string;
  topology: { nodes: { ID: number }[] } | null;
}

export interface RegisterRequest {
  version: string;
  endpoint: string;
  resource_name: string;
  options: { pre_start_required: boolean; get_preferred_allocation_available: boolean };
}

export interface ContainerAllocateResponse {
  envs: Record<string, string>;
  mounts: unknown[];
  devices: { container_path: string; host_path: string; permissions: string }[];
  annotations: Record<string, string>;
  cdi_devices: { name: string }[];
}

type Callback<T> = (e: grpc.ServiceError | null, r?: T) => void;
interface DevicePluginClient extends grpc.Client {
  GetDevicePluginOptions(req: object, cb: Callback<RegisterRequest['options']>): void;
  ListAndWatch(req: object): grpc.ClientReadableStream<{ devices: DeviceMsg[] }>;
  GetPreferredAllocation(req: object, cb: Callback<{ container_responses: { deviceIDs: string[] }[] }>): void;
  Allocate(req: object, cb: Callback<{ container_responses: ContainerAllocateResponse[] }>): void;
  PreStartContainer(req: object, cb: Callback<object>): void;
}
interface Api {
  v1beta1: {
    Registration: { service: grpc.ServiceDefinition };
    DevicePlugin: new (target: string, creds: grpc.ChannelCredentials) => DevicePluginClient;
  };
}

let api: Api | undefined;
function loadApi(): Api {
  api ??= grpc.loadPackageDefinition(
    loader.loadSync(protoPath('proto/kubelet/deviceplugin/v1beta1/api.proto'), {
      keepCase: true,
      longs: Number,
      defaults: true,
      arrays: true,
    }),
  ) as unknown as Api;
  return api;
}

const call = <T>(fn: (cb: Callback<T>) => void) =>
  new Promise<T>((resolve, reject) => fn((e, r) => (e ? reject(e) : resolve(r!))));

/** Waits for `check` to return a value (not undefined), polling every 20 ms, up to `ms`. */
export async function waitFor<T>(what: string, check: () => T | undefined, ms = 60_000): Promise<T> {
  const until = Date.now() + ms;
  for (;;) {
    const v = check();
    if (v !== undefined) return v;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

/** A client of one plugin socket: the calls kubelet makes. */
export class PluginClient {
  readonly client: DevicePluginClient;
  /** every list received on this client's ListAndWatch, in order */
  readonly lists: DeviceMsg[][] = [];
  #stream: grpc.ClientReadableStream<{ devices: DeviceMsg[] }> | undefined;
  ended = false;

  constructor(readonly socket: string) {
    this.client = new (loadApi().v1beta1.DevicePlugin)(`unix://${socket}`, grpc.credentials.createInsecure());
  }

  options() {
    return call<RegisterRequest['options']>((cb) => this.client.GetDevicePluginOptions({}, cb));
  }

  watch(): this {
    this.#stream = this.client.ListAndWatch({});
    this.#stream.on('data', (m: { devices: DeviceMsg[] }) => this.lists.push(m.devices));
    this.#stream.on('error', () => (this.ended = true));
    this.#stream.on('end', () => (this.ended = true));
    return this;
  }

  /** The last list, once it satisfies `ok`. */
  nextList(ok: (devices: DeviceMsg[]) => boolean, what = 'a ListAndWatch update'): Promise<DeviceMsg[]> {
    return waitFor(what, () => {
      const last = this.lists[this.lists.length - 1];
      return last !== undefined && ok(last) ? last : undefined;
    });
  }

  preferred(reqs: { available: string[]; mustInclude?: string[]; size: number }[]) {
    const container_requests = reqs.map((r) => ({
      available_deviceIDs: r.available,
      must_include_deviceIDs: r.mustInclude ?? [],
      allocation_size: r.size,
    }));
    return call<{ container_responses: { deviceIDs: string[] }[] }>((cb) =>
      this.client.GetPreferredAllocation({ container_requests }, cb),
    ).then((r) => r.container_responses.map((c) => c.deviceIDs));
  }

  allocate(containers: string[][]) {
    return call<{ container_responses: ContainerAllocateResponse[] }>((cb) =>
      this.client.Allocate({ container_requests: containers.map((ids) => ({ devices_ids: ids })) }, cb),
    ).then((r) => r.container_responses);
  }

  preStart(ids: string[]) {
    return call<object>((cb) => this.client.PreStartContainer({ devices_ids: ids }, cb));
  }

  close(): void {
    this.#stream?.cancel();
    this.client.close();
  }
}

export class FakeDpKubelet {
  readonly socket: string;
  readonly registrations: RegisterRequest[] = [];
  /** the plugin clients kubelet opened on Register, by resource (the latest) */
  readonly plugins = new Map<string, PluginClient>();
  /** when set, Register answers with this error (as kubelet refusing a version or a taken name) */
  refuse: { code: grpc.status; details: string } | undefined;
  #server: grpc.Server | undefined;

  constructor(readonly dir: string) {
    this.socket = path.join(dir, 'kubelet.sock');
  }

  async start(): Promise<void> {
    const server = new grpc.Server();
    server.addService(loadApi().v1beta1.Registration.service, {
      Register: (c: grpc.ServerUnaryCall<RegisterRequest, object>, cb: grpc.sendUnaryData<object>) => {
        this.registrations.push(c.request);
        if (this.refuse) return cb({ ...this.refuse, name: 'Error', message: this.refuse.details }, null);
        cb(null, {});
        // as kubelet: dial the plugin's endpoint in this dir and keep its ListAndWatch open
        this.plugins.get(c.request.resource_name)?.close();
        this.plugins.set(c.request.resource_name, new PluginClient(path.join(this.dir, c.request.endpoint)).watch());
      },
    });
    await new Promise<void>((resolve, reject) =>
      server.bindAsync(`unix://${this.socket}`, grpc.ServerCredentials.createInsecure(), (e) =>
        e ? reject(e) : resolve(),
      ),
    );
    this.#server = server;
  }

  /** The Register calls for `resource` so far, once there are at least `n`. */
  registered(resource: string, n = 1): Promise<RegisterRequest[]> {
    return waitFor(`${n} registration(s) of ${resource}`, () => {
      const r = this.registrations.filter((x) => x.resource_name === resource);
      return r.length >= n ? r : undefined;
    });
  }

  /** kubelet's own client of a resource's plugin, once it registered. */
  plugin(resource: string): Promise<PluginClient> {
    return waitFor(`kubelet's client of ${resource}`, () => this.plugins.get(resource));
  }

  stop(): void {
    for (const p of this.plugins.values()) p.close();
    this.plugins.clear();
    this.#server?.forceShutdown();
    this.#server = undefined;
    fs.rmSync(this.socket, { force: true });
  }

  /** A kubelet restart: it goes, every socket of the dir is removed, and it comes back with a new kubelet.sock. */
  async restart(): Promise<void> {
    this.stop();
    for (const f of fs.readdirSync(this.dir))
      if (fs.lstatSync(path.join(this.dir, f)).isSocket()) fs.rmSync(path.join(this.dir, f));
    await this.start();
  }

  close(): void {
    this.stop();
    fs.rmSync(this.dir, { recursive: true, force: true });
  }
}

export async function startFakeDpKubelet(opts: { start?: boolean } = {}): Promise<FakeDpKubelet> {
  const k = new FakeDpKubelet(fs.mkdtempSync(path.join(os.tmpdir(), 'vmpod-dp-kubelet-')));
  if (opts.start !== false) await k.start();
  return k;
}
