// The gRPC client of kubelet's PodResources API (v1.PodResourcesLister), over its Unix socket. Imported
// dynamically, only when a pod's devices are to be looked up there: @grpc/grpc-js and the .proto loader cost a
// VM start nothing otherwise (they are not in the vmwrapper bundle either: scripts/bundle.mjs keeps them external).
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ErrorCode, VmpodError } from '../errors.js';
import type { PodResourcesMsg, PodResourcesTarget } from './podresources.js';

const PROTO = 'proto/kubelet/podresources/v1/api.proto';

/**
 * A .proto of proto/ (PodResources by default; the device plugin API too): they ship at the package root, and this
 * module runs from src/, dist/ or dist/bundle/.
 */
export function protoPath(rel: string = PROTO, from = dirname(fileURLToPath(import.meta.url))): string {
  for (let dir = from; ; dir = dirname(dir)) {
    const p = join(dir, rel);
    if (existsSync(p)) return p;
    if (dirname(dir) === dir) throw new VmpodError(ErrorCode.Internal, `${rel} not found above ${from}`);
  }
}

/** grpc status codes we act on (grpc's status.proto). */
const Status = { UNKNOWN: 2, DEADLINE_EXCEEDED: 4, UNIMPLEMENTED: 12, RESOURCE_EXHAUSTED: 8, UNAVAILABLE: 14 } as const;

interface GrpcError extends Error {
  code?: number;
  details?: string;
}

type Unary = (req: object, opts: { deadline: Date }, cb: (err: GrpcError | null, res?: unknown) => void) => void;
interface ListerClient {
  Get: Unary;
  List: Unary;
  close(): void;
}

export interface PodResourcesAnswer {
  pods: PodResourcesMsg[];
  /** which method answered: Get, or List where Get is unimplemented (before 1.27) or disabled (gate off, 1.27-1.33) */
  via: 'Get' | 'List';
}

const RATE_LIMIT_RETRIES = 3;
const RATE_LIMIT_PAUSE_MS = 100;

/** A failed PodResources call as the one line vmwrapper prints: what was asked, and why it failed. */
function callError(t: PodResourcesTarget, pod: string, method: string, e: GrpcError): VmpodError {
  const why =
    e.code === Status.DEADLINE_EXCEEDED
      ? `kubelet did not answer within ${t.timeoutMs} ms (${POD_RESOURCES_HINT})`
      : e.code === Status.UNAVAILABLE
        ? `cannot reach kubelet (${e.details ?? e.message})`
        : (e.details ?? e.message);
  return new VmpodError(
    ErrorCode.Device,
    `ask kubelet's PodResources API (${t.socket}) for the devices of ${pod}: ${method}: ${why}`,
  );
}

/** Asks kubelet for the pod's resources: Get, falling back to List. Every call has a deadline. */
export async function fetchPodResources(t: PodResourcesTarget): Promise<PodResourcesAnswer> {
  const [grpc, loader] = await Promise.all([import('@grpc/grpc-js'), import('@grpc/proto-loader')]);
  const def = loader.loadSync(protoPath(), { keepCase: true, longs: String, defaults: true, arrays: true });
  const pkg = grpc.loadPackageDefinition(def) as unknown as {
    v1: { PodResourcesLister: new (target: string, creds: unknown) => ListerClient };
  };
  const client = new pkg.v1.PodResourcesLister(`unix://${t.socket}`, grpc.credentials.createInsecure());
  const pod = `pod ${t.podNamespace}/${t.podName}`;
  const deadlineAt = Date.now() + t.timeoutMs;
  const call = (method: 'Get' | 'List', req: object) =>
    new Promise<unknown>((resolve, reject) => {
      const attempt = (left: number) =>
        client[method](req, { deadline: new Date(deadlineAt) }, (err, res) => {
          // recent kubelets rate-limit the endpoint: a short pause, then again (within the same deadline)
          if (
            err &&
            err.code === Status.RESOURCE_EXHAUSTED &&
            left > 0 &&
            Date.now() + RATE_LIMIT_PAUSE_MS < deadlineAt
          )
            setTimeout(() => attempt(left - 1), RATE_LIMIT_PAUSE_MS);
          else if (err) reject(err);
          else resolve(res);
        });
      attempt(RATE_LIMIT_RETRIES);
    });
  const fail = (method: string, e: GrpcError) => callError(t, pod, method, e);
  try {
    try {
      const res = (await call('Get', { pod_name: t.podName, pod_namespace: t.podNamespace })) as {
        pod_resources?: PodResourcesMsg | null;
      };
      if (res.pod_resources == null)
        throw new VmpodError(
          ErrorCode.Device,
          `ask kubelet's PodResources API (${t.socket}): Get answered without the pod's resources for ${pod}`,
        );
      return { pods: [res.pod_resources], via: 'Get' };
    } catch (e) {
      const g = e as GrpcError;
      const noGet =
        g.code === Status.UNIMPLEMENTED ||
        (g.code === Status.UNKNOWN && /Get method disabled/i.test(g.details ?? g.message));
      if (!noGet) {
        if (g.code === Status.UNKNOWN && /not found/i.test(g.details ?? g.message))
          throw new VmpodError(
            ErrorCode.Device,
            `kubelet's PodResources API (${t.socket}) does not know ${pod} (${g.details ?? g.message}): check ` +
              `VMPOD_POD_NAME and VMPOD_POD_NAMESPACE`,
          );
        throw e instanceof VmpodError ? e : fail('Get', g);
      }
    }
    let res: { pod_resources?: PodResourcesMsg[] };
    try {
      res = (await call('List', {})) as { pod_resources?: PodResourcesMsg[] };
    } catch (e) {
      throw fail('List', e as GrpcError);
    }
    const pods = (res.pod_resources ?? []).filter((p) => p.name === t.podName && p.namespace === t.podNamespace);
    if (pods.length === 0)
      throw new VmpodError(
        ErrorCode.Device,
        `kubelet's PodResources API (${t.socket}) does not list ${pod}: check VMPOD_POD_NAME and VMPOD_POD_NAMESPACE`,
      );
    return { pods, via: 'List' };
  } finally {
    client.close();
  }
}

const POD_RESOURCES_HINT =
  "is the socket kubelet's, and is kubelet running? mount the directory /var/lib/kubelet/pod-resources, not the " +
  'socket file';
