// CNI errors as data (CNI spec, "Error" section; libcni pkg/types.Error and pkg/invoke pluginErr).
// Everything a plugin printed is escaped and capped before it goes into a message: a plugin's output
// must not forge log lines or flood an error reply.
import { ErrorCode, VmpodError } from '../errors.js';
import type { CniErrorJson } from './types.js';
import { escapeOutput } from '../escape.js';

/** "[code 7] msg: details", the one rendering of a CNI error. */
export function formatCniError(e: CniErrorJson): string {
  const details = e.details !== undefined && e.details !== '' ? `: ${e.details}` : '';
  return `[code ${e.code}] ${e.msg}${details}`;
}

/**
 * A CNI-spec error produced by us (bad version, undecodable result, invalid runtime values), with the
 * spec's numeric code in `cniError.code` (VmpodError.code stays the project-wide 'CNI').
 */
export class CniError extends VmpodError {
  readonly cniError: CniErrorJson;

  constructor(cniError: CniErrorJson, opts: { cause?: unknown; key?: string; op?: string } = {}) {
    super(ErrorCode.Cni, formatCniError(cniError), opts);
    this.cniError = cniError;
  }
}
Object.defineProperty(CniError.prototype, 'name', { value: 'CniError', enumerable: false });

/**
 * The plugin's error JSON ({cniVersion, code, msg, details}) if `text` is one, else undefined.
 * msg and details are escaped: they are plugin output.
 */
export function parseCniErrorJson(text: string | Uint8Array): CniErrorJson | undefined {
  const s = (typeof text === 'string' ? text : Buffer.from(text).toString('utf8')).trim();
  if (!s.startsWith('{')) return undefined;
  let v: unknown;
  try {
    v = JSON.parse(s);
  } catch {
    return undefined;
  }
  if (typeof v !== 'object' || v === null) return undefined;
  const o = v as Record<string, unknown>;
  if (typeof o.code !== 'number' || !Number.isInteger(o.code)) return undefined;
  const out: CniErrorJson = { code: o.code, msg: escapeOutput(typeof o.msg === 'string' ? o.msg : '') };
  if (typeof o.cniVersion === 'string') out.cniVersion = escapeOutput(o.cniVersion, 32);
  if (typeof o.details === 'string' && o.details !== '') out.details = escapeOutput(o.details);
  return out;
}

/** What is known about one failed plugin run; the input of pluginFailure(). */
export interface PluginFailure {
  plugin: string;
  verb: string;
  exitCode?: number;
  signal?: string;
  /** the run hit timeoutMs and was killed */
  timedOut?: boolean;
  timeoutMs?: number;
  /** the caller's AbortSignal fired and the run was killed */
  aborted?: boolean;
  /** the process could not be started (ENOENT, EACCES, ...) */
  spawnError?: unknown;
  /** stdout exceeded the exec's buffer limit */
  outputTooLarge?: boolean;
  outputLimitBytes?: number;
  stdout?: string | Uint8Array;
  stderr?: string | Uint8Array;
}

/** A plugin that failed, hung, crashed or could not be run. `stderr` is escaped and capped. */
export class CniPluginError extends VmpodError {
  readonly plugin: string;
  readonly verb: string;
  readonly exitCode?: number;
  readonly signal?: string;
  readonly timedOut: boolean;
  readonly stderr: string;
  readonly cniError?: CniErrorJson;

  constructor(
    message: string,
    f: {
      plugin: string;
      verb: string;
      exitCode?: number;
      signal?: string;
      timedOut?: boolean;
      stderr?: string;
      cniError?: CniErrorJson;
    },
    opts: { cause?: unknown; key?: string; op?: string } = {},
  ) {
    super(ErrorCode.Cni, message, opts);
    this.plugin = f.plugin;
    this.verb = f.verb;
    if (f.exitCode !== undefined) this.exitCode = f.exitCode;
    if (f.signal !== undefined) this.signal = f.signal;
    this.timedOut = f.timedOut === true;
    this.stderr = f.stderr ?? '';
    if (f.cniError !== undefined) this.cniError = f.cniError;
  }
}
Object.defineProperty(CniPluginError.prototype, 'name', { value: 'CniPluginError', enumerable: false });

/**
 * Build the one error for a failed plugin run (all messages are made here, like execa's createMessages).
 * The CNI error JSON is taken from stdout (spec: errors go to stdout), else from stderr.
 */
export function pluginFailure(f: PluginFailure): CniPluginError {
  const head = `plugin ${f.plugin} ${f.verb}`;
  const stderr = f.stderr === undefined ? '' : escapeOutput(f.stderr);
  const stderrNote = stderr.trim() !== '' ? `; stderr: ${stderr.trim()}` : '';
  const cniError =
    (f.stdout !== undefined ? parseCniErrorJson(f.stdout) : undefined) ??
    (f.stderr !== undefined ? parseCniErrorJson(f.stderr) : undefined);
  const fields = {
    plugin: f.plugin,
    verb: f.verb,
    exitCode: f.exitCode,
    signal: f.signal,
    timedOut: f.timedOut,
    stderr,
    cniError,
  };
  const killed = f.signal !== undefined ? ` (killed with ${f.signal})` : '';

  let message: string;
  if (f.timedOut === true) {
    message = `${head} timed out after ${f.timeoutMs ?? '?'} ms${killed}${stderrNote}`;
  } else if (f.aborted === true) {
    message = `${head} aborted${killed}${stderrNote}`;
  } else if (f.spawnError !== undefined) {
    const why = f.spawnError instanceof Error ? f.spawnError.message : String(f.spawnError);
    message = `${head} could not be run: ${why}`;
  } else if (f.outputTooLarge === true) {
    message =
      `${head} failed: its output exceeded the size ` +
      `limit${f.outputLimitBytes === undefined ? '' : ` of ${f.outputLimitBytes} bytes`} (killed)`;
  } else if (cniError !== undefined) {
    message = `${head} failed: ${formatCniError(cniError)}`;
  } else if (f.signal !== undefined) {
    message = `${head} failed: killed by signal ${f.signal}${stderrNote}`;
  } else {
    const out = f.stdout === undefined ? '' : escapeOutput(f.stdout).trim();
    const said = stderr.trim() !== '' ? stderr.trim() : out !== '' ? out : 'no error output';
    message = `${head} failed: exit code ${f.exitCode ?? '?'}: ${said}`;
  }
  return new CniPluginError(message, fields, f.spawnError !== undefined ? { cause: f.spawnError } : {});
}
