// Every input, in order, into one DeviceReport: what vmwrapper passes to qemu and what `tapctl devices` prints.
// The order is the precedence: the first input that names a function is recorded as its source.
//   1. tapmanager's SR-IOV VFs (the pod network's)      4. CDI names (VMPOD_CDI_DEVICES, then DRA claims' names)
//   2. device-plugin env (PCIDEVICE_*, PCI_RESOURCE_*,   5. CRI devices (VMPOD_CRI_DEVICES): /dev/vfio/<N> nodes
//      MDEV_PCI_RESOURCE_*, QAT<n>)
//   3. kubelet's PodResources (VMPOD_POD_NAME/NAMESPACE)
import { readdirSync } from 'node:fs';
import { ErrorCode, errorChain, VmpodError } from '../errors.js';
import { CDI_DEVICES_ENV, cdiRequests, cdiSpecDirs, loadCdiRegistry, parseCdiNames, type YamlParse } from './cdi.js';
import { criRequests } from './cri.js';
import { readHostFacts } from './host.js';
import { mergeDevices } from './merge.js';
import { pluginEnvRequests } from './plugins.js';
import { parseResourceMap, podResourcesRequests, podResourcesTarget, RESOURCE_MAP_ENV } from './podresources.js';
import type { DeviceReport, DeviceRequest } from './records.js';
import type { Sysfs } from './sysfs.js';

export interface CollectOptions {
  sysfs: Sysfs;
  /** where /dev and /proc are read (hostRoot(env)) */
  hostRoot: string;
  /** the pod network's VFs, from tapmanager's get reply */
  vfs?: readonly { address: string }[];
}

export interface CollectedDevices extends DeviceReport {
  /** malformed inputs and inputs that could not be read (unknown CDI names, kubelet errors), each naming its source */
  inputErrors: string[];
  /** which PodResources method answered, when kubelet was asked */
  podResourcesVia?: 'Get' | 'List';
}

function hasYamlSpec(dirs: readonly string[]): boolean {
  return dirs.some((d) => {
    try {
      return readdirSync(d).some((f) => f.endsWith('.yaml'));
    } catch {
      return false;
    }
  });
}

/** CDI names as requests; the spec dirs are read only when there are names, the yaml parser only for .yaml files. */
async function cdiInput(
  names: string[],
  env: Record<string, string | undefined>,
  errors: string[],
  sourcePrefix: string,
): Promise<DeviceRequest[]> {
  if (names.length === 0) return [];
  const dirs = cdiSpecDirs(env);
  let parseYaml: YamlParse = () => {
    throw new Error('no YAML parser');
  };
  if (hasYamlSpec(dirs)) {
    const yaml = await import('yaml');
    parseYaml = (text) => yaml.parse(text, { strict: true, uniqueKeys: true });
  }
  return cdiRequests(names, loadCdiRegistry(dirs, parseYaml), errors, sourcePrefix);
}

export async function collectDevices(
  env: Record<string, string | undefined>,
  opts: CollectOptions,
): Promise<CollectedDevices> {
  const errors: string[] = [];
  const skipped: string[] = [];
  const requests: DeviceRequest[] = (opts.vfs ?? []).map((v) => ({
    kind: 'pci' as const,
    address: v.address.toLowerCase(),
    source: 'tapmanager',
  }));
  requests.push(...pluginEnvRequests(env, errors));

  let via: 'Get' | 'List' | undefined;
  let draNames: string[] = [];
  try {
    const target = podResourcesTarget(env);
    if (target !== undefined) {
      const rules = parseResourceMap(env[RESOURCE_MAP_ENV]);
      const { fetchPodResources } = await import('./kubelet.js');
      const answer = await fetchPodResources(target);
      via = answer.via;
      const input = podResourcesRequests(answer.pods, rules, errors, skipped);
      requests.push(...input.requests);
      draNames = input.cdiNames;
    }
  } catch (e) {
    errors.push(errorChain(e));
  }

  const cdiNames = parseCdiNames(env[CDI_DEVICES_ENV] ?? '', CDI_DEVICES_ENV, errors);
  requests.push(...(await cdiInput(cdiNames, env, errors, 'cdi')));
  requests.push(
    ...(await cdiInput(
      draNames.filter((n) => !cdiNames.includes(n)),
      env,
      errors,
      'dra',
    )),
  );
  requests.push(...criRequests(env, errors));

  const report = mergeDevices(requests, readHostFacts(requests, opts.sysfs, opts.hostRoot));
  return {
    ...report,
    skipped: [...skipped, ...report.skipped],
    inputErrors: errors,
    ...(via !== undefined ? { podResourcesVia: via } : {}),
  };
}

/** The devices, or one VmpodError naming every problem: BadRequest for bad inputs, Device for refusals. */
export function devicesOrThrow(r: CollectedDevices): CollectedDevices['devices'] {
  if (r.inputErrors.length > 0)
    throw new VmpodError(ErrorCode.BadRequest, `collect devices: ${[...r.inputErrors, ...r.problems].join('; ')}`, {
      op: 'collect-devices',
    });
  if (r.problems.length > 0)
    throw new VmpodError(ErrorCode.Device, `collect devices: ${r.problems.join('; ')}`, { op: 'collect-devices' });
  return r.devices;
}
