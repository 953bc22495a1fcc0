// Types of scripts/protocol-h.mjs for the test that checks native/protocol.h.
export interface ProtocolDefinitions {
  MAGIC: number;
  HEADER_SIZE: number;
  KEY_SIZE: number;
  HEADER_LAYOUT: Readonly<Record<string, number>>;
  Command: Readonly<Record<string, number>>;
  RESPONSE_BIT: number;
  ERROR_COMMAND: number;
  MAX_PAYLOAD: number;
  MAX_FDS: number;
  KEY_TRIM_BYTES: readonly number[];
}
export function renderProtocolH(p: ProtocolDefinitions): string;
