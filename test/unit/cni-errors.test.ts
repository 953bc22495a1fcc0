import { describe, expect, it } from 'vitest';
import { CniPluginError, parseCniErrorJson, pluginFailure } from '../../src/cni/errors.js';
import { escapeOutput, MAX_ERROR_OUTPUT } from '../../src/escape.js';
import { isVmpodError } from '../../src/errors.js';

describe('escapeOutput', () => {
  it('makes control characters visible and keeps tabs and text', () => {
    expect(escapeOutput('a\nb\r\x00\x1b[31m\tc\x7f\u0085é')).toBe('a\\nb\\r\\x00\\x1b[31m\tc\\x7f\\x85é');
  });

  it('caps the length and says how much was cut', () => {
    const s = escapeOutput('x'.repeat(MAX_ERROR_OUTPUT + 10));
    expect(s).toBe(`${'x'.repeat(MAX_ERROR_OUTPUT)}...[10 more characters]`);
  });
});

describe('parseCniErrorJson', () => {
  it('reads the spec shape', () => {
    expect(parseCniErrorJson(' {"cniVersion":"1.0.0","code":7,"msg":"bad","details":"d"}\n')).toEqual({
      cniVersion: '1.0.0',
      code: 7,
      msg: 'bad',
      details: 'd',
    });
    expect(parseCniErrorJson(Buffer.from('{"code":11,"msg":"later"}'))).toEqual({ code: 11, msg: 'later' });
  });

  it('ignores what is not a CNI error', () => {
    for (const s of ['', 'oops', '{"msg":"no code"}', '{"code":"7"}', '[1]', '{'])
      expect(parseCniErrorJson(s)).toBeUndefined();
  });

  it('escapes what the plugin wrote', () => {
    expect(parseCniErrorJson('{"code":1,"msg":"a\\nb"}')?.msg).toBe('a\\nb');
  });
});

describe('pluginFailure', () => {
  const base = { plugin: 'bridge', verb: 'ADD' };

  it('is a VmpodError with code CNI and the fields of the run', () => {
    const e = pluginFailure({
      ...base,
      exitCode: 1,
      stdout: '{"code":7,"msg":"bad config","details":"no bridge"}',
      stderr: 'x',
    });
    expect(e).toBeInstanceOf(CniPluginError);
    expect(isVmpodError(e)).toBe(true);
    expect(e.code).toBe('CNI');
    expect(e.name).toBe('CniPluginError');
    expect(e).toMatchObject({
      plugin: 'bridge',
      verb: 'ADD',
      exitCode: 1,
      timedOut: false,
      stderr: 'x',
      cniError: { code: 7, msg: 'bad config', details: 'no bridge' },
    });
    expect(e.message).toBe('plugin bridge ADD failed: [code 7] bad config: no bridge');
  });

  it.each([
    [{ exitCode: 1, stdout: '', stderr: '' }, 'plugin bridge ADD failed: exit code 1: no error output'],
    [{ exitCode: 3, stdout: 'plain words', stderr: '' }, 'plugin bridge ADD failed: exit code 3: plain words'],
    [{ signal: 'SIGSEGV', stderr: 'segfault' }, 'plugin bridge ADD failed: killed by signal SIGSEGV; stderr: segfault'],
    [
      { timedOut: true, timeoutMs: 500, signal: 'SIGKILL' },
      'plugin bridge ADD timed out after 500 ms (killed with SIGKILL)',
    ],
    [{ aborted: true, signal: 'SIGTERM' }, 'plugin bridge ADD aborted (killed with SIGTERM)'],
    [{ spawnError: new Error('spawn /x/bridge EACCES') }, 'plugin bridge ADD could not be run: spawn /x/bridge EACCES'],
    [{ outputTooLarge: true, exitCode: 0 }, 'plugin bridge ADD failed: its output exceeded the size limit (killed)'],
    [
      { outputTooLarge: true, outputLimitBytes: 1024, exitCode: 0 },
      'plugin bridge ADD failed: its output exceeded the size limit of 1024 bytes (killed)',
    ],
  ])('message for %j', (f, msg) => {
    expect(pluginFailure({ ...base, ...f }).message).toBe(msg);
  });

  it('marks a timeout', () => {
    expect(pluginFailure({ ...base, timedOut: true, timeoutMs: 5 }).timedOut).toBe(true);
  });
});
