// Prometheus metrics of vfio-device-plugin (prom-client). Imported by src/bin/vfio-device-plugin.ts with import()
// under --http-listen only, so prom-client is in no other program's bundle. The device gauges are read from the
// plugin's last scan at scrape time. docs/device-plugin.md lists them.
import { Counter, Gauge, Registry, collectDefaultMetrics } from 'prom-client';
import type { Inventory } from './inventory.js';
import type { PluginHooks } from './plugin.js';

export const DP_PREFIX = 'vmpod_dp_';

export interface DpMetrics {
  hooks: Required<PluginHooks>;
  render(): Promise<{ contentType: string; body: string }>;
}

type Base = <L extends string>(
  name: string,
  help: string,
  labelNames?: L[],
) => { name: string; help: string; labelNames: L[]; registers: Registry[] };

/** The gauges read from the inventory when scraped: devices by health, why each unhealthy one is, registration. */
function inventoryGauges(base: Base, inventory: () => Inventory, registered: () => boolean): void {
  new Gauge({
    ...base('devices', 'devices advertised to kubelet, by resource and health (Healthy, Unhealthy)', [
      'resource',
      'health',
    ]),
    collect() {
      this.reset();
      for (const r of inventory().resources)
        for (const health of ['Healthy', 'Unhealthy'])
          this.set({ resource: r.resource.resourceName, health }, r.devices.filter((d) => d.health === health).length);
    },
  });
  new Gauge({
    ...base(
      'device_unhealthy',
      '1 per unhealthy device: why (not-vfio, group-not-viable), the function at fault and its driver; the log line ' +
        'says what to do',
      ['resource', 'device', 'reason', 'member', 'driver'],
    ),
    collect() {
      this.reset();
      for (const r of inventory().resources)
        for (const d of r.devices)
          if (d.problem !== undefined)
            this.set(
              {
                resource: r.resource.resourceName,
                device: d.id,
                reason: d.problem.code,
                member: d.problem.member,
                driver: d.problem.driver,
              },
              1,
            );
    },
  });
  new Gauge({
    ...base(
      'functions_not_offered',
      'selected functions never offered (no IOMMU group, a no-IOMMU group, a bridge), by resource',
      ['resource'],
    ),
    collect() {
      this.reset();
      for (const n of inventory().notOffered) this.inc({ resource: n.resource });
    },
  });
  new Gauge({
    ...base('registered', '1 while every resource is registered with kubelet'),
    collect() {
      this.set(registered() ? 1 : 0);
    },
  });
}

export function createDpMetrics(inventory: () => Inventory, registered: () => boolean): DpMetrics {
  const registry = new Registry();
  // prom-client's process and Node.js metrics under their standard names, as tapmanager's (docs/operations.md)
  collectDefaultMetrics({ register: registry });
  const base: Base = (name, help, labelNames = []) => ({
    name: `${DP_PREFIX}${name}`,
    help,
    labelNames,
    registers: [registry],
  });
  inventoryGauges(base, inventory, registered);
  const allocations = new Counter(
    base('allocations_total', 'Allocate calls by resource and result (ok, unknown, refused)', ['resource', 'result']),
  );
  const registrations = new Counter(
    base('registrations_total', 'Register calls to kubelet by resource and result (ok, failed)', [
      'resource',
      'result',
    ]),
  );
  const lists = new Counter(
    base('list_updates_total', 'device lists sent on ListAndWatch because they changed, by resource', ['resource']),
  );
  return {
    hooks: {
      onAllocate: (resource, result) => allocations.inc({ resource, result }),
      onRegister: (resource, result) => registrations.inc({ resource, result }),
      onListSent: (resource) => lists.inc({ resource }),
    },
    render: async () => ({ contentType: registry.contentType, body: await registry.metrics() }),
  };
}
