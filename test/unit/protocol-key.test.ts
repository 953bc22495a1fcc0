import { describe, expect, it } from 'vitest';
import { keyProblems, validateKey } from '../../src/protocol/key.js';
import { isVmpodError } from '../../src/errors.js';

describe('validateKey', () => {
  it.each([
    'a',
    'pod-1',
    '0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef',
    'A.b_c-D',
    '...',
    '.hidden',
    'a..b',
  ])('accepts %j', (key) => {
    expect(validateKey(key)).toBe(key);
    expect(keyProblems(key)).toEqual([]);
  });

  it.each([
    ['', /bad key "": is empty/],
    ['.', /bad key ".": is "." or ".."/],
    ['..', /bad key "..": is "." or ".."/],
    ['a/b', /bad key "a\/b": has characters outside \[A-Za-z0-9._-\]: "\/"/],
    ['a b', /bad key "a b": has characters outside .*: " "/],
    ['x'.repeat(65), /is 65 bytes, at most 64/],
    ['pöd', /bad key "pöd": has characters outside .*: "ö"/],
    ['../x', /bad key "..\/x": has characters outside .*: "\/"/],
    ['a\u0000', /bad key "a\\u0000"/],
    ['a\nb', /bad key "a\\nb"/],
    ['/etc/passwd', /has characters outside/],
  ])('rejects %j', (key, msg) => {
    try {
      validateKey(key);
      expect.unreachable();
    } catch (e) {
      expect(isVmpodError(e) && e.code).toBe('BAD_KEY');
      expect((e as Error).message).toMatch(msg);
      expect((e as Error).message).toContain('must match [A-Za-z0-9._-], 1..64 bytes, not "." or ".."');
    }
  });

  it('reports every problem at once', () => {
    const key = 'é/'.repeat(30);
    expect(keyProblems(key)).toEqual(['is 90 bytes, at most 64 fit in the header', 'has characters outside [A-Za-z0-9._-]: "é/"']);
  });
});
