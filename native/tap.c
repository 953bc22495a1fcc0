// Taps: a tap opened inside a pod's netns (TUNSETIFF) by openTap, on the event loop's thread or, with offLoop, on a
// libuv pool thread.

#include "common.h"

// The tap `name` opened inside the netns at ns_path by the calling thread (the main thread or a pool thread),
// which is back in its own netns when this returns: TUNSETIFF with IFF_TAP|IFF_NO_PI and `flags`. Returns the fd
// (CLOEXEC), or -errno with `what` saying which step failed.
static int tap_open_in(const char *fn, const char *ns_path, const char *name, int flags, char *what, size_t wlen) {
  netns_guard_t g;
  int err = netns_enter_in(fn, ns_path, &g, what, wlen);
  if (err < 0) return err;
  int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    err = -errno;
    snprintf(what, wlen, "open /dev/net/tun %s in %s", name, ns_path);
  } else {
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    memcpy(ifr.ifr_name, name, strlen(name));
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI | flags;
    int r;
    do r = ioctl(fd, TUNSETIFF, &ifr);
    while (r < 0 && errno == EINTR);
    if (r < 0) {
      err = -errno;
      snprintf(what, wlen, "TUNSETIFF %s in %s", name, ns_path);
      close(fd);
    }
  }
  netns_leave(&g, ns_path);
  return err < 0 ? err : fd;
}

// (nsPath, name, opts?) of openTap: the strings malloc'd (the caller frees both either way), the TUNSETIFF flags beyond
// IFF_TAP|IFF_NO_PI, and whether to open it on a pool thread. False with a TypeError pending on bad arguments.
static bool get_tap_args(napi_env env, napi_callback_info info, char **ns_path, char **name, int *flags, bool *off_loop) {
  const char *fn = "openTap";
  napi_value argv[3];
  napi_valuetype t;
  bool vnet_hdr = false, multi_queue = false;
  *ns_path = *name = NULL;
  *off_loop = false;
  if (!get_args(env, info, 3, argv, fn)) return false;
  if (napi_typeof(env, argv[2], &t) != napi_ok) return throw_napi(env, "napi_typeof failed"), false;
  if (t == napi_object) {
    const char *keys[3] = {"vnetHdr", "multiQueue", "offLoop"};
    bool *outs[3] = {&vnet_hdr, &multi_queue, off_loop};
    for (int i = 0; i < 3; i++) {
      napi_value v;
      napi_valuetype vt;
      if (napi_get_named_property(env, argv[2], keys[i], &v) != napi_ok || napi_typeof(env, v, &vt) != napi_ok)
        return throw_napi(env, "napi_get_named_property failed"), false;
      if (vt == napi_undefined) continue;
      if (!get_bool(env, v, fn, keys[i], outs[i])) return false;
    }
  } else if (t != napi_undefined && t != napi_null) {
    return throw_type(env, "%s: opts must be an object", fn), false;
  }
  // IFF_MULTI_QUEUE must match an existing link's flags or TUNSETIFF fails with EINVAL.
  *flags = (vnet_hdr ? IFF_VNET_HDR : 0) | (multi_queue ? IFF_MULTI_QUEUE : 0);
  return get_netns_link(env, fn, argv, ns_path, name);
}

typedef struct {
  napi_async_work work;  // offLoop only
  napi_deferred deferred;
  char *ns_path;
  char *name;
  int flags;
  int fd;  // the result, or -errno
  char what[320];
} tap_open_t;

static void tap_open_free(tap_open_t *w) {
  free(w->ns_path);
  free(w->name);
  free(w);
}

static void tap_open_execute(napi_env env, void *data) {
  (void)env;
  tap_open_t *w = data;
  w->fd = tap_open_in("openTap", w->ns_path, w->name, w->flags, w->what, sizeof(w->what));
}

// Settles the promise with the fd (or its error) and frees w; status: the pool work's (napi_ok on the loop).
static void tap_open_settle(napi_env env, napi_status status, tap_open_t *w) {
  napi_value v = NULL;
  int err = w->fd < 0 ? -w->fd : 0;
  if (!err && status != napi_ok) {
    close(w->fd);
    err = ECANCELED;
    snprintf(w->what, sizeof(w->what), "openTap %s: cancelled", w->name);
  } else if (!err && napi_create_int32(env, w->fd, &v) != napi_ok) {
    close(w->fd);
    err = ENOMEM;
    snprintf(w->what, sizeof(w->what), "openTap %s: the result", w->name);
  }
  settle_promise(env, w->deferred, err, w->what, err ? NULL : v);
  tap_open_free(w);
}

static void tap_open_complete(napi_env env, napi_status status, void *data) {
  tap_open_t *w = data;
  napi_delete_async_work(env, w->work);
  tap_open_settle(env, status, w);
}

// openTap(nsPath, name, opts?) -> Promise<fd>. Without offLoop the tap is opened on this thread before the call returns
// (the promise is settled already); with it, on a pool thread: TUNSETIFF takes rtnl_lock, which CNI plugins running
// meanwhile contend for, and the event loop need not wait for it. Bad arguments throw at once either way.
napi_value js_openTap(napi_env env, napi_callback_info info) {
  tap_open_t *w = calloc(1, sizeof(*w));
  if (!w) return throw_errno(env, ENOMEM, "openTap");
  bool off_loop;
  napi_value promise = NULL;
  if (!get_tap_args(env, info, &w->ns_path, &w->name, &w->flags, &off_loop)) {
    tap_open_free(w);
    return NULL;
  }
  if (off_loop) {
    promise = queue_promise(env, "vmpod.openTap", tap_open_execute, tap_open_complete, w, &w->work, &w->deferred);
    if (!promise) tap_open_free(w);
    return promise;
  }
  if (napi_create_promise(env, &w->deferred, &promise) != napi_ok) {
    tap_open_free(w);
    return throw_napi(env, "napi_create_promise failed");
  }
  tap_open_execute(env, w);
  tap_open_settle(env, napi_ok, w);
  return promise;
}
