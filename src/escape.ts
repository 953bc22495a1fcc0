// The one escaping of untrusted text (plugin output, request fields) before it goes into an error reply or a
// log line: control characters become visible escapes, so such text cannot start a new line or drive a terminal.

/** Plugin output kept in an error: about 4 KiB (a CNI error is one JSON line; anything larger is noise). */
export const MAX_ERROR_OUTPUT = 4096;

/**
 * Escape control characters (C0 but TAB, DEL, C1) as visible escapes; cap the result at `max` characters.
 */
export function escapeOutput(text: string | Uint8Array, max = MAX_ERROR_OUTPUT): string {
  const s = typeof text === 'string' ? text : Buffer.from(text).toString('utf8');
  const escaped = s.replace(/[\u0000-\u0008\u000a-\u001f\u007f-\u009f]/g, (c) => {
    if (c === '\n') return '\\n';
    if (c === '\r') return '\\r';
    return `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`;
  });
  if (escaped.length <= max) return escaped;
  return `${escaped.slice(0, max)}...[${escaped.length - max} more characters]`;
}
