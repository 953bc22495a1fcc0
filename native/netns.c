// Network namespaces: entering one for a single call (netns_enter/netns_leave, used by the tap, socket and sysctl
// files), and named netns as iproute2 makes them (netnsMake, netnsBind, netnsDel) on pool threads.

#include "common.h"

// ---------------------------------------------------------------------------------------------
// netns-bound operations
//
// setns(CLONE_NEWNET) moves only the calling thread (Node's main thread). Each operation enters the
// target netns, makes its object and leaves again in the same synchronous call, so no JS ever runs in
// a foreign netns. The object keeps the netns it was created in (a tap: the netns current when
// /dev/net/tun was opened; a socket: the netns current at socket()).

// Enters the netns at ns_path (the calling thread only: the main thread or a pool thread). 0, or -errno with `what`
// naming the step that failed and nothing left open.
int netns_enter_in(const char *fn, const char *ns_path, netns_guard_t *g, char *what, size_t wlen) {
  g->orig = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  if (g->orig < 0) {
    int err = errno;
    snprintf(what, wlen, "%s: open /proc/thread-self/ns/net", fn);
    return -err;
  }
  g->target = open(ns_path, O_RDONLY | O_CLOEXEC);
  if (g->target < 0 || setns(g->target, CLONE_NEWNET) < 0) {
    int err = errno;
    snprintf(what, wlen, "%s: %s %s", fn, g->target < 0 ? "open netns" : "setns", ns_path);
    if (g->target >= 0) close(g->target);
    close(g->orig);
    return -err;
  }
  return 0;
}

// netns_enter_in on the main thread: on failure throws and returns false with nothing left open.
bool netns_enter(napi_env env, const char *fn, const char *ns_path, netns_guard_t *g) {
  char what[320];
  int r = netns_enter_in(fn, ns_path, g, what, sizeof(what));
  if (r < 0) throw_errno(env, -r, "%s", what);
  return r == 0;
}

// Returns to the original netns. Failing that, the thread would run everything that follows (sockets, child
// processes, a pool thread's later work) in a foreign netns: abort instead.
void netns_leave(netns_guard_t *g, const char *ns_path) {
  if (setns(g->orig, CLONE_NEWNET) < 0) {
    fprintf(stderr, "vmpod_native: setns back from %s failed: %s; aborting\n", ns_path,
            strerror(errno));
    abort();
  }
  close(g->orig);
  close(g->target);
}

// nsPath and a link name from argv[0..1] (malloc'd, the caller frees both either way). False with a TypeError
// pending when either is missing or the name is not 1 to IFNAMSIZ-1 bytes.
bool get_netns_link(napi_env env, const char *fn, napi_value *argv, char **ns_path, char **name) {
  *ns_path = get_string(env, argv[0], fn, "nsPath");
  *name = *ns_path ? get_string(env, argv[1], fn, "ifname") : NULL;
  if (!*name) return false;
  size_t nlen = strlen(*name);
  if (nlen == 0 || nlen >= IFNAMSIZ) {
    throw_type(env, "%s: ifname must be 1 to %d bytes, got %zu", fn, IFNAMSIZ - 1, nlen);
    return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// named netns, as iproute2's `ip netns add` / `ip netns del` make them (the same files, so `ip -n <name>`, CNI
// plugins and `ip netns list` see them): <dir> is a shared mount point (bound on itself once, so the netns
// mounts below it propagate to other mount namespaces), <dir>/<name> an empty file with the netns bind-mounted
// on it. One way to make one: netnsMake, on a libuv pool thread (unshare(CLONE_NEWNET) moves only that thread, which
// writes the sysctls, opens its new netns and goes back to its own before it runs anything else), then netnsBind
// names it (src/native.ts netnsAdd does both).

typedef struct {
  napi_async_work work;
  napi_deferred deferred;
  char *dir;
  char *path;
  char **settings;  // netnsMake: sysctls written inside the new netns before it is left (NULL: none)
  int fd;           // netnsMake: the new netns (its result); netnsBind: the netns to bind
  int err;
  char what[320];
} netns_work_t;

// Records the failure of `what` (printf format) with err, which the caller took from errno first.
__attribute__((format(printf, 3, 4))) static void netns_fail(netns_work_t *w, int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->what, sizeof(w->what), fmt, ap);
  va_end(ap);
  w->err = err;
}

// What `ip netns add` does before the bind: <dir> made and shared (bound on itself first when it is no mount point,
// EINVAL), <path> created empty. False with the failure recorded.
static bool netns_prepare_path(netns_work_t *w, const char *op) {
  int err;
  if (mkdir(w->dir, 0755) < 0 && (err = errno) != EEXIST) {
    netns_fail(w, err, "%s: mkdir %s", op, w->dir);
    return false;
  }
  bool bound = false;
  while (mount("", w->dir, "none", MS_SHARED | MS_REC, NULL) < 0) {
    err = errno;
    if (err != EINVAL || bound) {
      netns_fail(w, err, "%s: make %s a shared mount", op, w->dir);
      return false;
    }
    if (mount(w->dir, w->dir, "none", MS_BIND | MS_REC, NULL) < 0) {
      netns_fail(w, errno, "%s: bind %s on itself", op, w->dir);
      return false;
    }
    bound = true;
  }
  int fd = open(w->path, O_RDONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0);
  if (fd < 0) {
    netns_fail(w, errno, "%s: create %s", op, w->path);
    return false;
  }
  close(fd);
  return true;
}

// netnsMake: a new netns with its sysctls, held by an fd only (nothing mounts it: it is gone with the fd).
static void netns_make_execute(napi_env env, void *data) {
  (void)env;
  netns_work_t *w = data;
  int orig = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  if (orig < 0) {
    netns_fail(w, errno, "netnsMake: open /proc/thread-self/ns/net");
    return;
  }
  if (unshare(CLONE_NEWNET) < 0) {
    netns_fail(w, errno, "netnsMake: unshare(CLONE_NEWNET)");
    close(orig);
    return;
  }
  const char *failed = NULL;
  int err = w->settings ? sysctl_write_all(w->settings, &failed) : 0;
  if (err) netns_fail(w, err, "netnsMake: sysctl -w %s", failed);
  else if ((w->fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)) < 0)
    netns_fail(w, errno, "netnsMake: open the new netns");
  // a pool thread left in the new netns would run later work there: abort rather than go on
  if (setns(orig, CLONE_NEWNET) < 0) {
    fprintf(stderr, "vmpod_native: setns back after making a netns failed: %s; aborting\n", strerror(errno));
    abort();
  }
  close(orig);
}

// netnsBind: the netns of w->fd at <dir>/<name>, as `ip netns add` mounts a new one; a failure removes the file.
static void netns_bind_execute(napi_env env, void *data) {
  (void)env;
  netns_work_t *w = data;
  if (!netns_prepare_path(w, "netnsBind")) return;
  char src[64];
  snprintf(src, sizeof(src), "/proc/self/fd/%d", w->fd);
  if (mount(src, w->path, "none", MS_BIND, NULL) < 0) {
    int err = errno;
    unlink(w->path);
    netns_fail(w, err, "netnsBind %s: bind the netns", w->path);
  }
}

static void netns_work_free(netns_work_t *w) {
  free(w->dir);
  free(w->path);
  if (w->settings) free_strv(w->settings);
  free(w);
}

static void netns_work_complete(napi_env env, napi_status status, void *data) {
  netns_work_t *w = data;
  if (status != napi_ok) netns_fail(w, ECANCELED, "netns %s: cancelled", w->path);
  settle_promise(env, w->deferred, w->err, w->what, NULL);
  napi_delete_async_work(env, w->work);
  netns_work_free(w);
}

// A name for a file in <dir>: 1 to 255 bytes, no '/', not "." or "..".
static bool netns_name_ok(const char *name) {
  size_t n = strlen(name);
  return n > 0 && n < 256 && strchr(name, '/') == NULL && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

static void netns_make_complete(napi_env env, napi_status status, void *data) {
  netns_work_t *w = data;
  if (status != napi_ok && !w->err) netns_fail(w, ECANCELED, "netnsMake: cancelled");
  napi_value v = NULL;
  if (!w->err && napi_create_int32(env, w->fd, &v) != napi_ok) netns_fail(w, ENOMEM, "netnsMake: the result");
  if (w->err && w->fd >= 0) close(w->fd);
  settle_promise(env, w->deferred, w->err, w->what, w->err ? NULL : v);
  napi_delete_async_work(env, w->work);
  netns_work_free(w);
}

// netnsMake(sysctls?: string[]) -> Promise<fd>: a new netns on a pool thread, the sysctls ("name=value")
// written inside it, held by the fd it resolves with (close it to let it go; netnsBind mounts it under a name).
napi_value js_netnsMake(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok) return throw_type(env, "netnsMake: expected ([sysctls])");
  netns_work_t *w = calloc(1, sizeof(*w));
  if (!w) return throw_errno(env, ENOMEM, "netnsMake");
  w->fd = -1;
  napi_valuetype t = napi_undefined;
  if (argc > 0) napi_typeof(env, argv[0], &t);
  if (t != napi_undefined) {
    w->settings = get_string_array(env, argv[0], "netnsMake", "sysctls");
    const char *bad = w->settings ? sysctl_bad_setting(w->settings) : NULL;
    if (!w->settings || bad) {
      if (bad) throw_type(env, "netnsMake: setting \"%s\" is not name=value with a name of [a-z0-9_.-]", bad);
      netns_work_free(w);
      return NULL;
    }
  }
  napi_value promise = queue_promise(env, "vmpod.netnsMake", netns_make_execute, netns_make_complete, w, &w->work, &w->deferred);
  if (!promise) netns_work_free(w);
  return promise;
}

// netnsBind(fd, dir, name) -> Promise: the netns of fd (netnsMake's) at <dir>/<name>, as `ip netns add` mounts one;
// fd stays the caller's.
napi_value js_netnsBind(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  if (!get_args(env, info, 3, argv, "netnsBind")) return NULL;
  int fd;
  if (!get_fd(env, argv[0], "netnsBind", &fd)) return NULL;
  netns_work_t *w = calloc(1, sizeof(*w));
  if (!w) return throw_errno(env, ENOMEM, "netnsBind");
  w->fd = fd;
  char *name = NULL;
  w->dir = get_string(env, argv[1], "netnsBind", "dir");
  if (w->dir) name = get_string(env, argv[2], "netnsBind", "name");
  if (!w->dir || !name || w->dir[0] != '/' || !netns_name_ok(name)) {
    if (w->dir && name) throw_type(env, "netnsBind: dir must be absolute and name 1 to 255 bytes without '/', got \"%s\" and \"%s\"", w->dir, name);
    free(name);
    netns_work_free(w);
    return NULL;
  }
  size_t plen = strlen(w->dir) + 1 + strlen(name) + 1;
  w->path = malloc(plen);
  if (!w->path) {
    free(name);
    netns_work_free(w);
    return throw_errno(env, ENOMEM, "netnsBind");
  }
  snprintf(w->path, plen, "%s/%s", w->dir, name);
  free(name);
  napi_value promise = queue_promise(env, "vmpod.netnsBind", netns_bind_execute, netns_work_complete, w, &w->work, &w->deferred);
  if (!promise) netns_work_free(w);
  return promise;
}

// `ip netns del`: detach the netns mount and remove the file. The kernel frees the netns once nothing holds it
// (a process in it, an open fd such as a tap's). A path that is no mount (EINVAL) is still removed.
static void netns_del_execute(napi_env env, void *data) {
  (void)env;
  netns_work_t *w = data;
  if (umount2(w->path, MNT_DETACH) < 0 && errno != EINVAL)
    netns_fail(w, errno, "netnsDel: umount %s", w->path);
  else if (unlink(w->path) < 0)
    netns_fail(w, errno, "netnsDel: remove %s", w->path);
}

// netnsDel(path) -> Promise: on a pool thread (the unlink can wait on the filesystem's journal)
napi_value js_netnsDel(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  char *path = get_args(env, info, 1, argv, "netnsDel") ? get_string(env, argv[0], "netnsDel", "path") : NULL;
  if (!path) return NULL;
  if (path[0] != '/') {
    throw_type(env, "netnsDel: path must be absolute, got \"%s\"", path);
    free(path);
    return NULL;
  }
  netns_work_t *w = calloc(1, sizeof(*w));
  if (!w) {
    free(path);
    return throw_errno(env, ENOMEM, "netnsDel");
  }
  w->path = path;
  napi_value promise = queue_promise(env, "vmpod.netnsDel", netns_del_execute, netns_work_complete, w, &w->work, &w->deferred);
  if (!promise) netns_work_free(w);
  return promise;
}
