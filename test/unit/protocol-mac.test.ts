import { describe, expect, it } from 'vitest';
import { base64ToMac, macToBase64, parseMac } from '../../src/protocol/mac.js';
import { isVmpodError } from '../../src/errors.js';

describe('MAC encodings', () => {
  it('matches Go net.HardwareAddr JSON (base64 of the 6 bytes)', () => {
    expect(macToBase64('42:a4:a6:22:80:2e')).toBe('QqSmIoAu');
    expect(base64ToMac('QqSmIoAu')).toBe('42:a4:a6:22:80:2e');
    expect(macToBase64('ff:ff:ff:ff:ff:ff')).toBe('////////');
    expect(base64ToMac('////////')).toBe('ff:ff:ff:ff:ff:ff');
    expect(macToBase64('00:00:00:00:00:00')).toBe('AAAAAAAA');
    expect(macToBase64('42-A4-A6-22-80-2E')).toBe('QqSmIoAu');
  });

  it.each([
    ['42:a4:a6:22:80:2e', '42:a4:a6:22:80:2e'],
    ['42:A4:A6:22:80:2E', '42:a4:a6:22:80:2e'],
    ['42-a4-a6-22-80-2e', '42:a4:a6:22:80:2e'],
    ['QqSmIoAu', '42:a4:a6:22:80:2e'],
    ['AAAAAAAA', '00:00:00:00:00:00'],
    ['fe:ed:00:00:00:01', 'fe:ed:00:00:00:01'],
    ['+/+/+/+/', 'fb:ff:bf:fb:ff:bf'],
  ])('parseMac(%j) = %j', (input, out) => {
    expect(parseMac(input)).toBe(out);
  });

  it.each([
    '',
    '42:a4:a6:22:80',
    '42:a4:a6:22:80:2e:00',
    '42:a4-a6:22:80:2e',
    '42a4a622802e',
    '42:a4:a6:22:80:2g',
    ' 42:a4:a6:22:80:2e',
    'QqSmIoA',
    'QqSmIoAu==',
    'QqSmIoAuAA==',
    'QqSm-oAu',
    'not a mac',
  ])('parseMac rejects %j', (input) => {
    try {
      parseMac(input);
      expect.unreachable();
    } catch (e) {
      expect(isVmpodError(e) && e.code).toBe('BAD_REQUEST');
      expect((e as Error).message).toContain(`bad MAC ${JSON.stringify(input)}`);
    }
  });

  it('macToBase64 and base64ToMac take only their own form', () => {
    expect(() => macToBase64('QqSmIoAu')).toThrow(/bad MAC "QqSmIoAu"/);
    expect(() => base64ToMac('42:a4:a6:22:80:2e')).toThrow(/base64 of 6 bytes/);
  });
});
