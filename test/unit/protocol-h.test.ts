// native/protocol.h is the addon's copy of the fd protocol's constants: it must be what scripts/protocol-h.mjs
// renders from src/protocol today (the addon is compiled from the checked-in file, before any build).
import { describe, expect, it } from 'vitest';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { renderProtocolH } from '../../scripts/protocol-h.mjs';
import * as commands from '../../src/protocol/commands.js';
import * as header from '../../src/protocol/header.js';

describe('native/protocol.h', () => {
  it('is generated from src/protocol and current (run `npm run build` after changing the protocol)', () => {
    const file = readFileSync(join(import.meta.dirname, '../../native/protocol.h'), 'utf8');
    expect(file).toBe(renderProtocolH({ ...commands, ...header }));
  });

  it('names every field, command and trimmed byte', () => {
    const text = renderProtocolH({ ...commands, ...header });
    expect(text).toContain('#define PROTO_MAGIC 0x42424242u');
    expect(text).toContain('#define PROTO_OFF_DATA_SIZE 5');
    expect(text).toContain('#define PROTO_CMD_RELEASE_FORCE 5');
    expect(text).toContain('#define PROTO_KEY_TRIMMED(ch) ((ch) == 0x00 || (ch) == 0x09');
  });
});
