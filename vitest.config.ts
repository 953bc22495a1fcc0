import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    pool: 'forks',
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // kernel-object tests are unique per test; files may run side by side
    fileParallelism: true,
    maxWorkers: 2,
  },
});
