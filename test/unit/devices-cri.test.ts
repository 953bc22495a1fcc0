import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { describe, expect, it } from 'vitest';
import { ErrorCode } from '../../src/errors.js';
import { classifyCriDevices, parseCriDevices } from '../../src/devices/index.js';

describe('parseCriDevices', () => {
  it('accepts camelCase and snake_case', () => {
    expect(
      parseCriDevices(
        '[{"containerPath":"/dev/vfio/67","hostPath":"/dev/vfio/67","permissions":"mrw"},{"container_path":"/dev/vfio/vfio","host_path":"/dev/vfio/vfio","permissions":"mrw"}]',
        'VMPOD_CRI_DEVICES',
      ),
    ).toEqual([
      { containerPath: '/dev/vfio/67', hostPath: '/dev/vfio/67', permissions: 'mrw' },
      { containerPath: '/dev/vfio/vfio', hostPath: '/dev/vfio/vfio', permissions: 'mrw' },
    ]);
    expect(parseCriDevices('null', 'X')).toEqual([]);
  });
  it.each(['{', '{"a":1}', '[{"containerPath":"/dev/x"}]', '[7]'])('rejects %j naming the variable and value', (v) => {
    expect(() => parseCriDevices(v, 'VMPOD_CRI_DEVICES')).toThrow(
      expect.objectContaining({
        code: ErrorCode.BadRequest,
        message: expect.stringContaining(`VMPOD_CRI_DEVICES=${JSON.stringify(v)}`),
      }),
    );
  });
});

describe('classifyCriDevices', () => {
  it('VFIO nodes are never disks; block devices are; missing paths are other', () => {
    // a real block device node made for the test (loop major 7), removed afterwards
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'vmpod-cri-'));
    try {
      const blk = path.join(dir, 'blk');
      // mknod through the coreutils binary: Node has no mknod
      execFileSync('mknod', [blk, 'b', '7', '200'], { timeout: 5000 });
      const dev = (p: string, c = p) => ({ containerPath: c, hostPath: p, permissions: 'mrw' });
      const r = classifyCriDevices([
        dev('/dev/vfio/67'),
        dev('/dev/vfio/noiommu-12'),
        dev('/dev/vfio/vfio'),
        dev('/dev/vfio/67'),
        dev('/dev/vfio/devices/vfio0'),
        dev(blk, '/dev/vdb'),
        dev(path.join(dir, 'missing')),
        dev('/dev/null'),
      ]);
      expect(r.vfioGroups).toEqual([
        { group: '67', noiommu: false, hostPath: '/dev/vfio/67' },
        { group: '12', noiommu: true, hostPath: '/dev/vfio/noiommu-12' },
      ]);
      expect(r.vfioContainer.map((d) => d.hostPath)).toEqual(['/dev/vfio/vfio']);
      expect(r.block.map((d) => d.hostPath)).toEqual([blk]);
      expect(r.other.map((d) => d.hostPath)).toEqual([
        '/dev/vfio/devices/vfio0',
        path.join(dir, 'missing'),
        '/dev/null',
      ]);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
    expect(fs.existsSync(dir)).toBe(false);
  });
});
