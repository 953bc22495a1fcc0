// Shared by the addon's files: the includes, the errors, the argument helpers, the helpers one file offers another,
// and the entry points that vmpod.c exports.
#pragma once

#include <node_api.h>
#include <uv.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/filter.h>
#include <linux/netlink.h>
#include <linux/sockios.h>
// if_nametoindex (net/if.h clashes with linux/if.h)
extern unsigned int if_nametoindex(const char *ifname);
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

// SCM_MAX_FD (include/net/scm.h): the kernel refuses more fds in one SCM_RIGHTS message with EINVAL.
#define MAX_SCM_FDS 253
// Upper bound for one read/recv buffer: protects against a bogus size from JS.
#define MAX_IO_BYTES (64 * 1024 * 1024)
#define MAX_OOB_BYTES (64 * 1024)

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

// ---- common.c: errors (each throw_* returns NULL with an exception pending) and argument helpers

const char *errno_name(int err, char *buf, size_t len);
napi_value errno_error(napi_env env, int err, const char *what);
__attribute__((format(printf, 3, 4))) napi_value throw_errno(napi_env env, int err, const char *fmt, ...);
__attribute__((format(printf, 2, 3))) napi_value throw_type(napi_env env, const char *fmt, ...);
napi_value throw_napi(napi_env env, const char *what);
bool get_args(napi_env env, napi_callback_info info, size_t want, napi_value *argv, const char *fn);
bool get_int(napi_env env, napi_value v, const char *fn, const char *name, int64_t min, int64_t max, int64_t *out);
bool get_fd(napi_env env, napi_value v, const char *fn, int *fd);
bool get_bool(napi_env env, napi_value v, const char *fn, const char *name, bool *out);
char *get_string(napi_env env, napi_value v, const char *fn, const char *name);
bool get_bytes(napi_env env, napi_value v, const char *fn, const char *name, const uint8_t **data, size_t *len);
bool get_array_len(napi_env env, napi_value v, const char *fn, const char *name, uint32_t *len);
bool get_fd_array(napi_env env, napi_value v, const char *fn, const char *name, int **out, uint32_t *n, uint32_t maxn);
void free_strv(char **v);
char **get_string_array(napi_env env, napi_value v, const char *fn, const char *name);
napi_value make_int(napi_env env, int64_t x);
napi_value make_undefined(napi_env env);
napi_value make_null(napi_env env);
size_t put_scm_rights(char *ctl, const int *fds, size_t n);
void close_fds(const int *fds, size_t n);
int64_t now_ms(void);

#define NAPI_OK(call, what)                        \
  do {                                             \
    if ((call) != napi_ok) return throw_napi(env, what); \
  } while (0)

// ---- common.c: the promise of work run on a libuv pool thread

// A promise settled by `done` once `execute` ran on a pool thread; NULL with an exception pending on failure.
napi_value queue_promise(napi_env env, const char *name, napi_async_execute_callback execute,
                         napi_async_complete_callback done, void *data, napi_async_work *work, napi_deferred *deferred);
// Rejects with errno_error(err, what) when err is set, else resolves with ok (undefined when NULL).
void settle_promise(napi_env env, napi_deferred deferred, int err, const char *what, napi_value ok);

// ---- netns.c: entering a netns for one call (the calling thread only)

typedef struct {
  int orig;    // this thread's netns before entering
  int target;  // the netns at nsPath
} netns_guard_t;
int netns_enter_in(const char *fn, const char *ns_path, netns_guard_t *g, char *what, size_t wlen);
bool netns_enter(napi_env env, const char *fn, const char *ns_path, netns_guard_t *g);
void netns_leave(netns_guard_t *g, const char *ns_path);
bool get_netns_link(napi_env env, const char *fn, napi_value *argv, char **ns_path, char **name);

// ---- sysctl.c: the /proc/sys writer (shared with netns.c and netlink.c)

const char *sysctl_bad_setting(char **settings);
int sysctl_write_all(char **settings, const char **failed);

// ---- the exported entry points, by file (vmpod.c lists them for JS)

// sockets.c
napi_value js_listenUnix(napi_env env, napi_callback_info info);
napi_value js_accept(napi_env env, napi_callback_info info);
napi_value js_peerCred(napi_env env, napi_callback_info info);
napi_value js_read(napi_env env, napi_callback_info info);
napi_value js_trySendMsg(napi_env env, napi_callback_info info);
napi_value js_connectUnix(napi_env env, napi_callback_info info);
napi_value js_writeAll(napi_env env, napi_callback_info info);
napi_value js_recvMsg(napi_env env, napi_callback_info info);
napi_value js_setTimeouts(napi_env env, napi_callback_info info);
napi_value js_notifyDatagram(napi_env env, napi_callback_info info);
// poller.c
napi_value js_pollReadable(napi_env env, napi_callback_info info);
// fastget_js.c
napi_value js_fastGetServer(napi_env env, napi_callback_info info);
// files.c
napi_value js_lockExclusive(napi_env env, napi_callback_info info);
napi_value js_exchangePaths(napi_env env, napi_callback_info info);
// process.c
napi_value js_mallocArenaMax(napi_env env, napi_callback_info info);
napi_value js_reserveFds(napi_env env, napi_callback_info info);
// exec.c
napi_value js_close(napi_env env, napi_callback_info info);
napi_value js_dupCloexec(napi_env env, napi_callback_info info);
napi_value js_inheritableFds(napi_env env, napi_callback_info info);
napi_value js_execve(napi_env env, napi_callback_info info);
// spawn.c
napi_value js_spawnChild(napi_env env, napi_callback_info info);
napi_value js_childStdin(napi_env env, napi_callback_info info);
napi_value js_killGroup(napi_env env, napi_callback_info info);
// netns.c
napi_value js_netnsMake(napi_env env, napi_callback_info info);
napi_value js_netnsBind(napi_env env, napi_callback_info info);
napi_value js_netnsDel(napi_env env, napi_callback_info info);
// tap.c
napi_value js_openTap(napi_env env, napi_callback_info info);
napi_value js_openTapQueues(napi_env env, napi_callback_info info);
// netsock.c
napi_value js_udpSocketInNetns(napi_env env, napi_callback_info info);
napi_value js_packetSocketInNetns(napi_env env, napi_callback_info info);
napi_value js_recvFrom(napi_env env, napi_callback_info info);
napi_value js_recvFrame(napi_env env, napi_callback_info info);
napi_value js_sendTo(napi_env env, napi_callback_info info);
// netlink.c
napi_value js_netlinkInNetns(napi_env env, napi_callback_info info);
