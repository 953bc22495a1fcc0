// GetPreferredAllocation: which `size` of the available devices kubelet should give a container. Pure.
//
// The must-include devices always; then the other available functions of their groups (a group's functions stay
// together: its /dev/vfio/<N> is opened by one VM, so siblings in another pod could never be used); then whole groups,
// as few as possible (largest first, the last one the smallest that fits), on one NUMA node when that costs no extra
// group and splits no more groups (the must-include devices' node first, then the lowest). With unit "group" every
// device is its own group of one, so this is: must-include, then one NUMA node.
import type { PluginDevice } from './inventory.js';

interface Bucket {
  group: string;
  /** the bucket's available device IDs, sorted */
  ids: string[];
  /** NUMA node of its first function, -1 for none */
  numa: number;
}

/** Fewest buckets whose IDs add up to `need`: the largest whole, and the last from the smallest that fits. */
function fewest(buckets: readonly Bucket[], need: number): string[] | undefined {
  const left = [...buckets].sort((a, b) => b.ids.length - a.ids.length || Number(a.group) - Number(b.group));
  const out: string[] = [];
  while (need > 0) {
    if (left.length === 0) return undefined;
    // the smallest bucket that fits (the lowest group among equals), else the largest
    const fits = left.filter((b) => b.ids.length >= need);
    const b = fits.length > 0 ? fits.reduce((x, y) => (y.ids.length < x.ids.length ? y : x)) : left[0]!;
    left.splice(left.indexOf(b), 1);
    const take = b.ids.slice(0, need);
    out.push(...take);
    need -= take.length;
  }
  return out;
}

/** A pick's cost: the groups it touches, then the groups it splits (a sibling left behind could go to another pod). */
function cost(pick: readonly string[], buckets: readonly Bucket[]): [number, number] {
  const touched = buckets.filter((b) => b.ids.some((id) => pick.includes(id)));
  return [touched.length, touched.filter((b) => !b.ids.every((id) => pick.includes(id))).length];
}

export function preferredAllocation(
  devices: readonly PluginDevice[],
  available: readonly string[],
  mustInclude: readonly string[],
  size: number,
): string[] {
  const byId = new Map(devices.map((d) => [d.id, d]));
  const groupOf = new Map(devices.map((d) => [d.id, d.groups.join(',')]));
  const out = [...new Set(mustInclude)];
  if (out.length >= size) return out;
  const free = [...new Set(available)].filter((id) => !out.includes(id) && byId.has(id)).sort();
  // siblings of the must-include devices first, in the order of their groups
  const mustGroups = new Set(out.map((id) => groupOf.get(id)));
  for (const id of free) if (out.length < size && mustGroups.has(groupOf.get(id))) out.push(id);
  const rest = free.filter((id) => !out.includes(id));
  const need = size - out.length;
  if (need <= 0) return out;
  const buckets = new Map<string, Bucket>();
  for (const id of rest) {
    const g = groupOf.get(id)!;
    const b = buckets.get(g) ?? { group: g, ids: [], numa: byId.get(id)!.numa[0] ?? -1 };
    b.ids.push(id);
    buckets.set(g, b);
  }
  const all = [...buckets.values()];
  const global = fewest(all, need);
  if (global === undefined) return [...out, ...rest].slice(0, size); // not enough: kubelet decides what to do
  const mustNuma = out.flatMap((id) => byId.get(id)?.numa ?? []);
  const nodes = [...new Set(all.map((b) => b.numa).filter((n) => n >= 0))].sort(
    (a, b) => Number(!mustNuma.includes(a)) - Number(!mustNuma.includes(b)) || a - b,
  );
  for (const n of nodes) {
    const pick = fewest(
      all.filter((b) => b.numa === n),
      need,
    );
    if (pick === undefined) continue;
    const [g, split] = cost(pick, all);
    const [gg, gsplit] = cost(global, all);
    if (g < gg || (g === gg && split <= gsplit)) return [...out, ...pick];
  }
  return [...out, ...global];
}
