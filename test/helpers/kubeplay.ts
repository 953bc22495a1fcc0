// deploy/ as `podman kube play` can run it on a shared test machine (docs/deploy.md, "Trying it without a cluster").
// podman 4.3's kube play knows Pod, Deployment and ConfigMap (used by a pod), not DaemonSet: the DaemonSet's pod
// template becomes a Pod. Every host path is either one of the node's own (shared on purpose: /dev, /sys, the netns
// dir) or rewritten to a private directory, so the test never touches the node's CNI config, libvirt or state.
// Pure: documents in, documents out.
import { execa } from 'execa';
import { parseAllDocuments } from 'yaml';
import { ErrorCode, VmpodError } from '../../src/errors.js';
import { REPO } from './daemon.js';

export type KubeDoc = Record<string, unknown> & {
  apiVersion?: string;
  kind?: string;
  metadata?: { name?: string; labels?: Record<string, string> };
};

/** `kubectl kustomize DIR` (kustomize built into kubectl): the manifests an admin's `kubectl apply -k DIR` sends. */
export async function kustomize(dir: string): Promise<KubeDoc[]> {
  const r = await execa('kubectl', ['kustomize', dir], { cwd: REPO, timeout: 60_000, reject: false, stdin: 'ignore' });
  if (r.exitCode !== 0)
    throw new VmpodError(ErrorCode.Config, `kubectl kustomize ${dir}: exit ${r.exitCode}: ${r.stderr.trim()}`);
  return parseDocs(r.stdout, `kubectl kustomize ${dir}`);
}

/** Every non-empty document of a YAML stream; a YAML error names the source. */
export function parseDocs(text: string, source: string): KubeDoc[] {
  const out: KubeDoc[] = [];
  for (const d of parseAllDocuments(text)) {
    if (d.errors.length > 0)
      throw new VmpodError(ErrorCode.Config, `${source}: ${d.errors.map((e) => e.message).join('; ')}`);
    const v = d.toJS() as unknown;
    if (v !== null && v !== undefined) out.push(v as KubeDoc);
  }
  return out;
}

export interface KubePlayOptions {
  /** the Pod's name (unique per test: podman names the containers POD-CONTAINER) */
  podName: string;
  /** node path -> private host path; a node path missing here and from `sharedHostPaths` is an error */
  hostPaths: Record<string, string>;
  /** node paths the test shares with the machine on purpose */
  sharedHostPaths: readonly string[];
  /** ConfigMap data to override, by ConfigMap name */
  configMapData?: Record<string, Record<string, string>>;
  /** pod spec fields to set (shareProcessNamespace stands in for hostPID, which kube play ignores) */
  podSpec?: Record<string, unknown>;
  /** container ports to renumber (the manifests' port on a port of the test's own), with the probes that name them */
  ports?: Record<number, number>;
}

interface Port {
  name?: string;
  containerPort: number;
}
interface Probe {
  httpGet?: { port: number | string };
}
interface Container {
  name: string;
  ports?: Port[];
  startupProbe?: Probe;
  readinessProbe?: Probe;
  livenessProbe?: Probe;
}

interface Volume {
  name: string;
  hostPath?: { path: string; type?: string };
}

/** The ConfigMaps, and each DaemonSet's pod template as a Pod, with host paths rewritten (see KubePlayOptions). */
export function kubePlayDocs(docs: readonly KubeDoc[], o: KubePlayOptions): KubeDoc[] {
  const out: KubeDoc[] = [];
  for (const d of docs) {
    if (d.kind !== 'ConfigMap') continue;
    const cm = structuredClone(d) as KubeDoc & { data?: Record<string, string> };
    const name = cm.metadata?.name ?? '';
    if (o.configMapData?.[name]) cm.data = { ...cm.data, ...o.configMapData[name] };
    out.push(cm);
  }
  const sets = docs.filter((d) => d.kind === 'DaemonSet');
  if (sets.length !== 1) throw new VmpodError(ErrorCode.Config, `expected one DaemonSet, found ${sets.length}`);
  const ds = sets[0] as KubeDoc & {
    spec: { template: { metadata?: { labels?: Record<string, string> }; spec: { volumes?: Volume[] } } };
  };
  const spec = {
    ...structuredClone(ds.spec.template.spec),
    ...structuredClone(o.podSpec ?? {}),
  } as typeof ds.spec.template.spec & { containers?: Container[] };
  for (const c of spec.containers ?? []) {
    for (const p of c.ports ?? []) p.containerPort = o.ports?.[p.containerPort] ?? p.containerPort;
    // podman 4.3 refuses container ports with host networking ("PortMappings can only be used with Bridge"), where
    // kubelet only names them: a probe's port name becomes the number kubelet would resolve it to, and they go
    for (const probe of [c.startupProbe, c.readinessProbe, c.livenessProbe]) {
      const named = probe?.httpGet?.port;
      if (typeof named !== 'string') continue;
      const n = c.ports?.find((p) => p.name === named)?.containerPort;
      if (n === undefined)
        throw new VmpodError(
          ErrorCode.Config,
          `container ${c.name}: a probe names port ${named}, which it does not declare`,
        );
      probe!.httpGet!.port = n;
    }
    delete c.ports;
  }
  for (const v of spec.volumes ?? []) {
    if (v.hostPath === undefined) continue;
    const node = v.hostPath.path;
    const mapped = o.hostPaths[node];
    if (mapped !== undefined) v.hostPath.path = mapped;
    else if (!o.sharedHostPaths.includes(node)) {
      throw new VmpodError(
        ErrorCode.Config,
        `volume ${v.name}: host path ${node} is neither mapped to a private dir nor shared on purpose`,
      );
    }
  }
  out.push({
    apiVersion: 'v1',
    kind: 'Pod',
    metadata: { name: o.podName, labels: ds.spec.template.metadata?.labels ?? {} },
    spec,
  });
  return out;
}

/** The images a DaemonSet's containers use, by container name. */
export function containerImages(docs: readonly KubeDoc[]): Record<string, string> {
  const out: Record<string, string> = {};
  for (const d of docs) {
    if (d.kind !== 'DaemonSet') continue;
    const containers = (d as { spec: { template: { spec: { containers: { name: string; image: string }[] } } } }).spec
      .template.spec.containers;
    for (const c of containers) out[c.name] = c.image;
  }
  return out;
}
