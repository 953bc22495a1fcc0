// The plugin's life: scan the node every second and send each resource's list again when it changed; keep one
// socket per resource in kubelet's dir and registered with kubelet, making them again when kubelet restarts (it
// creates kubelet.sock again and removes every other socket there) or our socket disappears; answer Allocate from a
// fresh scan. The kubelet dir is watched (inotify) so a restart is seen at once; the tick catches what a watch
// cannot (the dir itself made again).
import { watch, type FSWatcher } from 'node:fs';
import { join } from 'node:path';
import { findHolders, Sysfs, type Holder } from '../devices/index.js';
import type { Logger } from '../log.js';
import { allocateContainer, cdiSpec } from './allocate.js';
import { CdiWriter } from './cdifile.js';
import type { ResourceConfig } from './config.js';
import { GrpcFailure, ResourceServer, type DeviceMsg } from './grpc.js';
import { buildInventory, ownerOf, type Inventory, type ResourceInventory } from './inventory.js';
import type { PluginOptions } from './options.js';
import { preferredAllocation } from './preferred.js';
import { Registrar } from './registrar.js';
import { scanNode } from './scan.js';
import * as grpc from '@grpc/grpc-js';

/** How often sysfs is read again: a change reaches kubelet within two ticks at most. */
export const TICK_MS = 1000;

export interface PluginHooks {
  onAllocate?(resource: string, result: 'ok' | 'unknown' | 'refused'): void;
  onRegister?(resource: string, result: 'ok' | 'failed'): void;
  onListSent?(resource: string): void;
}

/** kubelet's socket name in its device-plugins dir. */
export const KUBELET_SOCKET = 'kubelet.sock';

/** vendor.example/qat -> vmpod-vfio_vendor.example_qat.sock: one socket per resource, named for it. */
export function socketName(resourceName: string): string {
  return `vmpod-vfio_${resourceName.replace(/[^A-Za-z0-9_.-]/g, '_')}.sock`;
}

export function listMessage(inv: ResourceInventory): DeviceMsg[] {
  return inv.devices.map((d) => ({
    ID: d.id,
    health: d.health,
    ...(d.numa.length > 0 ? { topology: { nodes: d.numa.map((n) => ({ ID: n })) } } : {}),
  }));
}

export class VfioDevicePlugin {
  inventory: Inventory = { resources: [], notOffered: [], iommufd: false };
  readonly servers = new Map<string, ResourceServer>();
  readonly registrar: Registrar;
  #sysfs: Sysfs;
  #cdi: CdiWriter | undefined;
  #sent = new Map<string, string>();
  /** resource/device (or function not offered) -> its problem text ('' when healthy), for logging each change once */
  #reasons = new Map<string, string>();
  #tick: NodeJS.Timeout | undefined;
  #watcher: FSWatcher | undefined;
  #scanFailure: string | undefined;
  /** resource -> the errno (or message) of its last failed CDI write */
  #cdiFailures = new Map<string, string>();

  constructor(
    readonly options: PluginOptions,
    readonly resources: readonly ResourceConfig[],
    private readonly log: Logger,
    private readonly hooks: PluginHooks = {},
  ) {
    this.#sysfs = new Sysfs(options.sysfsRoot);
    if (options.cdiDir !== undefined) this.#cdi = new CdiWriter(options.cdiDir);
    for (const r of resources) this.servers.set(r.resourceName, this.#makeServer(r.resourceName));
    this.registrar = new Registrar({
      kubeletSocket: join(options.kubeletDir, KUBELET_SOCKET),
      resources: resources.map((r) => ({
        name: r.resourceName,
        endpoint: socketName(r.resourceName),
        server: this.servers.get(r.resourceName)!,
      })),
      log,
      ...(hooks.onRegister ? { onRegister: hooks.onRegister } : {}),
    });
  }

  #makeServer(name: string): ResourceServer {
    return new ResourceServer(join(this.options.kubeletDir, socketName(name)), {
      list: () => listMessage(this.#resource(name)),
      preferred: (req) => ({
        container_responses: req.container_requests.map((c) => ({
          deviceIDs: preferredAllocation(
            this.#resource(name).devices,
            c.available_deviceIDs,
            c.must_include_deviceIDs,
            c.allocation_size,
          ),
        })),
      }),
      allocate: (req) =>
        this.allocate(
          name,
          req.container_requests.map((c) => c.devices_ids),
        ),
    });
  }

  #resource(name: string): ResourceInventory {
    return (
      this.inventory.resources.find((r) => r.resource.resourceName === name) ?? {
        resource: this.resources.find((r) => r.resourceName === name)!,
        devices: [],
      }
    );
  }

  /** First scan, the sockets, registration (retried in the background), the tick and the watch. */
  async start(): Promise<void> {
    this.refresh();
    this.#watcher = watch(this.options.kubeletDir, () => this.registrar.poke());
    this.#watcher.on('error', (e) =>
      this.log.warn(
        { err: e, dir: this.options.kubeletDir },
        'watch of the kubelet dir failed: changes are seen on the next tick',
      ),
    );
    this.#tick = setInterval(() => {
      this.refresh();
      this.registrar.poke();
    }, TICK_MS);
    await this.registrar.reconcile();
  }

  /** Scans the node; sends each resource's list where it changed (or everywhere, forced); rewrites CDI specs. */
  refresh(force = false): void {
    let inv: Inventory;
    try {
      const view = scanNode(this.#sysfs, this.options.devRoot, (f) => ownerOf(this.resources, f) !== undefined);
      inv = buildInventory(this.resources, view);
      if (this.#scanFailure !== undefined) this.log.info({ sysfs: this.#sysfs.root }, 'sysfs can be read again');
      this.#scanFailure = undefined;
    } catch (e) {
      const text = (e as Error).message;
      if (this.#scanFailure !== text)
        this.log.error({ err: e, sysfs: this.#sysfs.root }, 'scan of the node failed: the lists stay as they were');
      this.#scanFailure = text;
      return;
    }
    this.#logChanges(inv);
    this.inventory = inv;
    for (const r of inv.resources) {
      const name = r.resource.resourceName;
      const msg = listMessage(r);
      const text = JSON.stringify(msg);
      if (this.#cdi) this.#writeCdi(r);
      if (!force && this.#sent.get(name) === text) continue;
      this.#sent.set(name, text);
      this.servers.get(name)!.send(msg);
      this.hooks.onListSent?.(name);
      this.log.info(
        {
          resource: name,
          healthy: r.devices.filter((d) => d.problem === undefined).map((d) => d.id),
          unhealthy: r.devices.filter((d) => d.problem !== undefined).map((d) => d.id),
        },
        'device list',
      );
    }
  }

  /** Writes the resource's CDI spec where it changed; a failure is logged once (it is tried again every tick). */
  #writeCdi(r: ResourceInventory): void {
    const name = r.resource.resourceName;
    const fields = { resource: name, dir: this.#cdi!.dir };
    try {
      if (this.#cdi!.update(name, cdiSpec(r, this.inventory.iommufd))) this.log.debug(fields, 'CDI spec written');
      if (this.#cdiFailures.delete(name)) this.log.info(fields, 'CDI spec written again');
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code ?? (e as Error).message;
      if (this.#cdiFailures.get(name) !== code)
        this.log.error(
          { ...fields, err: e },
          'CDI spec not written: Allocate names CDI devices the runtime will not find; tried again every second',
        );
      this.#cdiFailures.set(name, code);
    }
  }

  /** Each device's health reason and each function not offered, logged once per change. */
  #logChanges(inv: Inventory): void {
    const now = new Map<string, string>();
    for (const r of inv.resources)
      for (const d of r.devices) {
        const key = `${r.resource.resourceName} ${d.id}`;
        const text = d.problem?.text ?? '';
        now.set(key, text);
        const was = this.#reasons.get(key);
        if (was === text) continue;
        const fields = { resource: r.resource.resourceName, device: d.id, health: d.health };
        if (d.problem !== undefined)
          this.log.warn(
            { ...fields, reason: d.problem.code, member: d.problem.member, driver: d.problem.driver },
            `device ${d.id} is unhealthy: ${text}`,
          );
        else if (was !== undefined) this.log.info(fields, `device ${d.id} is healthy again`);
      }
    for (const n of inv.notOffered) {
      const key = `not-offered ${n.address}`;
      now.set(key, n.why);
      if (this.#reasons.get(key) !== n.why)
        this.log.warn({ resource: n.resource, function: n.address }, `not offered: ${n.why}`);
    }
    for (const [key, was] of this.#reasons)
      if (!now.has(key) && !key.startsWith('not-offered '))
        this.log.info({ device: key, was }, 'device gone from sysfs');
    this.#reasons = now;
  }

  /** Allocate: a fresh scan, then each container's answer; any refusal fails the call and sends the lists again. */
  allocate(name: string, containers: string[][]): object {
    this.refresh();
    const inv = this.#resource(name);
    const groups = new Set(
      inv.devices.filter((d) => containers.some((ids) => ids.includes(d.id))).flatMap((d) => d.groups),
    );
    const nodes = new Map<string, string>();
    for (const g of groups) {
      nodes.set(`/dev/vfio/${g}`, g);
      nodes.set(join(this.options.devRoot, `dev/vfio/${g}`), g);
    }
    const holders: Map<string, Holder[]> = findHolders(this.options.devRoot, nodes);
    const ctx = { iommufd: this.inventory.iommufd, cdi: this.#cdi !== undefined, holders };
    const out = containers.map((ids) => ({ ids, outcome: allocateContainer(inv, ids, ctx) }));
    const failed = out.filter((o) => !o.outcome.ok);
    if (failed.length > 0) {
      const problems = failed.flatMap((o) => (o.outcome.ok ? [] : o.outcome.problems));
      const unknown = failed.every((o) => !o.outcome.ok && o.outcome.code === 'unknown');
      this.hooks.onAllocate?.(name, unknown ? 'unknown' : 'refused');
      this.log.warn({ resource: name, containers, problems }, 'allocate refused');
      this.refresh(true); // the API asks for a ListAndWatch update with a failed Allocate
      throw new GrpcFailure(unknown ? grpc.status.NOT_FOUND : grpc.status.FAILED_PRECONDITION, problems.join('; '));
    }
    const responses = out.map((o) => (o.outcome.ok ? o.outcome.response : undefined)!);
    this.hooks.onAllocate?.(name, 'ok');
    this.log.info(
      {
        resource: name,
        containers,
        envs: responses.map((r) => r.envs),
        cdi: responses.flatMap((r) => r.cdi_devices.map((c) => c.name)),
      },
      'allocated',
    );
    return { container_responses: responses };
  }

  /** Registered with kubelet, every resource. */
  get registered(): boolean {
    return this.registrar.allRegistered;
  }

  /** Stops ticking and watching, ends the servers and removes their sockets. */
  stop(): void {
    clearInterval(this.#tick);
    this.#watcher?.close();
    this.registrar.stop();
    for (const s of this.servers.values()) s.stop();
  }
}
