// One error base for the whole project (after execa's makeError and CNI's types.Error).
// Each layer wraps with { cause } and names the operation and the object.

export const ErrorCode = {
  BadRequest: 'BAD_REQUEST',
  BadKey: 'BAD_KEY',
  NotFound: 'NOT_FOUND',
  Conflict: 'CONFLICT',
  Cni: 'CNI',
  Netlink: 'NETLINK',
  Syscall: 'SYSCALL',
  State: 'STATE',
  Device: 'DEVICE',
  Config: 'CONFIG',
  Timeout: 'TIMEOUT',
  Protocol: 'PROTOCOL',
  Internal: 'INTERNAL',
} as const;
export type ErrorCode = (typeof ErrorCode)[keyof typeof ErrorCode];

const brand = Symbol.for('vmpod-node.error');

export class VmpodError extends Error {
  readonly code: ErrorCode;
  readonly key?: string;
  readonly op?: string;

  constructor(code: ErrorCode, message: string, opts: { cause?: unknown; key?: string; op?: string } = {}) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.code = code;
    if (opts.key !== undefined) this.key = opts.key;
    if (opts.op !== undefined) this.op = opts.op;
    Object.defineProperty(this, brand, { value: true });
  }
}
Object.defineProperty(VmpodError.prototype, 'name', { value: 'VmpodError', enumerable: false });

export function isVmpodError(e: unknown): e is VmpodError {
  return typeof e === 'object' && e !== null && (e as Record<symbol, unknown>)[brand] === true;
}

/** Client input through a codec that throws on anything malformed: the value, or why it is dropped. */
export function tryDecode<T>(
  decode: (buf: Buffer) => T,
  buf: Buffer,
): { ok: true; value: T } | { ok: false; why: string } {
  try {
    return { ok: true, value: decode(buf) };
  } catch (e) {
    return { ok: false, why: errorChain(e) };
  }
}

/** "msg: cause msg: cause msg" — the whole cause chain in one line, for error replies and stderr. */
export function errorChain(e: unknown): string {
  const parts: string[] = [];
  let cur: unknown = e;
  for (let depth = 0; cur !== undefined && cur !== null && depth < 10; depth++) {
    if (cur instanceof Error) {
      if (!parts.some((p) => p.includes(cur instanceof Error ? cur.message : ''))) parts.push(cur.message);
      cur = cur.cause;
    } else {
      parts.push(String(cur));
      break;
    }
  }
  return parts.join(': ');
}
