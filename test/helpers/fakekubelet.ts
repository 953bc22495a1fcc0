// A fake kubelet PodResources server (v1.PodResourcesLister) on a Unix socket of its own, for the PodResources
// tests: Get answers, or answers as kubelets that lack it do (UNIMPLEMENTED before 1.27; UNKNOWN "PodResources API
// Get method disabled" with the gate off, 1.27-1.33); List answers; or nothing answers at all.
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as os from 'node:os';
import * as path from 'node:path';
import * as grpc from '@grpc/grpc-js';
import * as loader from '@grpc/proto-loader';
import { protoPath } from '../../src/devices/kubelet.js';
import type { PodResourcesMsg } from '../../src/devices/index.js';

export interface FakeKubelet {
  socket: string;
  /** methods called, in order */
  calls: string[];
  close(): Promise<void>;
}

type GetMode = 'ok' | 'unimplemented' | 'disabled';

export async function startFakeKubelet(pods: PodResourcesMsg[], get: GetMode = 'ok'): Promise<FakeKubelet> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmpod-kubelet-'));
  const socket = path.join(dir, 'kubelet.sock');
  const def = loader.loadSync(protoPath(), { keepCase: true, longs: String, defaults: true, arrays: true });
  const pkg = grpc.loadPackageDefinition(def) as unknown as {
    v1: { PodResourcesLister: { service: grpc.ServiceDefinition } };
  };
  const calls: string[] = [];
  const server = new grpc.Server();
  const fail = (code: grpc.status, details: string) => Object.assign(new Error(details), { code, details });
  server.addService(pkg.v1.PodResourcesLister.service, {
    List: (_call: grpc.ServerUnaryCall<object, object>, cb: grpc.sendUnaryData<object>) => {
      calls.push('List');
      cb(null, { pod_resources: pods });
    },
    Get: (
      call: grpc.ServerUnaryCall<{ pod_name: string; pod_namespace: string }, object>,
      cb: grpc.sendUnaryData<object>,
    ) => {
      calls.push('Get');
      if (get === 'unimplemented')
        return cb(fail(grpc.status.UNIMPLEMENTED, 'unknown method Get for service v1.PodResourcesLister'), null);
      if (get === 'disabled') return cb(fail(grpc.status.UNKNOWN, 'PodResources API Get method disabled'), null);
      const { pod_name: name, pod_namespace: ns } = call.request;
      const pod = pods.find((p) => p.name === name && p.namespace === ns);
      if (pod === undefined) return cb(fail(grpc.status.UNKNOWN, `pod ${name} in namespace ${ns} not found`), null);
      cb(null, { pod_resources: pod });
    },
    GetAllocatableResources: (_call: unknown, cb: grpc.sendUnaryData<object>) => cb(null, {}),
  });
  await new Promise<void>((resolve, reject) =>
    server.bindAsync(`unix://${socket}`, grpc.ServerCredentials.createInsecure(), (e) => (e ? reject(e) : resolve())),
  );
  return {
    socket,
    calls,
    close: async () => {
      server.forceShutdown();
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** A socket that accepts connections and never says a word (no HTTP/2): a call ends only through its deadline. */
export async function startSilentSocket(): Promise<FakeKubelet> {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmpod-kubelet-'));
  const socket = path.join(dir, 'kubelet.sock');
  const conns = new Set<net.Socket>();
  const server = net.createServer((c) => {
    conns.add(c);
    c.on('close', () => conns.delete(c));
    c.resume();
  });
  await new Promise<void>((r) => server.listen(socket, r));
  return {
    socket,
    calls: [],
    close: async () => {
      for (const c of conns) c.destroy();
      await new Promise<void>((r) => server.close(() => r()));
      fs.rmSync(dir, { recursive: true, force: true });
    },
  };
}
