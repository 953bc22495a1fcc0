// deploy/device-plugin/ as a cluster admin applies it: `kubectl kustomize` builds it, every object validates against
// the Kubernetes API schema offline (kubernetes-models), and the facts an admin relies on hold: kubelet's dir mounted
// as a directory, the node's sysfs, /dev and /proc under /host, the config file the ConfigMap holds is one the plugin
// accepts, every env var it sets exists.
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { ConfigMap } from 'kubernetes-models/v1/ConfigMap';
import { DaemonSet } from 'kubernetes-models/apps/v1/DaemonSet';
import { parseResources } from '../../src/deviceplugin/config.js';
import { DP_ENV_ONLY, DP_FLAGS, parseOptions } from '../../src/deviceplugin/options.js';
import { kustomize, type KubeDoc } from '../helpers/kubeplay.js';

interface Pod {
  hostNetwork?: boolean;
  containers: {
    name: string;
    image: string;
    envFrom?: { configMapRef: { name: string } }[];
    volumeMounts: { name: string; mountPath: string; readOnly?: boolean }[];
  }[];
  volumes: { name: string; hostPath?: { path: string; type?: string }; configMap?: { name: string } }[];
}

describe('deploy/device-plugin/', () => {
  it('validates, and says what the plugin needs', async () => {
    const docs: KubeDoc[] = await kustomize('deploy/device-plugin');
    expect(docs.map((d) => `${d.kind}/${d.metadata?.name}`).sort()).toEqual([
      'ConfigMap/vmpod-vfio-device-plugin-env',
      'ConfigMap/vmpod-vfio-device-plugin-resources',
      'DaemonSet/vmpod-vfio-device-plugin',
    ]);
    for (const d of docs) (d.kind === 'DaemonSet' ? new DaemonSet(d as never) : new ConfigMap(d as never)).validate();
    const ds = docs.find((d) => d.kind === 'DaemonSet') as KubeDoc & { spec: { template: { spec: Pod } } };
    const pod = ds.spec.template.spec;
    expect(pod.hostNetwork).toBe(true);
    const [c] = pod.containers;
    expect(c!.image).toBe('localhost/vmpod-node/device-plugin:0.1.0');
    const mounts = Object.fromEntries(
      c!.volumeMounts.map((m) => [m.mountPath, pod.volumes.find((v) => v.name === m.name)!]),
    );
    expect(mounts['/var/lib/kubelet/device-plugins']!.hostPath).toEqual({
      path: '/var/lib/kubelet/device-plugins',
      type: 'Directory',
    });
    expect(mounts['/var/run/cdi']!.hostPath!.path).toBe('/var/run/cdi');
    // the node's sysfs, /dev and /proc under /host, where VMPOD_SYSFS_ROOT and VMPOD_DEV_ROOT point
    expect(['/host/sys', '/host/dev', '/host/proc'].map((m) => mounts[m]!.hostPath!.path)).toEqual([
      '/sys',
      '/dev',
      '/proc',
    ]);

    // the env: only the plugin's own variables, and they parse
    const envCm = docs.find((d) => d.metadata?.name === 'vmpod-vfio-device-plugin-env') as KubeDoc & {
      data: Record<string, string>;
    };
    const known = new Set<string>([...Object.values(DP_FLAGS).map((s) => s.env), ...Object.keys(DP_ENV_ONLY)]);
    expect(Object.keys(envCm.data).filter((k) => !known.has(k))).toEqual([]);
    const opts = parseOptions([], envCm.data);
    expect(opts.ok && [opts.options.sysfsRoot, opts.options.devRoot]).toEqual(['/host/sys', '/host']);
    // the config file the ConfigMap mounts where VMPOD_DP_CONFIG points
    const res = docs.find((d) => d.metadata?.name === 'vmpod-vfio-device-plugin-resources') as KubeDoc & {
      data: Record<string, string>;
    };
    const file = envCm.data['VMPOD_DP_CONFIG']!;
    const dir = file.slice(0, file.lastIndexOf('/'));
    expect(mounts[dir]!.configMap!.name).toBe('vmpod-vfio-device-plugin-resources');
    const parsed = parseResources(parse(res.data[file.slice(dir.length + 1)]!), { cdi: true });
    expect(parsed.problems).toEqual([]);
    expect(parsed.resources.length).toBeGreaterThan(0);
  });
});
