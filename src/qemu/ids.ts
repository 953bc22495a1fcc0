// Ids in qemu's argv: what libvirt already used, and a small allocator for ours.
//
// qemu keeps separate id namespaces per object kind (-device, -netdev, -chardev, -object ...), but one set for all
// of them is simpler and errs on the safe side. libvirt >= 9 (with a capable qemu) writes -device, -netdev, -object
// and -blockdev values as JSON objects; older libvirt writes qemu's key=value form, where ',' inside a value is
// written ',,'. Both are read here.

/** qemu's QemuOpts escaping: a literal ',' inside a value is written ',,'. */
export function escapeQemuValue(s: string): string {
  return s.replaceAll(',', ',,');
}

/**
 * Splits a key=value option string ("tap,id=n0,fd=3") on the commas that are not doubled, and un-doubles the rest.
 * "a=x,,y,b=2" -> ["a=x,y", "b=2"].
 */
export function splitQemuOpts(s: string): string[] {
  const parts: string[] = [];
  let cur = '';
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if (c === ',') {
      if (s[i + 1] === ',') {
        cur += ',';
        i++;
      } else {
        parts.push(cur);
        cur = '';
      }
    } else {
      cur += c;
    }
  }
  parts.push(cur);
  return parts;
}

/**
 * One option value of qemu's argv as a flat record: JSON objects as they are (top level only), key=value strings
 * with the implied first key ("tap" in "tap,id=x") stored under "" .
 */
export function parseQemuOptValue(value: string): Record<string, unknown> | undefined {
  const v = value.trimStart();
  if (v.startsWith('{')) {
    try {
      const o: unknown = JSON.parse(v);
      return typeof o === 'object' && o !== null && !Array.isArray(o) ? (o as Record<string, unknown>) : undefined;
    } catch {
      return undefined; // not JSON after all; qemu would reject it too, not ours to judge
    }
  }
  const rec: Record<string, unknown> = {};
  splitQemuOpts(value).forEach((part, i) => {
    const eq = part.indexOf('=');
    if (eq < 0) {
      if (i === 0) rec[''] = part; // implied key: the driver / backend / machine type
      return;
    }
    rec[part.slice(0, eq)] = part.slice(eq + 1);
  });
  return rec;
}

/** [option, value] pairs of an argv: every "-opt value" where value does not itself start with '-'. */
export function optionPairs(argv: readonly string[]): [string, string][] {
  const pairs: [string, string][] = [];
  for (let i = 0; i + 1 < argv.length; i++) {
    const opt = argv[i];
    const val = argv[i + 1];
    if (opt.startsWith('-') && !val.startsWith('-')) {
      pairs.push([opt, val]);
      i++;
    }
  }
  return pairs;
}

/** Every id= (JSON "id") already present in the argv, whichever option carries it. */
export function usedIds(argv: readonly string[]): Set<string> {
  const ids = new Set<string>();
  for (const [, val] of optionPairs(argv)) {
    const rec = parseQemuOptValue(val);
    const id = rec?.['id'];
    if (typeof id === 'string' && id !== '') ids.add(id);
  }
  return ids;
}

/**
 * Hands out ids that are not in use, so ours never collide with libvirt's (which owns "hostdevN", "netN", "pci.N")
 * or with each other. Deterministic: the smallest free number, or the preferred one when it is free.
 */
export class IdAllocator {
  private readonly taken: Set<string>;

  constructor(used: Iterable<string> = []) {
    this.taken = new Set(used);
  }

  has(id: string): boolean {
    return this.taken.has(id);
  }

  /**
   * Reserves prefix+n for every prefix with one n (e.g. vmpodnet3 and vmpodnic3 together) and returns n.
   * Tries `preferred` first, then 0, 1, 2, ...
   */
  allocate(prefixes: readonly string[], preferred?: number): number {
    const free = (n: number) => prefixes.every((p) => !this.taken.has(`${p}${n}`));
    let n = 0;
    if (preferred !== undefined && free(preferred)) n = preferred;
    else while (!free(n)) n++;
    for (const p of prefixes) this.taken.add(`${p}${n}`);
    return n;
  }

  /** One id: prefix + the smallest free number. */
  next(prefix: string): string {
    return `${prefix}${this.allocate([prefix])}`;
  }
}
