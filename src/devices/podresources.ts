// Input: the devices kubelet allocated to the pod, from its PodResources API (the way Kata's runtime finds a
// sandbox's devices when it is not handed them). Pure: what to ask, and the answer as DeviceRequests. The gRPC
// client is kubelet.ts, imported only when this path is taken.
import { existsSync } from 'node:fs';
import { ErrorCode, VmpodError } from '../errors.js';
import { isObj } from '../guards.js';
import { isPciAddress, MDEV_UUID_RE, parsePciAddress } from './pci.js';
import type { DeviceRequest } from './records.js';

export const POD_RESOURCES_SOCKET_ENV = 'VMPOD_POD_RESOURCES_SOCKET';
export const DEFAULT_POD_RESOURCES_SOCKET = '/var/lib/kubelet/pod-resources/kubelet.sock';
export const RESOURCE_MAP_ENV = 'VMPOD_RESOURCE_MAP';
export const POD_RESOURCES_TIMEOUT_ENV = 'VMPOD_POD_RESOURCES_TIMEOUT_MS';
export const DEFAULT_POD_RESOURCES_TIMEOUT_MS = 5000;

export interface PodResourcesTarget {
  socket: string;
  podName: string;
  podNamespace: string;
  timeoutMs: number;
}

/**
 * Whether to ask kubelet, and what. Asked when VMPOD_POD_RESOURCES_SOCKET is set (non-empty), or when it is unset
 * and the default socket exists; and the pod is named (VMPOD_POD_NAME, VMPOD_POD_NAMESPACE). An explicit socket
 * without the pod's names is a configuration error; the default socket without them is not asked.
 * VMPOD_POD_RESOURCES_SOCKET="" turns the lookup off.
 */
export function podResourcesTarget(
  env: Record<string, string | undefined>,
  exists: (p: string) => boolean = existsSync,
): PodResourcesTarget | undefined {
  const v = env[POD_RESOURCES_SOCKET_ENV];
  if (v === '') return undefined;
  const socket = v ?? DEFAULT_POD_RESOURCES_SOCKET;
  if (v === undefined && !exists(socket)) return undefined;
  const podName = env['VMPOD_POD_NAME'] ?? '';
  const podNamespace = env['VMPOD_POD_NAMESPACE'] ?? '';
  if (podName === '' || podNamespace === '') {
    if (v === undefined) return undefined;
    throw new VmpodError(
      ErrorCode.Config,
      `${POD_RESOURCES_SOCKET_ENV}=${JSON.stringify(v)} is set but VMPOD_POD_NAME and VMPOD_POD_NAMESPACE are not ` +
        `both set: kubelet's PodResources API is asked by pod name and namespace`,
    );
  }
  const t = env[POD_RESOURCES_TIMEOUT_ENV];
  const timeoutMs = t === undefined || t === '' ? DEFAULT_POD_RESOURCES_TIMEOUT_MS : Number(t);
  if (!Number.isInteger(timeoutMs) || timeoutMs <= 0)
    throw new VmpodError(
      ErrorCode.Config,
      `${POD_RESOURCES_TIMEOUT_ENV}=${JSON.stringify(t)} is not a positive number of milliseconds`,
    );
  return { socket, podName, podNamespace, timeoutMs };
}

/** How to read one resource's device IDs (VMPOD_RESOURCE_MAP). */
export const IdKind = {
  /** PCI addresses (the SR-IOV network device plugin; the default when every ID is one) */
  Pci: 'pci',
  /** IOMMU group numbers */
  IommuGroup: 'iommu-group',
  /** mediated device uuids */
  Mdev: 'mdev',
  /** not a VFIO device: leave it alone */
  Ignore: 'ignore',
} as const;
export type IdKind = (typeof IdKind)[keyof typeof IdKind];

export interface IdRule {
  ids: IdKind;
  /** a regular expression whose first capture group is the address/group/uuid inside the ID */
  pattern?: RegExp;
}

/** VMPOD_RESOURCE_MAP: {"<resource>": "pci" | "iommu-group" | "mdev" | "ignore" | {"ids": ..., "pattern": "..."}}. */
export function parseResourceMap(json: string | undefined): Map<string, IdRule> {
  const out = new Map<string, IdRule>();
  if (json === undefined || json.trim() === '') return out;
  const bad = (why: string, cause?: unknown) =>
    new VmpodError(
      ErrorCode.Config,
      `${RESOURCE_MAP_ENV}=${JSON.stringify(json)}: ${why}`,
      cause === undefined ? {} : { cause },
    );
  let v: unknown;
  try {
    v = JSON.parse(json);
  } catch (e) {
    throw bad('is not JSON', e);
  }
  if (!isObj(v)) throw bad('is not a JSON object keyed by resource name');
  const kinds = Object.values(IdKind) as string[];
  for (const [res, rule] of Object.entries(v)) {
    const o = typeof rule === 'string' ? { ids: rule } : rule;
    if (typeof o !== 'object' || o === null || !kinds.includes((o as { ids?: unknown }).ids as string))
      throw bad(
        `${JSON.stringify(res)}: ${JSON.stringify(rule)} is not one of ` +
          `${kinds.map((k) => JSON.stringify(k)).join(', ')} or {"ids": ..., "pattern": "..."}`,
      );
    const r: IdRule = { ids: (o as { ids: IdKind }).ids };
    const pat = (o as { pattern?: unknown }).pattern;
    if (pat !== undefined) {
      try {
        r.pattern = new RegExp(String(pat));
      } catch (e) {
        throw bad(`${JSON.stringify(res)}: pattern ${JSON.stringify(pat)} is not a regular expression`, e);
      }
    }
    out.set(res, r);
  }
  return out;
}

/** The parts of the PodResources messages we read (proto field names, as the loader keeps them). */
export interface PodResourcesMsg {
  name: string;
  namespace: string;
  containers: {
    name: string;
    devices: { resource_name: string; device_ids: string[] }[];
    dynamic_resources?: { claim_name: string; claim_resources: { cdi_devices: { name: string }[] }[] }[];
  }[];
}

export interface PodResourcesInput {
  requests: DeviceRequest[];
  /** CDI names from DRA claims, resolved like VMPOD_CDI_DEVICES */
  cdiNames: string[];
}

/**
 * The pod's allocation (the union over its containers, and over several entries of one pod: older kubelets' List
 * also reports terminated pods of the same name) as DeviceRequests. Resources that are not VFIO devices (IDs that
 * are not PCI addresses, and no rule in VMPOD_RESOURCE_MAP) go to `skipped`.
 */
export function podResourcesRequests(
  pods: readonly PodResourcesMsg[],
  rules: Map<string, IdRule>,
  problems: string[],
  skipped: string[],
): PodResourcesInput {
  const requests: DeviceRequest[] = [];
  const cdiNames: string[] = [];
  const seen = new Set<string>();
  for (const pod of pods) {
    for (const c of pod.containers ?? []) {
      for (const d of c.devices ?? []) {
        const res = d.resource_name;
        const ids = d.device_ids ?? [];
        const source = `podresources ${res}`;
        const rule =
          rules.get(res) ??
          (ids.length > 0 && ids.every((id) => isPciAddress(id.toLowerCase())) ? { ids: IdKind.Pci } : undefined);
        if (rule === undefined) {
          skipped.push(
            `${res} (${ids.join(', ')}) of container ${c.name}: the IDs are not PCI addresses and ` +
              `${RESOURCE_MAP_ENV} has no rule for it`,
          );
          continue;
        }
        if (rule.ids === IdKind.Ignore) {
          skipped.push(`${res} of container ${c.name}: "ignore" in ${RESOURCE_MAP_ENV}`);
          continue;
        }
        for (const id of ids) {
          const key = `${res}\0${id}`;
          if (seen.has(key)) continue;
          seen.add(key);
          let v = id;
          if (rule.pattern !== undefined) {
            const m = rule.pattern.exec(id);
            if (!m || m[1] === undefined) {
              problems.push(
                `${source}: device ID ${JSON.stringify(id)} does not match the pattern ${rule.pattern.source} of ` +
                  `${RESOURCE_MAP_ENV}`,
              );
              continue;
            }
            v = m[1];
          }
          const origin = id;
          if (rule.ids === IdKind.Pci) {
            try {
              requests.push({ kind: 'pci', address: parsePciAddress(v), source, origin });
            } catch {
              problems.push(`${source}: device ID ${JSON.stringify(id)} is not a PCI address`);
            }
          } else if (rule.ids === IdKind.IommuGroup) {
            if (/^\d+$/.test(v))
              requests.push({ kind: 'group', group: v, source, origin, path: `/dev/vfio/${v}`, noiommu: false });
            else problems.push(`${source}: device ID ${JSON.stringify(id)} is not an IOMMU group number`);
          } else if (MDEV_UUID_RE.test(v.toLowerCase())) {
            requests.push({ kind: 'mdev', uuid: v.toLowerCase(), source, origin });
          } else {
            problems.push(`${source}: device ID ${JSON.stringify(id)} is not a mediated device uuid`);
          }
        }
      }
      for (const dr of c.dynamic_resources ?? [])
        for (const cr of dr.claim_resources ?? [])
          for (const cd of cr.cdi_devices ?? []) if (!cdiNames.includes(cd.name)) cdiNames.push(cd.name);
    }
  }
  return { requests, cdiNames };
}
