// The request key is the pod sandbox id. It also names the pod's netns (/var/run/netns/<key>) and its
// state file, so it must be safe as one path component before anything touches the filesystem.
import { ErrorCode, VmpodError } from '../errors.js';
import { KEY_SIZE } from './commands.js';

const KEY_CHARS = /^[A-Za-z0-9._-]*$/;

/** Every reason key is unusable; empty when it is good. */
export function keyProblems(key: string): string[] {
  const problems: string[] = [];
  const bytes = Buffer.byteLength(key, 'utf8');
  if (bytes === 0) problems.push('is empty');
  if (bytes > KEY_SIZE) problems.push(`is ${bytes} bytes, at most ${KEY_SIZE} fit in the header`);
  if (!KEY_CHARS.test(key)) {
    const bad = [...new Set([...key].filter((c) => !/[A-Za-z0-9._-]/.test(c)))].join('');
    problems.push(`has characters outside [A-Za-z0-9._-]: ${JSON.stringify(bad)}`);
  }
  // "." and ".." would make /var/run/netns/<key> name the directory itself or its parent
  if (key === '.' || key === '..') problems.push('is "." or ".."');
  return problems;
}

/** Returns key, or throws BadKey quoting the key and saying every reason it is unusable. */
export function validateKey(key: string): string {
  const problems = keyProblems(key);
  if (problems.length > 0) {
    throw new VmpodError(ErrorCode.BadKey, `bad key ${JSON.stringify(key)}: ${problems.join('; ')} (must match [A-Za-z0-9._-], 1..${KEY_SIZE} bytes, not "." or "..")`, { key });
  }
  return key;
}
