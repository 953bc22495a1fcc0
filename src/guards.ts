// Type guards for decoded JSON (pure): the one home of the object check every decoder uses.

export type Obj = Record<string, unknown>;

/** A plain JSON object: not null, not an array. */
export function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}
