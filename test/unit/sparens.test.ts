// SpareNetns's timing (src/podnet/sparens.ts): spares are made only after an idle spell, never while an add or a
// release is in flight, up to the target; a failure is said once at warn; close lets every spare go. `make` hands out
// fds of /dev/null here (the class only keeps and closes them).
import { describe, it, expect, vi, afterEach } from 'vitest';
import { openSync, readlinkSync } from 'node:fs';
import { SpareNetns, type Spare } from '../../src/podnet/sparens.js';
import { Binding } from '../../src/podnet/binding.js';

afterEach(() => vi.useRealTimers());

const isOpen = (fd: number): boolean => {
  try {
    readlinkSync(`/proc/self/fd/${fd}`);
    return true;
  } catch {
    return false;
  }
};

function logger() {
  const lines: { level: string; msg: string }[] = [];
  const at = (level: string) => (_o: unknown, msg: string) => lines.push({ level, msg });
  return { lines, log: { warn: at('warn'), debug: at('debug') } as never };
}

describe('SpareNetns', () => {
  it('makes spares up to its target once nothing ran for the idle time, and not before or meanwhile', async () => {
    vi.useFakeTimers();
    const made: number[] = [];
    const s = new SpareNetns(
      2,
      async () => {
        const fd = openSync('/dev/null', 'r');
        made.push(fd);
        return { fd, preparedFor: Binding.Bridge };
      },
      logger().log,
      100,
    );
    await vi.advanceTimersByTimeAsync(500);
    expect(made).toEqual([]); // none before the first add or release
    s.begin();
    s.begin();
    s.end();
    await vi.advanceTimersByTimeAsync(500);
    expect(made).toEqual([]); // one still in flight
    s.end();
    await vi.advanceTimersByTimeAsync(99);
    expect(made).toEqual([]);
    s.begin(); // a new request within the idle time starts it over
    s.end();
    await vi.advanceTimersByTimeAsync(99);
    expect(made).toEqual([]);
    await vi.advanceTimersByTimeAsync(1);
    expect(s.count).toBe(2);
    const { fd } = (await s.take())!;
    expect(made).toContain(fd);
    expect(s.count).toBe(1);
    s.close();
    expect(made.filter((f) => f !== fd).every((f) => !isOpen(f))).toBe(true);
    expect(isOpen(fd)).toBe(true); // taken: the caller's
    (await import('node:fs')).closeSync(fd);
  });

  it('a take while a spare is being made waits for it; one that finds none being made does not wait', async () => {
    vi.useFakeTimers();
    let finish: (spare: Spare) => void = () => {};
    const s = new SpareNetns(1, () => new Promise<Spare>((r) => (finish = r)), logger().log, 100);
    expect(await s.take()).toBeUndefined(); // nothing made, nothing being made
    s.begin();
    s.end();
    await vi.advanceTimersByTimeAsync(100); // the make has started
    s.begin(); // an add arrives meanwhile
    let got: Spare | undefined | 'pending' = 'pending';
    void s.take().then((spare) => (got = spare));
    await vi.advanceTimersByTimeAsync(0);
    expect(got).toBe('pending');
    const fd = openSync('/dev/null', 'r');
    const spare = { fd, preparedFor: Binding.TcRedirect };
    finish(spare);
    await vi.advanceTimersByTimeAsync(0);
    expect(got).toBe(spare);
    expect(s.count).toBe(0);
    (await import('node:fs')).closeSync(fd);
    s.end();
    s.close();
  });

  it('target 0 makes none; a failing make is said once at warn, then at debug', async () => {
    vi.useFakeTimers();
    let calls = 0;
    const none = new SpareNetns(0, async () => ({ fd: ++calls, preparedFor: Binding.Bridge }), logger().log, 10);
    none.begin();
    none.end();
    await vi.advanceTimersByTimeAsync(100);
    expect(calls).toBe(0);
    const { lines, log } = logger();
    const failing = new SpareNetns(
      1,
      async () => {
        throw new Error('no netns for you');
      },
      log,
      10,
    );
    for (let i = 0; i < 3; i++) {
      failing.begin();
      failing.end();
      await vi.advanceTimersByTimeAsync(20);
    }
    expect(lines.map((l) => l.level)).toEqual(['warn', 'debug', 'debug']);
    expect(await failing.take()).toBeUndefined();
  });
});
