// Taps: a tap opened inside a pod's netns (TUNSETIFF), on the event loop (openTap) or on a pool thread
// (openTapAsync).

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

// (nsPath, name, opts?) of openTap and openTapAsync: the strings malloc'd (the caller frees both either way) and
// the TUNSETIFF flags beyond IFF_TAP|IFF_NO_PI. False with a TypeError pending on bad arguments.
static bool get_tap_args(napi_env env, napi_callback_info info, const char *fn, char **ns_path, char **name, int *flags) {
  napi_value argv[3];
  napi_valuetype t;
  bool vnet_hdr = false, multi_queue = false;
  *ns_path = *name = NULL;
  if (!get_args(env, info, 3, argv, fn)) return false;
  if (napi_typeof(env, argv[2], &t) != napi_ok) return throw_napi(env, "napi_typeof failed"), false;
  if (t == napi_object) {
    const char *keys[2] = {"vnetHdr", "multiQueue"};
    bool *outs[2] = {&vnet_hdr, &multi_queue};
    for (int i = 0; i < 2; i++) {
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

napi_value js_openTap(napi_env env, napi_callback_info info) {
  char *ns_path, *name, what[320];
  int flags;
  napi_value ret = NULL;
  if (get_tap_args(env, info, "openTap", &ns_path, &name, &flags)) {
    int fd = tap_open_in("openTap", ns_path, name, flags, what, sizeof(what));
    if (fd < 0) throw_errno(env, -fd, "%s", what);
    else if (!(ret = make_int(env, fd))) close(fd);
  }
  free(ns_path);
  free(name);
  return ret;
}

typedef struct {
  napi_async_work work;
  napi_deferred deferred;
  char *ns_path;
  char *name;
  int flags;
  int fd;  // the result, or -errno
  char what[320];
} tap_open_t;

static void tap_open_execute(napi_env env, void *data) {
  (void)env;
  tap_open_t *w = data;
  w->fd = tap_open_in("openTapAsync", w->ns_path, w->name, w->flags, w->what, sizeof(w->what));
}

static void tap_open_complete(napi_env env, napi_status status, void *data) {
  tap_open_t *w = data;
  napi_value v = NULL;
  int err = w->fd < 0 ? -w->fd : 0;
  if (!err && status != napi_ok) {
    close(w->fd);
    err = ECANCELED;
    snprintf(w->what, sizeof(w->what), "openTapAsync %s: cancelled", w->name);
  } else if (!err && napi_create_int32(env, w->fd, &v) != napi_ok) {
    close(w->fd);
    err = ENOMEM;
    snprintf(w->what, sizeof(w->what), "openTapAsync %s: the result", w->name);
  }
  settle_promise(env, w->deferred, err, w->what, err ? NULL : v);
  napi_delete_async_work(env, w->work);
  free(w->ns_path);
  free(w->name);
  free(w);
}

// openTapAsync(nsPath, name, opts?) -> Promise<fd>: openTap on a libuv pool thread (TUNSETIFF takes rtnl_lock,
// which CNI plugins running meanwhile contend for: the event loop does not wait for it).
napi_value js_openTapAsync(napi_env env, napi_callback_info info) {
  tap_open_t *w = calloc(1, sizeof(*w));
  if (!w) return throw_errno(env, ENOMEM, "openTapAsync");
  napi_value promise = NULL;
  if (get_tap_args(env, info, "openTapAsync", &w->ns_path, &w->name, &w->flags))
    promise = queue_promise(env, "vmpod.openTapAsync", tap_open_execute, tap_open_complete, w, &w->work, &w->deferred);
  if (!promise) {
    free(w->ns_path);
    free(w->name);
    free(w);
  }
  return promise;
}
