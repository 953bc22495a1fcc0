// How every tap of a pod is made, whichever binding joins it to its CNI link (plan.ts's bridge, tcredirect.ts):
//   persistent (ip tuntap sets TUNSETPERSIST), so it outlives our fd and a restarted daemon reopens it by name;
//   vnet_hdr: qemu's virtio-net and vhost use the virtio header (qemu probes the fd's flags itself);
//   multi_queue: a VM with several vCPUs gets a queue pair per vCPU, each open of the tap attaching one more queue;
//   a noqueue root qdisc, set while the tap is down. Left alone, the kernel gives a multi-queue tap an mq qdisc with a
//   pfifo_fast child for each of its 256 possible queues when it comes up (allocated then, freed with the tap), while
//   a tap never holds a packet back: tun drops what a full queue cannot take, qdisc or not (docs/networking.md,
//   "Queues, vhost and offloads").
// Pure.
import type { Op } from '../state/record.js';

export function makeTapOps(tap: string): Op[] {
  return [
    { op: 'ip', args: ['tuntap', 'add', 'dev', tap, 'mode', 'tap', 'vnet_hdr', 'multi_queue'] },
    { op: 'tc', args: ['qdisc', 'replace', 'dev', tap, 'root', 'noqueue'] },
  ];
}
