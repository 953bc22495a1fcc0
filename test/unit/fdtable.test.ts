import { describe, expect, it } from 'vitest';
import { fdTableSize } from '../../src/tapmanager/fdtable.js';

describe('fdTableSize', () => {
  it("is a usual node's 1024 fds at least, and six per recorded pod beyond it", () => {
    expect(fdTableSize(0)).toBe(1024);
    expect(fdTableSize(100)).toBe(1024);
    expect(fdTableSize(150)).toBe(256 + 6 * 150);
    expect(fdTableSize(500)).toBe(256 + 6 * 500);
  });
});
