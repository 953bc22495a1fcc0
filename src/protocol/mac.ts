// MAC address encodings. Go's encoding/json marshals net.HardwareAddr ([]byte) as standard base64 of the
// bytes, so Virtlet's JSON carries 42:a4:a6:22:80:2e as "QqSmIoAu", and Virtlet's client decodes nothing
// else. We emit base64 in Virtlet's fields and accept base64 or colon-hex on input.
import { ErrorCode, VmpodError } from '../errors.js';

const MAC_LEN = 6;
/** colon- or dash-separated hex pairs, one separator kind throughout */
const HEX_COLON = /^[0-9a-f]{2}(:[0-9a-f]{2}){5}$/i;
const HEX_DASH = /^[0-9a-f]{2}(-[0-9a-f]{2}){5}$/i;
/** 6 bytes are exactly 8 base64 characters, no padding (StdEncoding) */
const B64_MAC = /^[A-Za-z0-9+/]{8}$/;

function badMac(s: string, why: string): VmpodError {
  return new VmpodError(ErrorCode.BadRequest, `bad MAC ${JSON.stringify(s)}: ${why}`);
}

function bytesToHex(b: Buffer): string {
  return [...b].map((x) => x.toString(16).padStart(2, '0')).join(':');
}

function hexToBytes(s: string): Buffer {
  return Buffer.from(s.replace(/[:-]/g, ''), 'hex');
}

/** "42:a4:a6:22:80:2e" (or dash-separated, any case) -> "QqSmIoAu". */
export function macToBase64(hex: string): string {
  if (!HEX_COLON.test(hex) && !HEX_DASH.test(hex)) throw badMac(hex, 'expected six hex pairs separated by ":" or "-"');
  return hexToBytes(hex).toString('base64');
}

/** "QqSmIoAu" -> "42:a4:a6:22:80:2e". */
export function base64ToMac(b64: string): string {
  if (!B64_MAC.test(b64)) throw badMac(b64, `expected base64 of ${MAC_LEN} bytes (8 characters)`);
  return bytesToHex(Buffer.from(b64, 'base64'));
}

/** Colon-hex (any case, ":" or "-") or Go base64 of 6 bytes -> lower-case colon-hex. Throws on anything else. */
export function parseMac(s: string): string {
  if (HEX_COLON.test(s) || HEX_DASH.test(s)) return bytesToHex(hexToBytes(s));
  if (B64_MAC.test(s)) return base64ToMac(s);
  throw badMac(s, `expected colon-hex (aa:bb:cc:dd:ee:ff) or base64 of ${MAC_LEN} bytes`);
}
