// The one identity rule: which request keys, pod names, namespaces and pod ids are usable. Checked once, when a
// request is decoded, before anything is created. Everything here is pure.
//
// - key (the pod sandbox id): libcni's container ID rule (it names the netns, the state file, libcni's result
//   cache and goes into CNI_CONTAINERID and K8S_POD_INFRA_CONTAINER_ID), at most 64 bytes (the header's key field).
// - podNs: a Kubernetes namespace, a DNS-1123 label. podName: a Kubernetes object name, a DNS-1123 subdomain.
//   Both go into CNI_ARGS (K8S_POD_NAMESPACE, K8S_POD_NAME), so neither may hold ';', '=', NUL or controls:
//   the Kubernetes rules already exclude them.
// - podId: the pod UID, a safe token (letters, digits, '.', '_', '-', ':'), at most 128 bytes.
// Empty podName, podNs and podId are allowed (tapctl and tests add pods without them); an empty key is not.
import { ErrorCode, VmpodError } from './errors.js';

/** libcni utils cniValidNameChars: container ids and network names (they become file names). */
export const CNI_VALID_NAME = /^[a-zA-Z0-9][a-zA-Z0-9_.-]*$/;
/** The header's key field is 64 bytes (protocol/commands.ts KEY_SIZE; a test keeps them equal). */
export const MAX_KEY_BYTES = 64;
const DNS1123_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const DNS1123_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const MAX_LABEL = 63;
const MAX_SUBDOMAIN = 253;
const MAX_POD_ID = 128;

/** The characters of s outside allowed, deduplicated, as one JSON string (controls visible). */
function outside(s: string, allowed: RegExp): string {
  return JSON.stringify([...new Set([...s].filter((c) => !allowed.test(c)))].join(''));
}

/** Every reason key is unusable; empty when it is good. */
export function keyProblems(key: string): string[] {
  const problems: string[] = [];
  const bytes = Buffer.byteLength(key, 'utf8');
  if (bytes === 0) return ['is empty'];
  if (bytes > MAX_KEY_BYTES) problems.push(`is ${bytes} bytes, at most ${MAX_KEY_BYTES} fit in the header`);
  if (/[^A-Za-z0-9_.-]/.test(key))
    problems.push(`has characters outside [A-Za-z0-9_.-]: ${outside(key, /[A-Za-z0-9_.-]/)}`);
  // libcni refuses a leading '.', '-' or '_'; this also keeps "." and ".." (the netns dir, its parent) out
  if (!/^[A-Za-z0-9]/.test(key)) problems.push('does not start with a letter or digit');
  return problems;
}

/** Returns key, or throws BadKey quoting the key and saying every reason it is unusable. */
export function validateKey(key: string): string {
  const problems = keyProblems(key);
  if (problems.length > 0) {
    throw new VmpodError(
      ErrorCode.BadKey,
      `bad key ${JSON.stringify(key)}: ${problems.join('; ')} (libcni's container ID rule: ` +
        `${CNI_VALID_NAME.source}, 1..${MAX_KEY_BYTES} bytes)`,
      { key },
    );
  }
  return key;
}

function dnsNameProblems(s: string, re: RegExp, max: number, what: string): string[] {
  if (s === '') return [];
  const problems: string[] = [];
  if (s.length > max) problems.push(`is ${s.length} characters, at most ${max}`);
  if (!re.test(s))
    problems.push(
      `is not a ${what} (lower-case letters, digits and '-'${what.includes('subdomain') ? ', dot-separated' : ''}, ` +
        `starting and ending with a letter or digit)`,
    );
  return problems;
}

/** A Kubernetes namespace: a DNS-1123 label (or empty: not given). */
export function podNsProblems(ns: string): string[] {
  return dnsNameProblems(ns, DNS1123_LABEL, MAX_LABEL, 'DNS-1123 label');
}

/** A Kubernetes pod name: a DNS-1123 subdomain (or empty: not given). */
export function podNameProblems(name: string): string[] {
  return dnsNameProblems(name, DNS1123_SUBDOMAIN, MAX_SUBDOMAIN, 'DNS-1123 subdomain');
}

/** A pod UID: a safe token (or empty: not given). */
export function podIdProblems(id: string): string[] {
  if (id === '') return [];
  const problems: string[] = [];
  if (Buffer.byteLength(id) > MAX_POD_ID) problems.push(`is ${Buffer.byteLength(id)} bytes, at most ${MAX_POD_ID}`);
  if (/[^A-Za-z0-9._:-]/.test(id))
    problems.push(`has characters outside [A-Za-z0-9._:-]: ${outside(id, /[A-Za-z0-9._:-]/)}`);
  if (!/^[A-Za-z0-9]/.test(id)) problems.push('does not start with a letter or digit');
  return problems;
}

/** What cannot go into a CNI_ARGS value ("K=V;K=V", passed in the environment): NUL, ';', '=', controls. */
export function cniArgProblems(value: string): string[] {
  // eslint-disable-next-line no-control-regex
  const bad = /[\u0000-\u001f\u007f-\u009f;=]/;
  return bad.test(value)
    ? [`holds characters CNI_ARGS cannot carry: ${outside(value, /[^\u0000-\u001f\u007f-\u009f;=]/)}`]
    : [];
}

/** Every problem of a pod's identity, field by field ("podName: is not ..."); empty when all are good. */
export function podDescProblems(d: {
  podId: string;
  podNs: string;
  podName: string;
}): { field: 'podId' | 'podNs' | 'podName'; problem: string }[] {
  const out: { field: 'podId' | 'podNs' | 'podName'; problem: string }[] = [];
  for (const problem of podIdProblems(d.podId)) out.push({ field: 'podId', problem });
  for (const problem of [...podNsProblems(d.podNs), ...cniArgProblems(d.podNs)]) out.push({ field: 'podNs', problem });
  for (const problem of [...podNameProblems(d.podName), ...cniArgProblems(d.podName)])
    out.push({ field: 'podName', problem });
  return out;
}
