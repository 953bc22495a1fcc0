// vmpod_native: the only place in vmpod-node that makes raw syscalls. This file only lists the exports; each job
// has its own file:
//   sockets.c   Unix sockets of the daemon and the client, SCM_RIGHTS, sd_notify
//   poller.c    pollReadable: an fd watched on the event loop
//   fastget.c   the fast get server's loop: answers gets on the fd protocol without JS
//   fastget_js.c  its JS object (fastGetServer) and methods
//   files.c     lockExclusive, exchangePaths
//   process.c   mallocArenaMax, reserveFds: process-wide settings of the daemon
//   exec.c      close, close-on-exec flags, the inherited-fd scan, execve
//   spawn.c     spawnChild, childStdin, killGroup
//   netns.c     entering a netns for one call; named netns (netnsMake, netnsBind, netnsDel)
//   tap.c       openTap, openTapQueues (on the loop's thread or a pool thread)
//   sysctl.c    the /proc/sys writer of netnsMake and netlinkInNetns
//   netsock.c   the DHCP UDP and IPv6 packet sockets in a pod netns, recvFrom, recvFrame, sendTo
//   netlink.c   netlinkInNetns: rtnetlink, persistent taps, nf_tables, sysctls in one batch
//   common.c    errors, argument helpers, promises of pool-thread work (declared in common.h)
//
// Every exported function is one synchronous call, except those that return a promise (work on a libuv pool
// thread) or take a callback (spawnChild, the fast get server, pollers): src/native.ts says which. Failures throw
// (or reject with) an Error whose `code` is the errno name ("EBUSY"), `errno` the positive errno number, and
// whose message names the operation and the object, e.g. "TUNSETIFF tap0 in /var/run/netns/x: EBUSY (Device or
// resource busy)". Bad JS arguments throw TypeError. Every fd the addon creates is close-on-exec. Blocking calls
// retry EINTR. The typed interface and the doc of every function is src/native.ts.

#include "common.h"

static napi_value Init(napi_env env, napi_value exports) {
  static const struct {
    const char *name;
    napi_callback cb;
  } fns[] = {
      {"listenUnix", js_listenUnix},
      {"accept", js_accept},
      {"peerCred", js_peerCred},
      {"read", js_read},
      {"trySendMsg", js_trySendMsg},
      {"lockExclusive", js_lockExclusive},
      {"pollReadable", js_pollReadable},
      {"fastGetServer", js_fastGetServer},
      {"spawnChild", js_spawnChild},
      {"childStdin", js_childStdin},
      {"killGroup", js_killGroup},
      {"close", js_close},
      {"exchangePaths", js_exchangePaths},
      {"mallocArenaMax", js_mallocArenaMax},
      {"reserveFds", js_reserveFds},
      {"connectUnix", js_connectUnix},
      {"writeAll", js_writeAll},
      {"recvMsg", js_recvMsg},
      {"setTimeouts", js_setTimeouts},
      {"dupCloexec", js_dupCloexec},
      {"execve", js_execve},
      {"inheritableFds", js_inheritableFds},
      {"openTap", js_openTap},
      {"openTapQueues", js_openTapQueues},
      {"udpSocketInNetns", js_udpSocketInNetns},
      {"packetSocketInNetns", js_packetSocketInNetns},
      {"recvFrom", js_recvFrom},
      {"recvFrame", js_recvFrame},
      {"sendTo", js_sendTo},
      {"notifyDatagram", js_notifyDatagram},
      {"netnsMake", js_netnsMake},
      {"netnsBind", js_netnsBind},
      {"netnsDel", js_netnsDel},
      {"netlinkInNetns", js_netlinkInNetns},
  };
  for (size_t i = 0; i < sizeof(fns) / sizeof(fns[0]); i++) {
    napi_value f;
    if (napi_create_function(env, fns[i].name, NAPI_AUTO_LENGTH, fns[i].cb, NULL, &f) != napi_ok ||
        napi_set_named_property(env, exports, fns[i].name, f) != napi_ok)
      return NULL;
  }
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, Init)
