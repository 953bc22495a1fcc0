// What a VM runtime gets from this package (built output, as a dependency would see it).
import { describe, it, expect } from 'vitest';
import { execFileSync } from 'node:child_process';
import { REPO } from '../helpers/daemon.js';

describe('package exports', () => {
  it('vmpod-node/devices sorts CRI sandbox devices so a VFIO node never becomes a disk', () => {
    const script = `
      import { classifyCriDevices } from 'vmpod-node/devices';
      const out = classifyCriDevices([
        { containerPath: '/dev/vfio/vfio', hostPath: '/dev/vfio/vfio', permissions: 'mrw' },
        { containerPath: '/dev/vfio/67', hostPath: '/dev/vfio/67', permissions: 'mrw' },
        { containerPath: '/dev/vfio/noiommu-3', hostPath: '/dev/vfio/noiommu-3', permissions: 'mrw' },
        { containerPath: '/dev/null', hostPath: '/dev/null', permissions: 'r' },
      ]);
      console.log(JSON.stringify(out));`;
    // a self-reference by package name resolves through package.json "exports", like a dependency's import
    const out = JSON.parse(
      execFileSync(process.execPath, ['--input-type=module', '-e', script], { cwd: REPO, encoding: 'utf8' }),
    );
    expect(out.vfioGroups).toEqual([
      { group: '67', noiommu: false, hostPath: '/dev/vfio/67' },
      { group: '3', noiommu: true, hostPath: '/dev/vfio/noiommu-3' },
    ]);
    expect(out.vfioContainer.map((d: { hostPath: string }) => d.hostPath)).toEqual(['/dev/vfio/vfio']);
    expect(out.block).toEqual([]);
    expect(out.other.map((d: { hostPath: string }) => d.hostPath)).toEqual(['/dev/null']);
  });
});
