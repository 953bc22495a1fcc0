// The fd client: a small synchronous client of tapmanager's fd server, used by vmwrapper (on every VM
// start, so no pino/execa here) and tapctl. Speaks Virtlet's protocol (docs/protocol.md) and,
// like Virtlet's FDClient, opens a new connection per request.
import { native, type Native } from '../native.js';
import { ErrorCode, VmpodError } from '../errors.js';
import {
  Command,
  ERROR_COMMAND,
  HEADER_SIZE,
  MAX_FDS,
  MAX_PAYLOAD,
  cmsgSpace,
  commandName,
  responseOf,
} from '../protocol/commands.js';
import { decodeHeader, encodeHeader, type Header } from '../protocol/header.js';
import { validateKey } from '../identity.js';
import {
  decodeCsn,
  decodeGetInfo,
  encodeGetFDPayload,
  encodeGetRequest,
  encodeRecoverPayload,
} from '../protocol/codec.js';
import type { ContainerSideNetwork, GetInfo, PodNetworkDesc, RecoverPayload } from '../protocol/payloads.js';
import type { CheckSummary, GcSummary, StatusReport } from '../protocol/status.js';

export interface FdClientOptions {
  /** SO_RCVTIMEO/SO_SNDTIMEO per socket operation, ms (0 = none). Default 120 s: an add waits for CNI. */
  timeoutMs?: number;
}

interface Response {
  header: Header;
  data: Buffer;
  fds: number[];
}

const DEFAULT_TIMEOUT_MS = 120_000;

/** Closes fds, ignoring errors: used on error paths, where the first error is the one to report. */
function closeAll(n: Native, fds: number[]): void {
  for (const fd of fds) {
    try {
      n.close(fd);
    } catch {
      // already reporting a failure; a close error would only hide it
    }
  }
}

function errnoOf(e: unknown): string | undefined {
  const code = (e as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

export class FdClient {
  private readonly socketPath: string;
  private readonly timeoutMs: number;

  constructor(socketPath: string, opts: FdClientOptions = {}) {
    this.socketPath = socketPath;
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  }

  /** add (0): set up the pod network for key; returns its ContainerSideNetwork. */
  add(key: string, desc: PodNetworkDesc): ContainerSideNetwork {
    validateKey(key);
    const r = this.request(Command.Add, key, encodeGetFDPayload({ podNetworkDesc: desc }));
    return this.decode(Command.Add, key, () => decodeCsn(r.data));
  }

  /** release (1): tear the pod network down. */
  release(key: string): void {
    validateKey(key);
    this.request(Command.Release, key, null);
  }

  /**
   * release-force (5, ours): release, and forget the pod even when undo steps fail (a quarantined key); returns
   * what could not be undone (empty when everything was).
   */
  releaseForce(key: string): { leftovers: string[] } {
    validateKey(key);
    const r = this.request(Command.ReleaseForce, key, null);
    return this.decode(Command.ReleaseForce, key, () => {
      const v = JSON.parse(r.data.toString('utf8')) as { leftovers?: unknown };
      if (!Array.isArray(v.leftovers) || !v.leftovers.every((x) => typeof x === 'string'))
        throw new Error('no "leftovers" array of strings');
      return { leftovers: v.leftovers as string[] };
    });
  }

  /**
   * get (2): the interface descriptions and their fds (close-on-exec, in SCM_RIGHTS order: fdIndex, and each tap's
   * queueFdIndices). `queues` > 1 asks for that many queues on every tap (a payload of ours); without it the request
   * is Virtlet's. The caller owns the fds.
   */
  get(key: string, opts: { queues?: number } = {}): { infos: GetInfo[]; fds: number[] } {
    validateKey(key);
    const r = this.request(Command.Get, key, encodeGetRequest({ queues: opts.queues ?? 1 }), true);
    try {
      // a pod without interfaces may come with no payload at all
      const infos = r.data.length === 0 ? [] : this.decode(Command.Get, key, () => decodeGetInfo(r.data));
      // decodeGetInfo checked that the indices are distinct and below this count
      const need = infos.reduce((n, i) => n + (i.queueFdIndices?.length ?? 1), 0);
      if (r.fds.length !== need) {
        const queues = need !== infos.length ? ` with ${need} queues in all` : '';
        throw this.protocolError(Command.Get, key, `${r.fds.length} fds for ${infos.length} interfaces${queues}`);
      }
      return { infos, fds: r.fds };
    } catch (e) {
      closeAll(native(), r.fds);
      throw e;
    }
  }

  /** recover (3): re-attach to an existing pod network after a restart. */
  recover(key: string, payload: RecoverPayload): void {
    validateKey(key);
    this.request(Command.Recover, key, encodeRecoverPayload(payload));
  }

  /** list (4, ours): the server's pods, a JSON array. The request key is empty (all spaces). */
  list(): unknown[] {
    const v = this.jsonReply(Command.List);
    if (!Array.isArray(v))
      throw this.protocolError(Command.List, '', `payload is not an array: ${JSON.stringify(v).slice(0, 80)}`);
    return v;
  }

  /** status (6, ours): whether the server has restored its pods and is ready, with the reasons when not. */
  status(): StatusReport {
    const v = this.jsonReply(Command.Status);
    const o = v as Partial<StatusReport> | null;
    if (typeof o !== 'object' || o === null || typeof o.ready !== 'boolean' || !Array.isArray(o.reasons)) {
      throw this.protocolError(Command.Status, '', `payload is not a status report: ${JSON.stringify(v).slice(0, 80)}`);
    }
    return o as StatusReport;
  }

  /** gc (7, ours): one CNI GC now; what it removed. */
  gc(): GcSummary {
    const v = this.jsonReply(Command.Gc) as Partial<GcSummary> | null;
    if (typeof v !== 'object' || v === null || !Array.isArray(v.removed) || !Array.isArray(v.errors)) {
      throw this.protocolError(Command.Gc, '', `payload is not a GC report: ${JSON.stringify(v).slice(0, 80)}`);
    }
    return v as GcSummary;
  }

  /** check (8, ours): the pod's checks now; its failures when it fails. */
  check(key: string): CheckSummary {
    validateKey(key);
    const r = this.request(Command.Check, key, null);
    return this.decode(Command.Check, key, () => {
      const v = JSON.parse(r.data.toString('utf8')) as Partial<CheckSummary>;
      if (typeof v.ok !== 'boolean' || !Array.isArray(v.failures)) throw new Error('not a check report');
      return v as CheckSummary;
    });
  }

  /** A keyless request of ours whose reply is JSON. */
  private jsonReply(command: Command): unknown {
    const r = this.request(command, '', null);
    try {
      return JSON.parse(r.data.toString('utf8'));
    } catch (e) {
      const op = commandName(command);
      throw new VmpodError(ErrorCode.Protocol, `${op} response is not JSON: ${(e as Error).message}`, { cause: e, op });
    }
  }

  private decode<T>(command: Command, key: string, f: () => T): T {
    try {
      return f();
    } catch (e) {
      const why = e instanceof Error ? e.message : String(e);
      throw new VmpodError(
        ErrorCode.Protocol,
        `${commandName(command)} ${JSON.stringify(key)} via ${this.socketPath}: bad response payload: ${why}`,
        {
          cause: e,
          key,
          op: commandName(command),
        },
      );
    }
  }

  private protocolError(command: Command, key: string, msg: string): VmpodError {
    return new VmpodError(
      ErrorCode.Protocol,
      `${commandName(command)} ${JSON.stringify(key)} via ${this.socketPath}: ${msg}`,
      { key, op: commandName(command) },
    );
  }

  private syscallError(command: Command, key: string, step: string, e: unknown): VmpodError {
    const errno = errnoOf(e);
    // SO_RCVTIMEO/SO_SNDTIMEO expiry shows as EAGAIN/EWOULDBLOCK
    const code = errno === 'EAGAIN' || errno === 'EWOULDBLOCK' ? ErrorCode.Timeout : ErrorCode.Syscall;
    const what =
      code === ErrorCode.Timeout ? `timed out after ${this.timeoutMs} ms` : ((e as Error)?.message ?? String(e));
    return new VmpodError(
      code,
      `${commandName(command)} ${JSON.stringify(key)} via ${this.socketPath}: ${step}: ${what}`,
      {
        cause: e,
        key,
        op: commandName(command),
      },
    );
  }

  /** One request on a fresh connection. Any fds received are closed on every error path. */
  private request(command: Command, key: string, payload: Buffer | null, expectFds = false): Response {
    const n = native();
    const header = encodeHeader({ command, dataSize: payload?.length ?? 0, oobSize: 0, key });
    let fd: number;
    try {
      fd = n.connectUnix(this.socketPath);
    } catch (e) {
      throw this.syscallError(command, key, 'connect', e);
    }
    const fds: number[] = [];
    try {
      if (this.timeoutMs > 0) n.setTimeouts(fd, this.timeoutMs);
      try {
        n.writeAll(fd, payload && payload.length > 0 ? Buffer.concat([header, payload]) : header);
      } catch (e) {
        throw this.syscallError(command, key, 'write request', e);
      }
      const resp = this.readResponse(n, fd, command, key, fds);
      if (resp.header.command === ERROR_COMMAND) {
        throw new VmpodError(ErrorCode.Internal, `server returned error: ${resp.data.toString('utf8')}`, {
          key,
          op: commandName(command),
        });
      }
      if (resp.header.command !== responseOf(command)) {
        throw this.protocolError(
          command,
          key,
          `unexpected response command 0x${resp.header.command.toString(16).padStart(2, '0')} ` +
            `(${commandName(resp.header.command)})`,
        );
      }
      // Virtlet's client checks the echoed key on add; we check it on every keyed command
      if (command !== Command.List && command !== Command.Status && command !== Command.Gc && resp.header.key !== key) {
        throw this.protocolError(command, key, `response is for key ${JSON.stringify(resp.header.key)}`);
      }
      if (!expectFds && fds.length > 0)
        throw this.protocolError(command, key, `unexpected ${fds.length} fds in the response`);
      return resp;
    } catch (e) {
      closeAll(n, fds);
      throw e;
    } finally {
      try {
        n.close(fd);
      } catch {
        // the request's own result matters more than a failing close of our socket
      }
    }
  }

  /** Reads one response; pushes every received fd onto fds as soon as it arrives (the caller closes them on error). */
  private readResponse(n: Native, fd: number, command: Command, key: string, fds: number[]): Response {
    const recv = (max: number, oob: number, step: string) => {
      let r;
      try {
        r = n.recvMsg(fd, max, oob);
      } catch (e) {
        throw this.syscallError(command, key, step, e);
      }
      fds.push(...r.fds);
      // MSG_CTRUNC: the kernel dropped fds that did not fit; the set we hold is incomplete
      if (r.ctrunc) throw this.protocolError(command, key, `${step}: control data truncated (fds lost)`);
      return r.data;
    };

    // the header, fully: a stream read may return it in pieces
    const head: Buffer[] = [];
    let got = 0;
    while (got < HEADER_SIZE) {
      const d = recv(HEADER_SIZE - got, 0, 'read response header');
      if (d.length === 0)
        throw this.protocolError(command, key, `connection closed after ${got} of ${HEADER_SIZE} header bytes`);
      head.push(d);
      got += d.length;
    }
    let header: Header;
    try {
      header = decodeHeader(Buffer.concat(head));
    } catch (e) {
      throw new VmpodError(
        ErrorCode.Protocol,
        `${commandName(command)} ${JSON.stringify(key)} via ${this.socketPath}: ${(e as Error).message}`,
        { cause: e, key },
      );
    }
    if (header.dataSize > MAX_PAYLOAD)
      throw this.protocolError(command, key, `response claims ${header.dataSize} payload bytes (max ${MAX_PAYLOAD})`);
    if (header.oobSize > cmsgSpace(MAX_FDS))
      throw this.protocolError(command, key, `response claims oobSize ${header.oobSize} (max ${cmsgSpace(MAX_FDS)})`);
    if (header.command === ERROR_COMMAND && header.oobSize !== 0)
      throw this.protocolError(command, key, `error reply with oobSize ${header.oobSize}`);

    let data = Buffer.alloc(0);
    if (header.dataSize > 0 || header.oobSize > 0) {
      // payload and fds come in one sendmsg; offer exactly oobSize control bytes, like Virtlet's client.
      // With fds and no payload the server sends one filler byte: read 1 and drop it.
      const first = recv(Math.max(header.dataSize, 1), header.oobSize, 'read response payload');
      if (first.length === 0)
        throw this.protocolError(
          command,
          key,
          `connection closed before the payload (${header.dataSize} bytes, oobSize ${header.oobSize})`,
        );
      if (header.oobSize > 0 && cmsgSpace(fds.length) !== header.oobSize) {
        throw this.protocolError(
          command,
          key,
          `received ${fds.length} fds, but oobSize ${header.oobSize} announced CMSG_SPACE for another count`,
        );
      }
      if (header.dataSize > 0) {
        const parts = [first];
        let have = first.length;
        while (have < header.dataSize) {
          const d = recv(header.dataSize - have, 0, 'read response payload');
          if (d.length === 0)
            throw this.protocolError(
              command,
              key,
              `connection closed after ${have} of ${header.dataSize} payload bytes`,
            );
          parts.push(d);
          have += d.length;
        }
        data = Buffer.concat(parts);
      }
    }
    return { header, data, fds };
  }
}
