// Taps: a tap opened inside a pod's netns (TUNSETIFF) by openTap, or opened several times at once by openTapQueues
// (more queues of a multi-queue tap), on the event loop's thread or, with offLoop, on a libuv pool thread.

#include "common.h"

#include <linux/if_link.h>
#include <linux/rtnetlink.h>

// The kernel's MAX_TAP_QUEUES (drivers/net/tun.c): more opens of one multi-queue tap fail with E2BIG anyway.
#define TAP_MAX_OPENS 256

// IFLA_TUN_NUM_QUEUES of a link message whose IFLA_IFNAME is `name`: its value (0 for a link without tun data), or
// -1 when the message is another link's.
static int tap_queues_of(struct nlmsghdr *h, const char *name) {
  int queues = 0;
  bool named = false;
  int l1 = (int)IFLA_PAYLOAD(h);
  for (struct rtattr *x = IFLA_RTA((struct ifinfomsg *)NLMSG_DATA(h)); RTA_OK(x, l1); x = RTA_NEXT(x, l1)) {
    if (x->rta_type == IFLA_IFNAME)
      named = RTA_PAYLOAD(x) == strlen(name) + 1 && memcmp(RTA_DATA(x), name, strlen(name) + 1) == 0;
    int l2 = (int)RTA_PAYLOAD(x);
    for (struct rtattr *y = RTA_DATA(x); x->rta_type == IFLA_LINKINFO && RTA_OK(y, l2); y = RTA_NEXT(y, l2)) {
      int l3 = (int)RTA_PAYLOAD(y);
      for (struct rtattr *z = RTA_DATA(y); y->rta_type == IFLA_INFO_DATA && RTA_OK(z, l3); z = RTA_NEXT(z, l3))
        if (z->rta_type == IFLA_TUN_NUM_QUEUES && RTA_PAYLOAD(z) >= 4) memcpy(&queues, RTA_DATA(z), 4);
    }
  }
  return named ? queues : -1;
}

// The queues attached to the tun/tap `name` of the calling thread's netns (IFLA_TUN_NUM_QUEUES), or -errno (ENODEV:
// no such link). A dump of the netns's links (a pod netns has a handful), not a get of the one: the kernel's get of a
// link first runs the link's pending carrier change (linkwatch_sync_dev), which for a tap whose last queue went away
// (a daemon's exit, with no VM holding the tap) waits for an RCU grace period under rtnl_lock; the dump does not, and
// the open that follows turns the change into a cheap one.
static int tap_queues_attached(const char *name) {
  int s = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (s < 0) return -errno;
  struct {
    struct nlmsghdr h;
    struct ifinfomsg i;
    struct rtattr mask;
    uint32_t mask_value;
  } req;
  memset(&req, 0, sizeof(req));
  req.h.nlmsg_len = sizeof(req);
  req.h.nlmsg_type = RTM_GETLINK;
  req.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  req.i.ifi_family = AF_UNSPEC;
  req.mask.rta_type = IFLA_EXT_MASK;  // no counters: nothing here reads them
  req.mask.rta_len = RTA_LENGTH(sizeof(uint32_t));
  req.mask_value = RTEXT_FILTER_SKIP_STATS;
  static __thread char buf[32768];
  int ret = -ENODEV;
  bool done = false;
  if (send(s, &req, req.h.nlmsg_len, 0) < 0) {
    ret = -errno;
    done = true;
  }
  while (!done) {
    ssize_t n;
    do n = recv(s, buf, sizeof(buf), 0);
    while (n < 0 && errno == EINTR);
    if (n <= 0) {
      ret = n < 0 ? -errno : -EIO;
      break;
    }
    for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_type == NLMSG_DONE) {
        done = true;
        break;
      }
      if (h->nlmsg_type == NLMSG_ERROR) {
        int e = ((struct nlmsgerr *)NLMSG_DATA(h))->error;
        ret = e < 0 ? e : -EIO;
        done = true;
        break;
      }
      int q = h->nlmsg_type == RTM_NEWLINK && ret == -ENODEV ? tap_queues_of(h, name) : -1;
      if (q >= 0) ret = q;  // the dump is read to its end all the same
    }
  }
  close(s);
  return ret;
}

// The tap `name` opened `n` times inside the netns at ns_path by the calling thread (the main thread or a pool thread),
// which is back in its own netns when this returns: TUNSETIFF with IFF_TAP|IFF_NO_PI and `flags` on each (on a
// multi-queue tap each open attaches one more queue). Fills fds (CLOEXEC) and returns 0, or -errno with `what` saying
// which step failed and none of them left open. exclusive: EBUSY, without an open, when the tap has queues attached
// (a multi-queue tap would take the open as one more queue; a single-queue one answers EBUSY itself).
static int tap_open_in(const char *fn, const char *ns_path, const char *name, int flags, bool exclusive, int *fds, int n,
                       char *what, size_t wlen) {
  netns_guard_t g;
  int err = netns_enter_in(fn, ns_path, &g, what, wlen);
  if (err < 0) return err;
  int got = 0;
  int held = exclusive ? tap_queues_attached(name) : 0;
  if (held != 0) {
    err = held < 0 ? held : -EBUSY;
    if (held < 0) snprintf(what, wlen, "RTM_GETLINK (dump) %s in %s", name, ns_path);
    else snprintf(what, wlen, "tap %s in %s has %d queue%s attached", name, ns_path, held, held == 1 ? "" : "s");
  }
  while (err == 0 && got < n) {
    int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
      err = -errno;
      snprintf(what, wlen, "open /dev/net/tun %s in %s", name, ns_path);
      break;
    }
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
      break;
    }
    fds[got++] = fd;
  }
  netns_leave(&g, ns_path);
  if (err < 0)
    while (got > 0) close(fds[--got]);
  return err;
}

// (nsPath, name, opts?) of openTap, (nsPath, name, count, opts?) of openTapQueues (count non-NULL): the strings
// malloc'd (the caller frees both either way), the TUNSETIFF flags beyond IFF_TAP|IFF_NO_PI, and whether to open on a
// pool thread. False with a TypeError pending on bad arguments.
static bool get_tap_args(napi_env env, napi_callback_info info, const char *fn, char **ns_path, char **name, int *flags,
                         bool *off_loop, bool *exclusive, int64_t *count) {
  napi_value argv[4];
  napi_valuetype t;
  bool vnet_hdr = false, multi_queue = false;
  *ns_path = *name = NULL;
  *off_loop = *exclusive = false;
  size_t o = count ? 3 : 2;  // where the options are
  if (!get_args(env, info, o + 1, argv, fn)) return false;
  if (count && !get_int(env, argv[2], fn, "count", 1, TAP_MAX_OPENS, count)) return false;
  if (napi_typeof(env, argv[o], &t) != napi_ok) return throw_napi(env, "napi_typeof failed"), false;
  if (t == napi_object) {
    const char *keys[4] = {"vnetHdr", "multiQueue", "offLoop", "exclusive"};
    bool *outs[4] = {&vnet_hdr, &multi_queue, off_loop, exclusive};
    for (int i = 0; i < 4; i++) {
      napi_value v;
      napi_valuetype vt;
      if (napi_get_named_property(env, argv[o], keys[i], &v) != napi_ok || napi_typeof(env, v, &vt) != napi_ok)
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
  const char *fn;
  char *ns_path;
  char *name;
  int flags;
  bool exclusive;
  int n;       // opens: 1 (openTap) or count (openTapQueues)
  bool array;  // resolve with the array of fds (openTapQueues), else with the fd
  int err;     // 0, or -errno
  char what[320];
  int fds[];   // n of them
} tap_open_t;

static void tap_open_free(tap_open_t *w) {
  free(w->ns_path);
  free(w->name);
  free(w);
}

static void tap_open_execute(napi_env env, void *data) {
  (void)env;
  tap_open_t *w = data;
  w->err = tap_open_in(w->fn, w->ns_path, w->name, w->flags, w->exclusive, w->fds, w->n, w->what, sizeof(w->what));
}

// The fd, or the array of fds, as a JS value; NULL when it cannot be made.
static napi_value tap_open_result(napi_env env, tap_open_t *w) {
  napi_value v, arr;
  if (!w->array) return napi_create_int32(env, w->fds[0], &v) == napi_ok ? v : NULL;
  if (napi_create_array_with_length(env, (size_t)w->n, &arr) != napi_ok) return NULL;
  for (int i = 0; i < w->n; i++)
    if (napi_create_int32(env, w->fds[i], &v) != napi_ok || napi_set_element(env, arr, (uint32_t)i, v) != napi_ok) return NULL;
  return arr;
}

// Settles the promise with the fd(s) (or the error) and frees w; status: the pool work's (napi_ok on the loop).
static void tap_open_settle(napi_env env, napi_status status, tap_open_t *w) {
  napi_value v = NULL;
  int err = -w->err;
  if (!err && status != napi_ok) {
    err = ECANCELED;
    snprintf(w->what, sizeof(w->what), "%s %s: cancelled", w->fn, w->name);
  } else if (!err && !(v = tap_open_result(env, w))) {
    err = ENOMEM;
    snprintf(w->what, sizeof(w->what), "%s %s: the result", w->fn, w->name);
  }
  if (err && !w->err)
    for (int i = 0; i < w->n; i++) close(w->fds[i]);
  settle_promise(env, w->deferred, err, w->what, err ? NULL : v);
  tap_open_free(w);
}

static void tap_open_complete(napi_env env, napi_status status, void *data) {
  tap_open_t *w = data;
  napi_delete_async_work(env, w->work);
  tap_open_settle(env, status, w);
}

// openTap and openTapQueues: the arguments read, then the opens on this thread (the promise settled before the call
// returns) or, with offLoop, on a pool thread: TUNSETIFF takes rtnl_lock, which CNI plugins running meanwhile contend
// for, and the event loop need not wait for it. Bad arguments throw at once either way.
static napi_value tap_open_start(napi_env env, napi_callback_info info, const char *fn, bool queues) {
  int64_t count = 1;
  tap_open_t *w = calloc(1, sizeof(*w) + sizeof(int) * TAP_MAX_OPENS);
  if (!w) return throw_errno(env, ENOMEM, "%s", fn);
  bool off_loop;
  napi_value promise = NULL;
  if (!get_tap_args(env, info, fn, &w->ns_path, &w->name, &w->flags, &off_loop, &w->exclusive, queues ? &count : NULL)) {
    tap_open_free(w);
    return NULL;
  }
  w->fn = fn;
  w->n = (int)count;
  w->array = queues;
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

// openTap(nsPath, name, opts?) -> Promise<fd>
napi_value js_openTap(napi_env env, napi_callback_info info) {
  return tap_open_start(env, info, "openTap", false);
}

// openTapQueues(nsPath, name, count, opts?) -> Promise<fd[]>: the tap opened `count` times (1 to 256) in one visit of
// the netns: the queues a get adds to a multi-queue tap. All or none.
napi_value js_openTapQueues(napi_env env, napi_callback_info info) {
  return tap_open_start(env, info, "openTapQueues", true);
}
