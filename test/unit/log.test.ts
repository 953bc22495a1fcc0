import { describe, expect, it } from 'vitest';
import { pino, type Logger } from 'pino';
import { lazyChild } from '../../src/log.js';

/** A pino logger at `level` whose lines land in `lines`, and a count of the child() calls made on it. */
function capture(level: string): { log: Logger; lines: Record<string, unknown>[]; children: () => number } {
  const lines: Record<string, unknown>[] = [];
  const log = pino({ level, base: null, timestamp: false }, { write: (s: string) => lines.push(JSON.parse(s)) });
  let made = 0;
  const child = log.child;
  // on the instance, so the children (made from it) count through it too
  log.child = function (this: Logger, b: Record<string, unknown>) {
    made++;
    return child.call(this, b);
  } as Logger['child'];
  return { log, lines, children: () => made };
}

describe('lazyChild', () => {
  it('makes no child while it writes nothing, or only lines below the level', () => {
    const { log, lines, children } = capture('info');
    const lazy = lazyChild(log, { key: 'k1', op: 'restore' });
    lazy.debug('not written');
    lazy.trace({ x: 1 }, 'not written either');
    expect(lazy.isLevelEnabled('debug')).toBe(false);
    expect(lazy.isLevelEnabled('warn')).toBe(true);
    expect(children()).toBe(0);
    expect(lines).toEqual([]);
  });

  it('writes a line at the level with its bindings, making the child once', () => {
    const { log, lines, children } = capture('info');
    const lazy = lazyChild(log, { key: 'k1', op: 'add' });
    lazy.info({ durationMs: 3 }, 'add done');
    lazy.warn('again');
    expect(children()).toBe(1);
    expect(lines).toEqual([
      { level: 30, key: 'k1', op: 'add', durationMs: 3, msg: 'add done' },
      { level: 40, key: 'k1', op: 'add', msg: 'again' },
    ]);
    expect(lazy.bindings()).toEqual({ key: 'k1', op: 'add' });
  });

  it('is picked by level name, as a computed call', () => {
    const { log, lines } = capture('debug');
    const lazy = lazyChild(log, { key: 'k2' });
    const quiet = true;
    lazy[quiet ? 'debug' : 'info']('restored');
    expect(lines).toEqual([{ level: 20, key: 'k2', msg: 'restored' }]);
  });

  it('gives lazy children that carry both sets of bindings', () => {
    const { log, lines, children } = capture('info');
    const pod = lazyChild(log, { key: 'k3' });
    const dhcp = pod.child({ component: 'dhcp', mac: '02:00:00:00:00:01' });
    dhcp.debug('a request');
    expect(children()).toBe(0);
    dhcp.error({ err: 'x' }, 'send failed');
    expect(children()).toBe(2);
    expect(lines).toEqual([
      { level: 50, key: 'k3', component: 'dhcp', mac: '02:00:00:00:00:01', err: 'x', msg: 'send failed' },
    ]);
  });
});
