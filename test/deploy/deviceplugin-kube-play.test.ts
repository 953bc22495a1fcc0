// deploy/device-plugin/'s DaemonSet pod, run for real with `podman kube play` from the image scripts/images.sh
// builds (--target device-plugin), against a fake kubelet in a private device-plugins dir and a fake sysfs tree
// and /dev tree mounted as the node's (/host/sys, /host/dev): the plugin registers, kubelet's client lists and
// allocates, the CDI spec appears in the private CDI dir, the probes pass; SIGTERM removes its sockets and the
// container exits 0. Host paths: kubelet's dir, the CDI dir, /sys and /dev become private dirs
// (test/helpers/kubeplay.ts); /proc is the machine's own (read only).
import { existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { execa } from 'execa';
import { stringify } from 'yaml';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { REPO } from '../helpers/daemon.js';
import { startFakeDpKubelet, waitFor, type FakeDpKubelet } from '../helpers/fakedpkubelet.js';
import { makeDpNode, type DpNode } from '../helpers/dpplugin.js';
import { containerImages, kubePlayDocs, kustomize, type KubeDoc } from '../helpers/kubeplay.js';
import { run, runStatus } from '../helpers/netns.js';

/** A cold build (npm ci and the bundles in the build stage) takes minutes on a busy machine; a cached one seconds. */
const BUILD_TIMEOUT_MS = 1_800_000;
const QAT = 'vendor.example/qat';
const CONFIG = `- resourceName: ${QAT}\n  vendors: ["8086"]\n  devices: ["4941"]\n`;

const podman = (args: string[], timeoutMs = 120_000): Promise<string> => run(['podman', ...args], { timeoutMs });

describe('deploy/device-plugin/ under podman kube play', () => {
  let images: string[] = [];
  let node: DpNode | undefined;
  let kubelet: FakeDpKubelet | undefined;
  let kubeFile: string | undefined;
  let cdiDir = '';

  beforeAll(async () => {
    const r = await execa('bash', [join(REPO, 'scripts/images.sh'), '--target', 'device-plugin'], {
      cwd: REPO,
      timeout: BUILD_TIMEOUT_MS,
      reject: false,
      stdin: 'ignore',
    });
    if (r.exitCode !== 0)
      throw new Error(`scripts/images.sh: exit ${r.exitCode}\n${r.stderr.split('\n').slice(-30).join('\n')}`);
    images = r.stdout.trim().split('\n');
    node = makeDpNode();
    kubelet = await startFakeDpKubelet();
    cdiDir = join(node.dir, 'cdi');
    mkdirSync(cdiDir);
  }, BUILD_TIMEOUT_MS);

  afterAll(async () => {
    if (kubeFile !== undefined) await execa('podman', ['kube', 'down', kubeFile], { reject: false, timeout: 120_000 });
    kubelet?.close();
    node?.cleanup();
  }, 300_000);

  it("registers with the fake kubelet, lists and allocates the fake node's functions; SIGTERM removes its sockets, exit 0", async () => {
    const docs: KubeDoc[] = await kustomize('deploy/device-plugin');
    expect(Object.values(containerImages(docs))).toEqual(images);
    const podName = `vmpod-dp-kp-${randomBytes(3).toString('hex')}`;
    const httpPort = 20_000 + (randomBytes(2).readUInt16BE() % 20_000);
    const k = kubelet!;
    const play = kubePlayDocs(docs, {
      podName,
      hostPaths: {
        '/var/lib/kubelet/device-plugins': k.dir,
        '/var/run/cdi': cdiDir,
        '/sys': node!.tree.root,
        '/dev': join(node!.host.root, 'dev'),
      },
      sharedHostPaths: ['/proc'],
      configMapData: {
        // loopback on a port of its own: other tests on this machine may listen on the default port
        'vmpod-vfio-device-plugin-env': { VMPOD_HTTP_LISTEN: `127.0.0.1:${httpPort}`, VMPOD_LOG_LEVEL: 'debug' },
        'vmpod-vfio-device-plugin-resources': { 'device-plugin.yaml': CONFIG },
      },
    });
    kubeFile = join(node!.dir, 'kube.yaml');
    writeFileSync(kubeFile, play.map((d) => stringify(d)).join('---\n'));
    await podman(['kube', 'play', kubeFile], 300_000);
    const container = `${podName}-device-plugin`;
    // the plugin logs on stderr, which podman logs gives on its own stderr
    const logs = async () =>
      (await execa('podman', ['logs', container], { all: true, reject: false, timeout: 60_000, stdin: 'ignore' }))
        .all ?? '';

    await waitFor(
      "the plugin's registration",
      () => (k.registrations.some((r) => r.resource_name === QAT) ? true : undefined),
      120_000,
    ).catch(async (e: Error) => {
      throw new Error(`${e.message}\n${await logs()}`);
    });
    const c = await k.plugin(QAT);
    const list = await c.nextList((l) => l.length === 4);
    expect(list.map((d) => [d.ID, d.health])).toEqual([
      ['0000:3d:02.1', 'Healthy'],
      ['0000:3d:02.2', 'Healthy'],
      ['0000:3d:02.3', 'Healthy'],
      ['0000:3d:02.4', 'Unhealthy'],
    ]);
    const [resp] = await c.allocate([['0000:3d:02.2']]);
    expect(resp!.envs).toEqual({ PCIDEVICE_VENDOR_EXAMPLE_QAT: '0000:3d:02.2' });
    expect(resp!.cdi_devices).toEqual([{ name: `${QAT}=0000:3d:02.2` }]);
    const spec = JSON.parse(readFileSync(join(cdiDir, 'vmpod-vfio_vendor.example_qat.json'), 'utf8')) as {
      kind: string;
    };
    expect(spec.kind).toBe(QAT);

    // the probes, as kube play made the liveness probe a healthcheck; /metrics from the host (the node's network)
    expect(await runStatus(['podman', 'healthcheck', 'run', container], 60_000)).toBe(0);
    const metrics = await (await fetch(`http://127.0.0.1:${httpPort}/metrics`)).text();
    expect(metrics).toContain(`vmpod_dp_devices{resource="${QAT}",health="Healthy"} 3`);
    expect(metrics).toContain('vmpod_dp_registered 1');

    // SIGTERM: the plugin removes its socket from kubelet's dir and exits 0; then the pod goes
    expect(readdirSync(k.dir).sort()).toEqual(['kubelet.sock', 'vmpod-vfio_vendor.example_qat.sock']);
    await podman(['pod', 'stop', '-t', '30', podName], 120_000);
    expect((await podman(['inspect', container, '--format', '{{.State.ExitCode}}'])).trim()).toBe('0');
    expect(readdirSync(k.dir)).toEqual(['kubelet.sock']);
    expect(await logs()).toMatch(/"msg":"stopped: sockets removed"/);
    await podman(['kube', 'down', kubeFile]);
    kubeFile = undefined;
    expect(await runStatus(['podman', 'pod', 'exists', podName])).toBe(1);
    expect(existsSync(join(cdiDir, 'vmpod-vfio_vendor.example_qat.json'))).toBe(true);
  }, 600_000);
});
