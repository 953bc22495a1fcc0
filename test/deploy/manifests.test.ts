// deploy/ as a cluster admin applies it: `kubectl kustomize` builds each kustomization (deploy/ and the Virtlet
// overlay deploy/virtlet/ on a Virtlet-shaped DaemonSet), and every object it yields validates against the Kubernetes
// API schema, offline (kubernetes-models: the API's OpenAPI schemas compiled to validators). Then the facts an admin
// relies on: where it runs, what it mounts, its probes, its images.
import { cpSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { ConfigMap } from 'kubernetes-models/v1/ConfigMap';
import { DaemonSet } from 'kubernetes-models/apps/v1/DaemonSet';
import { IoK8sApiCoreV1Container as Container } from 'kubernetes-models/v1/Container';
import { REPO } from '../helpers/daemon.js';
import { containerImages, kustomize, parseDocs, type KubeDoc } from '../helpers/kubeplay.js';
import { parseEnvFile } from '../../src/devices/report.js';
import { DEFAULTS } from '../../src/vmwrapper/probe.js';

/** The validators of the kinds deploy/ ships; any other kind is an error (it would need a validator here). */
const MODELS: Record<string, new (data: never) => { validate(): void }> = {
  'v1/ConfigMap': ConfigMap,
  'apps/v1/DaemonSet': DaemonSet,
};

function validate(doc: KubeDoc): void {
  const key = `${doc.apiVersion}/${doc.kind}`;
  const Model = MODELS[key];
  if (Model === undefined)
    throw new Error(`${key} ${doc.metadata?.name}: no schema validator for this kind in the test`);
  new Model(doc as never).validate();
}

interface Mount {
  name: string;
  mountPath: string;
  mountPropagation?: string;
  readOnly?: boolean;
}
interface Probe {
  exec?: { command: string[] };
  httpGet?: { path: string; port: number | string };
  initialDelaySeconds?: number;
  periodSeconds?: number;
  failureThreshold?: number;
}
interface Ctr {
  name: string;
  image: string;
  command?: string[];
  envFrom?: { configMapRef?: { name: string } }[];
  env?: { name: string; value?: string }[];
  securityContext?: { privileged?: boolean };
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> };
  ports?: { name?: string; containerPort: number; protocol?: string }[];
  readinessProbe?: Probe;
  livenessProbe?: Probe;
  startupProbe?: Probe;
  volumeMounts: Mount[];
}
interface PodSpec {
  nodeSelector?: Record<string, string>;
  hostNetwork?: boolean;
  hostPID?: boolean;
  terminationGracePeriodSeconds?: number;
  containers: Ctr[];
  volumes: { name: string; hostPath?: { path: string; type?: string }; configMap?: { name: string } }[];
}

function daemonSet(
  docs: KubeDoc[],
  name: string,
): { metadata: { namespace?: string }; spec: { template: { spec: PodSpec } } } {
  const ds = docs.find((d) => d.kind === 'DaemonSet' && d.metadata?.name === name);
  if (ds === undefined)
    throw new Error(`no DaemonSet ${name} in ${docs.map((d) => `${d.kind}/${d.metadata?.name}`).join(', ')}`);
  return ds as never;
}

function container(spec: PodSpec, name: string): Ctr {
  const c = spec.containers.find((x) => x.name === name);
  if (c === undefined) throw new Error(`no container ${name}`);
  return c;
}

/** mountPath -> the host path (or ConfigMap) and propagation behind it, through the pod's volumes. */
function hostMounts(
  spec: PodSpec,
  c: Ctr,
): Record<string, { host?: string; configMap?: string; propagation?: string; readOnly?: boolean }> {
  const out: Record<string, { host?: string; configMap?: string; propagation?: string; readOnly?: boolean }> = {};
  for (const m of c.volumeMounts) {
    const v = spec.volumes.find((x) => x.name === m.name);
    if (v?.hostPath === undefined && v?.configMap === undefined)
      throw new Error(`container ${c.name}: mount ${m.mountPath} has no hostPath or configMap volume ${m.name}`);
    out[m.mountPath] = {
      ...(v.hostPath ? { host: v.hostPath.path } : { configMap: v.configMap!.name }),
      ...(m.mountPropagation ? { propagation: m.mountPropagation } : {}),
      ...(m.readOnly ? { readOnly: true } : {}),
    };
  }
  return out;
}

const VERSION = (JSON.parse(readFileSync(join(REPO, 'package.json'), 'utf8')) as { version: string }).version;

/** What tapmanager needs from the node, wherever its container runs (deploy/ or the Virtlet overlay). */
function expectTapmanager(spec: PodSpec, docs: KubeDoc[]): void {
  const tm = container(spec, 'tapmanager');
  expect(tm.image).toBe(`localhost/vmpod-node/tapmanager:${VERSION}`);
  expect(tm.securityContext?.privileged).toBe(true);
  expect(tm.resources?.requests).toMatchObject({ cpu: expect.any(String), memory: expect.any(String) });
  expect(hostMounts(spec, tm)).toMatchObject({
    '/var/lib/virtlet': { host: '/var/lib/virtlet' },
    '/var/run/netns': { host: '/var/run/netns', propagation: 'Bidirectional' },
    '/var/lib/cni': { host: '/var/lib/cni' },
    '/var/lib/vmpod-node': { host: '/var/lib/vmpod-node' },
    '/etc/cni/net.d': { host: '/etc/cni/net.d', readOnly: true },
    '/opt/cni/bin': { host: '/opt/cni/bin', readOnly: true },
    '/dev': { host: '/dev' },
    '/sys': { host: '/sys' },
    // what the node's CNI plugins talk to: the dhcp daemon, flannel, Multus, Calico, Cilium (each dir alone)
    '/run/cni': { host: '/run/cni' },
    '/run/flannel': { host: '/run/flannel' },
    '/run/multus': { host: '/run/multus' },
    '/run/calico': { host: '/var/run/calico' },
    '/run/cilium': { host: '/var/run/cilium' },
    '/var/lib/calico': { host: '/var/lib/calico', readOnly: true },
  });
  // not the whole of /run: its netns mounts would be copied in (EBUSY on release after a restart)
  expect(Object.keys(hostMounts(spec, tm))).not.toContain('/run');
  // settings from the ConfigMap; its socket path is under the mounted /var/lib/virtlet
  const cmName = tm.envFrom?.[0]?.configMapRef?.name;
  const cm = docs.find((d) => d.kind === 'ConfigMap' && d.metadata?.name === cmName) as
    | { data: Record<string, string> }
    | undefined;
  expect(cm, `ConfigMap ${cmName}`).toBeDefined();
  const data = (cm as { data: Record<string, string> }).data;
  expect(data['VIRTLET_FD_SERVER_SOCKET_PATH']).toBe('/var/lib/virtlet/tapfdserver.sock');
  expect(data).toMatchObject({
    VIRTLET_CNI_CONFIG_DIR: '/etc/cni/net.d',
    VIRTLET_CNI_PLUGIN_DIR: '/opt/cni/bin',
    VMPOD_CNI_CACHE_DIR: '/var/lib/cni',
    VMPOD_STATE_DIR: '/var/lib/vmpod-node',
  });
  // probes: exec `tapctl status --ready`; /healthz on the container port `metrics`, the port VMPOD_HTTP_LISTEN
  // names on every address (hostNetwork: kubelet probes the node's address, never loopback)
  expect(tm.readinessProbe?.exec?.command).toEqual(['tapctl', 'status', '--ready']);
  const listen = /^(.*):(\d+)$/.exec(data['VMPOD_HTTP_LISTEN'] ?? '');
  expect(listen?.[1]).toMatch(/^(0\.0\.0\.0|\[::\])$/);
  expect(tm.ports).toEqual([{ name: 'metrics', containerPort: Number(listen?.[2]), protocol: 'TCP' }]);
  expect(tm.livenessProbe?.httpGet).toEqual({ path: '/healthz', port: 'metrics' });
  expect(tm.startupProbe?.httpGet).toEqual({ path: '/healthz', port: 'metrics' });
  // the start-up window (restore included) is longer than the liveness probe's patience
  expect((tm.startupProbe?.periodSeconds ?? 10) * (tm.startupProbe?.failureThreshold ?? 3)).toBeGreaterThanOrEqual(120);
  // a graceful stop waits for a CNI plugin at its 60 s timeout
  expect(spec.terminationGracePeriodSeconds).toBeGreaterThan(Number(data['VMPOD_CNI_TIMEOUT_MS']) / 1000);
}

describe('deploy/ manifests', () => {
  const tmp: string[] = [];
  afterAll(() => {
    for (const d of tmp) rmSync(d, { recursive: true, force: true });
  });

  it('deploy/: a ConfigMap and a DaemonSet that validate against the Kubernetes API schema', async () => {
    const docs = await kustomize('deploy');
    expect(docs.map((d) => `${d.apiVersion}/${d.kind}/${d.metadata?.name}`).sort()).toEqual([
      'apps/v1/DaemonSet/vmpod-node',
      'v1/ConfigMap/vmpod-node-config',
      'v1/ConfigMap/vmpod-node-vmwrapper',
    ]);
    for (const d of docs) validate(d);

    const ds = daemonSet(docs, 'vmpod-node');
    const spec = ds.spec.template.spec;
    expect(ds.metadata.namespace).toBe('kube-system');
    expect(docs.every((d) => (d.metadata as { namespace?: string }).namespace === 'kube-system')).toBe(true);
    expect(spec.nodeSelector).toEqual({ 'vmpod-node/enabled': 'true' });
    expect(spec.hostNetwork).toBe(true);
    expect(spec.hostPID).toBe(true);
    expect(spec.containers.map((c) => c.name)).toEqual(['tapmanager', 'libvirt']);
    expectTapmanager(spec, docs);

    const lv = container(spec, 'libvirt');
    expect(lv.image).toBe(`localhost/vmpod-node/libvirt:${VERSION}`);
    expect(lv.securityContext?.privileged).toBe(true);
    expect(lv.command).toBeUndefined(); // the image's tini + libvirtd
    expect(lv.resources?.requests).toMatchObject({ cpu: expect.any(String), memory: expect.any(String) });
    expect(lv.resources?.limits).toBeUndefined(); // qemu counts against it until vmwrapper moves it out
    expect(hostMounts(spec, lv)).toMatchObject({
      '/var/lib/virtlet': { host: '/var/lib/virtlet' }, // vmwrapper reaches tapmanager's socket here
      '/var/run/libvirt': { host: '/var/run/libvirt' },
      '/var/lib/libvirt': { host: '/var/lib/libvirt' },
      '/var/log/libvirt': { host: '/var/log/libvirt' },
      '/etc/libvirt/qemu': { host: '/etc/libvirt/qemu' },
      '/dev': { host: '/dev' },
      '/sys/fs/cgroup': { host: '/sys/fs/cgroup' },
      // devices.md: kubelet's PodResources API and the CDI spec dirs
      '/var/lib/kubelet/pod-resources': { host: '/var/lib/kubelet/pod-resources' },
      '/etc/cdi': { host: '/etc/cdi', readOnly: true },
      '/var/run/cdi': { host: '/var/run/cdi', readOnly: true },
    });
    expectVmwrapperSettings(spec, lv, docs);
    expect(lv.readinessProbe?.exec?.command).toEqual(['virsh', '-r', '-c', 'qemu:///system', 'version']);
    expect(lv.livenessProbe?.exec?.command).toEqual(['virsh', '-r', '-c', 'qemu:///system', 'version']);
    expect(lv.startupProbe?.exec?.command).toEqual(['virsh', '-r', '-c', 'qemu:///system', 'version']);
  });

  it("deploy/monitoring/podmonitor.yaml scrapes the DaemonSet's pods on their `metrics` port", async () => {
    const [pm] = parseDocs(
      readFileSync(join(REPO, 'deploy/monitoring/podmonitor.yaml'), 'utf8'),
      'podmonitor.yaml',
    ) as unknown as {
      apiVersion: string;
      kind: string;
      metadata: { namespace: string };
      spec: {
        selector: { matchLabels: Record<string, string> };
        namespaceSelector: { matchNames: string[] };
        podMetricsEndpoints: { port: string; path: string }[];
      };
    }[];
    expect(`${pm!.apiVersion}/${pm!.kind}`).toBe('monitoring.coreos.com/v1/PodMonitor');
    const docs = await kustomize('deploy');
    const ds = daemonSet(docs, 'vmpod-node') as unknown as {
      metadata: { namespace: string };
      spec: { template: { metadata: { labels: Record<string, string> }; spec: PodSpec } };
    };
    expect(ds.spec.template.metadata.labels).toMatchObject(pm!.spec.selector.matchLabels);
    expect(pm!.spec.namespaceSelector.matchNames).toEqual([ds.metadata.namespace]);
    expect(pm!.spec.podMetricsEndpoints).toEqual([expect.objectContaining({ port: 'metrics', path: '/metrics' })]);
    expect(container(ds.spec.template.spec, 'tapmanager').ports?.map((p) => p.name)).toContain('metrics');
  });

  it('the schema validation rejects what the API server would: a container without a name, a port as an object', () => {
    expect(() => new Container({ image: 'x' } as never).validate()).toThrow(/must have required property name/);
    const bad = structuredClone(daemonSetTemplate());
    (bad.spec.template.spec.containers[0] as unknown as { ports: unknown }).ports = [{ containerPort: { n: 1 } }];
    expect(() => validate(bad as unknown as KubeDoc)).toThrow(/containerPort must be integer/);
  });

  it("deploy/virtlet/: Virtlet's DaemonSet gets our tapmanager sidecar and our libvirt container, and validates", async () => {
    // as an admin does it: Virtlet's manifest (here a Virtlet-shaped stand-in) saved as deploy/virtlet/virtlet-ds.yaml
    const root = mkdtempSync(join(tmpdir(), 'vmpod-kust-'));
    tmp.push(root);
    cpSync(join(REPO, 'deploy'), join(root, 'deploy'), { recursive: true });
    cpSync(join(REPO, 'test/fixtures/virtlet/virtlet-ds.yaml'), join(root, 'deploy/virtlet/virtlet-ds.yaml'));
    const docs = await kustomize(join(root, 'deploy/virtlet'));
    expect(docs.map((d) => `${d.kind}/${d.metadata?.name}`).sort()).toEqual([
      'ConfigMap/vmpod-node-config',
      'ConfigMap/vmpod-node-vmwrapper',
      'DaemonSet/virtlet',
    ]);
    for (const d of docs) validate(d);

    const spec = daemonSet(docs, 'virtlet').spec.template.spec;
    expect(spec.containers.map((c) => c.name).sort()).toEqual(['libvirt', 'tapmanager', 'virtlet', 'vms']);
    expectTapmanager(spec, docs);
    const lv = container(spec, 'libvirt');
    expect(lv.image).toBe(`localhost/vmpod-node/libvirt:${VERSION}`);
    expect(lv.command).toEqual(['/usr/bin/tini', '--', 'libvirtd']);
    expect(lv.readinessProbe?.exec?.command).toEqual(['virsh', '-r', '-c', 'qemu:///system', 'version']);
    // Virtlet's own mounts of the libvirt container stay; ours are added (vmwrapper's settings, the device inputs)
    expect(lv.volumeMounts.map((m) => m.mountPath).sort()).toEqual(
      [
        '/run',
        '/var/lib/virtlet',
        '/var/lib/libvirt',
        '/var/run/libvirt',
        '/dev',
        '/etc/vmpod-node',
        '/var/lib/kubelet/pod-resources',
        '/etc/cdi',
      ].sort(),
    );
    expectVmwrapperSettings(spec, lv, docs);
    expect(container(spec, 'virtlet').env).toContainEqual({ name: 'VIRTLET_EXTERNAL_TAPMANAGER', value: 'true' });
    expect(containerImages(docs)).toMatchObject({ virtlet: 'mirantis/virtlet', vms: 'mirantis/virtlet' });
  });
});

/** The libvirt container reads VMPOD_VM_CGROUP from the settings ConfigMap, mounted where vmwrapper looks. */
function expectVmwrapperSettings(spec: PodSpec, lv: Ctr, docs: KubeDoc[]): void {
  const m = hostMounts(spec, lv)['/etc/vmpod-node'];
  expect(m).toEqual({ configMap: 'vmpod-node-vmwrapper', readOnly: true });
  const cm = docs.find((d) => d.kind === 'ConfigMap' && d.metadata?.name === m?.configMap) as
    | { data: Record<string, string> }
    | undefined;
  expect(parseEnvFile(cm?.data['vmwrapper.env'] ?? '')).toEqual({ VMPOD_VM_CGROUP: '/vmpod-vms' });
  expect(DEFAULTS.envFile).toBe('/etc/vmpod-node/vmwrapper.env');
}

function daemonSetTemplate(): {
  spec: {
    selector?: unknown;
    template: { metadata?: { labels?: Record<string, string> }; spec: { containers: object[] } };
  };
} & KubeDoc {
  return {
    apiVersion: 'apps/v1',
    kind: 'DaemonSet',
    metadata: { name: 'x' },
    spec: {
      selector: { matchLabels: { a: 'b' } },
      template: { metadata: { labels: { a: 'b' } }, spec: { containers: [{ name: 'c', image: 'i' }] } },
    },
  };
}
