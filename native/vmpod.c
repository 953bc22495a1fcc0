// vmpod_native: the only place in vmpod-node that makes raw syscalls.
//
// Every exported function is one synchronous call, except those that return a promise (work on a libuv pool
// thread) or take a callback (spawnChild, the fast get server, pollers): src/native.ts says which. Failures throw
// (or reject with) an Error whose `code` is the errno name ("EBUSY"), `errno` the positive errno number, and
// whose message names the operation and the object, e.g. "TUNSETIFF tap0 in /var/run/netns/x: EBUSY (Device or
// resource busy)". Bad JS arguments throw TypeError. Every fd the addon creates is close-on-exec. Blocking calls
// retry EINTR.
//
// The other files: common.c (errors, argument helpers, declared in common.h), fastget.c, spawn.c.
// The typed interface and the doc of every function is src/native.ts.

#include "common.h"

// ---------------------------------------------------------------------------------------------
// Unix stream sockets, daemon side

static bool fill_sockaddr_un(napi_env env, const char *fn, const char *path, struct sockaddr_un *sa) {
  memset(sa, 0, sizeof(*sa));
  sa->sun_family = AF_UNIX;
  size_t len = strlen(path);
  if (len == 0) {
    throw_type(env, "%s: path must not be empty", fn);
    return false;
  }
  // Keep a terminating NUL inside sun_path (108 bytes on Linux), like every libc user expects.
  if (len >= sizeof(sa->sun_path)) {
    throw_errno(env, ENAMETOOLONG, "%s %s: longer than %zu bytes", fn, path,
                sizeof(sa->sun_path) - 1);
    return false;
  }
  memcpy(sa->sun_path, path, len);
  return true;
}

static napi_value js_listenUnix(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  int64_t mode, backlog;
  if (!get_args(env, info, 3, argv, "listenUnix")) return NULL;
  if (!get_int(env, argv[1], "listenUnix", "mode", 0, 07777, &mode)) return NULL;
  if (!get_int(env, argv[2], "listenUnix", "backlog", 0, INT32_MAX, &backlog)) return NULL;
  char *path = get_string(env, argv[0], "listenUnix", "path");
  if (!path) return NULL;

  napi_value ret = NULL;
  struct sockaddr_un sa;
  struct stat st;
  int fd = -1;
  if (!fill_sockaddr_un(env, "listenUnix", path, &sa)) goto out;

  // A socket file left by an earlier run would make bind fail with EADDRINUSE: remove it.
  // Anything else at that path is not ours to delete.
  if (lstat(path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      throw_errno(env, EEXIST, "listenUnix %s: exists and is not a socket", path);
      goto out;
    }
    // Never unlink a live socket: connect to it first. Only ECONNREFUSED (nobody listens) or ENOENT
    // (gone meanwhile) make it stale; a full backlog (EAGAIN) or an accepted connect means a live server.
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (probe < 0) {
      throw_errno(env, errno, "socket(AF_UNIX) to probe %s", path);
      goto out;
    }
    int cr;
    do cr = connect(probe, (struct sockaddr *)&sa, sizeof(sa));
    while (cr < 0 && errno == EINTR);
    int cerr = cr < 0 ? errno : 0;
    close(probe);
    if (cerr != ECONNREFUSED && cerr != ENOENT) {
      throw_errno(env, cerr == 0 || cerr == EAGAIN || cerr == EINPROGRESS ? EADDRINUSE : cerr,
                  "listenUnix %s: another server is listening on this socket", path);
      goto out;
    }
    if (unlink(path) < 0 && errno != ENOENT) {
      throw_errno(env, errno, "unlink stale socket %s", path);
      goto out;
    }
  } else if (errno != ENOENT) {
    throw_errno(env, errno, "lstat %s", path);
    goto out;
  }

  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    throw_errno(env, errno, "socket(AF_UNIX) for %s", path);
    goto out;
  }
  if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    throw_errno(env, errno, "bind %s", path);
    goto fail;
  }
  // chmod before listen: no client can connect while the mode is still the umask default.
  if (chmod(path, (mode_t)mode) < 0) {
    throw_errno(env, errno, "chmod %s to %llo", path, (unsigned long long)mode);
    goto fail_unlink;
  }
  if (listen(fd, (int)backlog) < 0) {
    throw_errno(env, errno, "listen %s", path);
    goto fail_unlink;
  }
  ret = make_int(env, fd);
  if (!ret) goto fail_unlink;
  goto out;

fail_unlink:
  unlink(path);
fail:
  close(fd);
out:
  free(path);
  return ret;
}

static napi_value js_accept(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  int fd;
  if (!get_args(env, info, 1, argv, "accept") || !get_fd(env, argv[0], "accept", &fd)) return NULL;
  for (;;) {
    int c = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c >= 0) {
      napi_value v = make_int(env, c);
      if (!v) close(c);
      return v;
    }
    // ECONNABORTED: a queued connection went away before we took it; look at the next one.
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return make_int(env, -1);
    return throw_errno(env, errno, "accept4 fd %d", fd);
  }
}

static napi_value js_peerCred(napi_env env, napi_callback_info info) {
  napi_value argv[1], obj, v;
  int fd;
  if (!get_args(env, info, 1, argv, "peerCred") || !get_fd(env, argv[0], "peerCred", &fd))
    return NULL;
  struct ucred cred;
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0)
    return throw_errno(env, errno, "getsockopt SO_PEERCRED fd %d", fd);
  NAPI_OK(napi_create_object(env, &obj), "napi_create_object failed");
  NAPI_OK(napi_create_int64(env, cred.pid, &v), "napi_create_int64 failed");
  NAPI_OK(napi_set_named_property(env, obj, "pid", v), "napi_set_named_property failed");
  NAPI_OK(napi_create_int64(env, cred.uid, &v), "napi_create_int64 failed");
  NAPI_OK(napi_set_named_property(env, obj, "uid", v), "napi_set_named_property failed");
  NAPI_OK(napi_create_int64(env, cred.gid, &v), "napi_create_int64 failed");
  NAPI_OK(napi_set_named_property(env, obj, "gid", v), "napi_set_named_property failed");
  return obj;
}

static napi_value js_read(napi_env env, napi_callback_info info) {
  napi_value argv[2], buf;
  int fd;
  int64_t max;
  if (!get_args(env, info, 2, argv, "read") || !get_fd(env, argv[0], "read", &fd) ||
      !get_int(env, argv[1], "read", "max", 1, MAX_IO_BYTES, &max))
    return NULL;
  uint8_t *p = malloc((size_t)max);
  if (!p) return throw_errno(env, ENOMEM, "read fd %d: %lld bytes", fd, (long long)max);
  ssize_t n;
  do n = read(fd, p, (size_t)max);
  while (n < 0 && errno == EINTR);
  if (n < 0) {
    int err = errno;
    free(p);
    if (err == EAGAIN || err == EWOULDBLOCK) return make_null(env);
    return throw_errno(env, err, "read fd %d", fd);
  }
  napi_status s = napi_create_buffer_copy(env, (size_t)n, p, NULL, &buf);
  free(p);
  if (s != napi_ok) return throw_napi(env, "napi_create_buffer_copy failed");
  return buf;
}

// Waits until fd is writable or the deadline passes (deadline < 0: no limit). Returns 0 or an errno.
static int wait_writable(int fd, int64_t deadline) {
  for (;;) {
    int timeout = -1;
    if (deadline >= 0) {
      int64_t left = deadline - now_ms();
      if (left <= 0) return ETIMEDOUT;
      timeout = left > INT32_MAX ? INT32_MAX : (int)left;
    }
    struct pollfd pfd = {.fd = fd, .events = POLLOUT};
    int r = poll(&pfd, 1, timeout);
    if (r < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (r == 0) continue;  // re-checks the deadline
    // POLLERR/POLLHUP: let the next sendmsg report the real error (EPIPE, ECONNRESET).
    return 0;
  }
}

static napi_value js_sendMsg(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  int fd;
  const uint8_t *data;
  size_t len;
  int *fds = NULL;
  uint32_t nfds = 0;
  int64_t timeout_ms;
  if (!get_args(env, info, 4, argv, "sendMsg") || !get_fd(env, argv[0], "sendMsg", &fd) ||
      !get_bytes(env, argv[1], "sendMsg", "data", &data, &len) ||
      !get_int(env, argv[3], "sendMsg", "timeoutMs", INT32_MIN, INT32_MAX, &timeout_ms))
    return NULL;
  if (!get_fd_array(env, argv[2], "sendMsg", "fds", &fds, &nfds, MAX_SCM_FDS)) return NULL;

  // A negative timeout waits forever; 0 does not wait at all.
  int64_t deadline = timeout_ms < 0 ? -1 : now_ms() + timeout_ms;
  static const uint8_t filler = 0;
  // A cmsg needs at least one byte of data on a stream socket: send one 0x00 when data is empty.
  if (len == 0 && nfds > 0) {
    data = &filler;
    len = 1;
  }
  // union-aligned control buffer, as the kernel and CMSG_* macros expect
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * MAX_SCM_FDS)];
  } ctl;
  memset(&ctl, 0, sizeof(ctl));
  size_t ctl_len = nfds ? put_scm_rights(ctl.buf, fds, nfds) : 0;
  free(fds);

  size_t off = 0;
  while (off < len) {
    struct iovec iov = {.iov_base = (void *)(data + off), .iov_len = len - off};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (off == 0 && nfds) {  // the fds go with the first chunk only
      msg.msg_control = ctl.buf;
      msg.msg_controllen = ctl_len;
    }
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      int err = errno;
      if (err == EINTR) continue;
      if (err == EAGAIN || err == EWOULDBLOCK) {
        int werr = wait_writable(fd, deadline);
        if (werr == 0) continue;
        return throw_errno(env, werr, "sendmsg fd %d: %zu of %zu bytes sent, waiting for room", fd,
                           off, len);
      }
      return throw_errno(env, err, "sendmsg fd %d (%zu bytes, %u fds)", fd, len, nfds);
    }
    off += (size_t)n;
  }
  return make_int(env, (int64_t)off);
}

// One non-blocking sendmsg(MSG_DONTWAIT|MSG_NOSIGNAL) of data with SCM_RIGHTS(fds); one filler byte
// 0x00 when data is empty and fds are given. Returns the bytes written (the fds went with them), or -1
// when the socket is full and nothing was written (the caller waits for writability and tries again).
static napi_value js_trySendMsg(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  int fd;
  const uint8_t *data;
  size_t len;
  int *fds = NULL;
  uint32_t nfds = 0;
  if (!get_args(env, info, 3, argv, "trySendMsg") || !get_fd(env, argv[0], "trySendMsg", &fd) ||
      !get_bytes(env, argv[1], "trySendMsg", "data", &data, &len))
    return NULL;
  if (!get_fd_array(env, argv[2], "trySendMsg", "fds", &fds, &nfds, MAX_SCM_FDS)) return NULL;
  static const uint8_t filler = 0;
  if (len == 0 && nfds > 0) {
    data = &filler;
    len = 1;
  }
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * MAX_SCM_FDS)];
  } ctl;
  memset(&ctl, 0, sizeof(ctl));
  struct iovec iov = {.iov_base = (void *)data, .iov_len = len};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (nfds) {
    msg.msg_control = ctl.buf;
    msg.msg_controllen = put_scm_rights(ctl.buf, fds, nfds);
  }
  free(fds);
  if (len == 0) return make_int(env, 0);
  ssize_t n;
  do n = sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return make_int(env, -1);
    return throw_errno(env, errno, "sendmsg fd %d (%zu bytes, %u fds)", fd, len, nfds);
  }
  return make_int(env, (int64_t)n);
}

// An exclusive, non-blocking flock on a directory (or file), held by the returned fd (CLOEXEC) until it is
// closed or the process ends. Another holder: throws with code EWOULDBLOCK/EAGAIN.
static napi_value js_lockExclusive(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  if (!get_args(env, info, 1, argv, "lockExclusive")) return NULL;
  char *path = get_string(env, argv[0], "lockExclusive", "path");
  if (!path) return NULL;
  napi_value ret = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    throw_errno(env, errno, "open %s to lock it", path);
    goto out;
  }
  int r;
  do r = flock(fd, LOCK_EX | LOCK_NB);
  while (r < 0 && errno == EINTR);
  if (r < 0) {
    int err = errno;
    close(fd);
    throw_errno(env, err, "flock %s", path);
    goto out;
  }
  ret = make_int(env, fd);
  if (!ret) close(fd);
out:
  free(path);
  return ret;
}

// ---- pollReadable ----

typedef struct {
  uv_poll_t handle;
  napi_env env;
  napi_ref cb;       // the JS callback, strong while active
  napi_ref self;     // the returned JS object, strong while active (a GC must not stop the poll)
  napi_async_context async;
  // Holds worker/env teardown until the uv handle is closed: the addon may be unloaded right after
  // the env ends, and a close callback into unmapped code would crash the process.
  napi_async_cleanup_hook_handle cleanup;
  int fd;
  int events;        // the uv events watched now (UV_READABLE, UV_WRITABLE, UV_DISCONNECT)
  bool active;
  int refs;          // the uv handle until its close callback + stop and want until finalised
} poller_t;

// Event bits passed to the JS callback (and taken by want()).
#define POLL_JS_READABLE 1
#define POLL_JS_WRITABLE 2
#define POLL_JS_DISCONNECT 4

static void poller_unref(poller_t *p) {
  if (--p->refs == 0) free(p);
}

static void poller_closed(uv_handle_t *h) {
  poller_t *p = h->data;
  if (p->cleanup) napi_remove_async_cleanup_hook(p->cleanup);  // teardown may go on now
  p->cleanup = NULL;
  poller_unref(p);
}

static void poller_stop(poller_t *p) {
  if (!p->active) return;
  p->active = false;
  uv_poll_stop(&p->handle);
  uv_close((uv_handle_t *)&p->handle, poller_closed);
  napi_async_destroy(p->env, p->async);
  napi_delete_reference(p->env, p->cb);
  napi_delete_reference(p->env, p->self);
  p->async = NULL;
  p->cb = NULL;
  p->self = NULL;
}

// The environment is going away (process exit, worker termination): close the uv handle; the close
// callback removes the hook, which lets the teardown continue.
static void poller_cleanup_hook(napi_async_cleanup_hook_handle h, void *arg) {
  (void)h;
  poller_stop((poller_t *)arg);
}

static void poller_fn_finalize(napi_env env, void *data, void *hint) {
  (void)env;
  (void)hint;
  poller_unref((poller_t *)data);
}

static void poller_cb(uv_poll_t *h, int status, int events) {
  poller_t *p = h->data;
  if (!p->active) return;
  napi_env env = p->env;
  napi_handle_scope scope;
  if (napi_open_handle_scope(env, &scope) != napi_ok) return;
  napi_value cb, recv, arg, result, args[2];
  if (napi_get_reference_value(env, p->cb, &cb) == napi_ok &&
      napi_get_reference_value(env, p->self, &recv) == napi_ok) {
    if (status < 0) {
      char msg[256];
      napi_value jmsg, jcode;
      snprintf(msg, sizeof(msg), "poll fd %d: %s (%s)", p->fd, uv_err_name(status),
               uv_strerror(status));
      napi_create_string_utf8(env, msg, NAPI_AUTO_LENGTH, &jmsg);
      napi_create_string_utf8(env, uv_err_name(status), NAPI_AUTO_LENGTH, &jcode);
      napi_create_error(env, NULL, jmsg, &arg);
      napi_set_named_property(env, arg, "code", jcode);
      napi_value jerrno;
      napi_create_int32(env, -status, &jerrno);
      napi_set_named_property(env, arg, "errno", jerrno);
    } else {
      napi_get_null(env, &arg);
    }
    int bits = (events & UV_READABLE ? POLL_JS_READABLE : 0) | (events & UV_WRITABLE ? POLL_JS_WRITABLE : 0) |
               (events & UV_DISCONNECT ? POLL_JS_DISCONNECT : 0);
    args[0] = arg;
    napi_create_int32(env, status < 0 ? 0 : bits, &args[1]);
    napi_status s = napi_make_callback(env, p->async, recv, cb, 2, args, &result);
    if (s != napi_ok) {
      // A throwing callback becomes an uncaught exception, like any other event-loop callback.
      bool pending = false;
      napi_is_exception_pending(env, &pending);
      if (pending) {
        napi_value exc;
        if (napi_get_and_clear_last_exception(env, &exc) == napi_ok) napi_fatal_exception(env, exc);
      }
    }
  }
  napi_close_handle_scope(env, scope);
}

static napi_value js_poller_stop(napi_env env, napi_callback_info info) {
  void *data = NULL;
  size_t argc = 0;
  if (napi_get_cb_info(env, info, &argc, NULL, NULL, &data) != napi_ok)
    return throw_napi(env, "napi_get_cb_info failed");
  poller_stop((poller_t *)data);
  return make_undefined(env);
}

// want(readable, writable): change what is watched (both false: paused, not stopped). Readable includes hang-up.
static napi_value js_poller_want(napi_env env, napi_callback_info info) {
  void *data = NULL;
  size_t argc = 2;
  napi_value argv[2];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, &data) != napi_ok)
    return throw_napi(env, "napi_get_cb_info failed");
  if (argc < 2) return throw_type(env, "want: expects (readable, writable)");
  bool r, w;
  if (!get_bool(env, argv[0], "want", "readable", &r) || !get_bool(env, argv[1], "want", "writable", &w))
    return NULL;
  poller_t *p = data;
  if (!p->active) return make_undefined(env);
  int ev = (r ? UV_READABLE | UV_DISCONNECT : 0) | (w ? UV_WRITABLE : 0);
  if (ev == p->events) return make_undefined(env);
  int rc = ev == 0 ? uv_poll_stop(&p->handle) : uv_poll_start(&p->handle, ev, poller_cb);
  if (rc < 0) return throw_errno(env, -rc, "uv_poll_start fd %d", p->fd);
  p->events = ev;
  return make_undefined(env);
}

static napi_value js_pollReadable(napi_env env, napi_callback_info info) {
  napi_value argv[2], obj, stop, want, name;
  napi_valuetype t;
  int fd;
  if (!get_args(env, info, 2, argv, "pollReadable") || !get_fd(env, argv[0], "pollReadable", &fd))
    return NULL;
  if (napi_typeof(env, argv[1], &t) != napi_ok || t != napi_function)
    return throw_type(env, "pollReadable: cb must be a function");
  if (fd < 0) return throw_errno(env, EBADF, "uv_poll fd %d", fd);

  uv_loop_t *loop;
  NAPI_OK(napi_get_uv_event_loop(env, &loop), "napi_get_uv_event_loop failed");
  poller_t *p = calloc(1, sizeof(*p));
  if (!p) return throw_errno(env, ENOMEM, "pollReadable fd %d", fd);
  p->env = env;
  p->fd = fd;
  p->handle.data = p;

  if (napi_create_object(env, &obj) != napi_ok ||
      napi_create_function(env, "stop", NAPI_AUTO_LENGTH, js_poller_stop, p, &stop) != napi_ok ||
      napi_set_named_property(env, obj, "stop", stop) != napi_ok ||
      napi_create_function(env, "want", NAPI_AUTO_LENGTH, js_poller_want, p, &want) != napi_ok ||
      napi_set_named_property(env, obj, "want", want) != napi_ok ||
      napi_create_string_utf8(env, "vmpod.pollReadable", NAPI_AUTO_LENGTH, &name) != napi_ok) {
    free(p);
    return throw_napi(env, "pollReadable: creating the poller object failed");
  }
  int r = uv_poll_init(loop, &p->handle, fd);
  if (r < 0) {
    free(p);
    return throw_errno(env, -r, "uv_poll_init fd %d", fd);
  }
  // From here the uv handle owns one reference and needs uv_close to go away.
  p->refs = 1;
  p->events = UV_READABLE | UV_DISCONNECT;
  r = uv_poll_start(&p->handle, p->events, poller_cb);
  if (r < 0) {
    uv_close((uv_handle_t *)&p->handle, poller_closed);
    return throw_errno(env, -r, "uv_poll_start fd %d", fd);
  }
  if (napi_create_reference(env, argv[1], 1, &p->cb) != napi_ok ||
      napi_create_reference(env, obj, 1, &p->self) != napi_ok ||
      napi_async_init(env, obj, name, &p->async) != napi_ok) {
    if (p->cb) napi_delete_reference(env, p->cb);
    if (p->self) napi_delete_reference(env, p->self);
    uv_poll_stop(&p->handle);
    uv_close((uv_handle_t *)&p->handle, poller_closed);
    return throw_napi(env, "pollReadable: napi reference failed");
  }
  p->active = true;
  // The stop and want functions hold p as their data: p lives until both are collected too.
  p->refs = 2;
  if (napi_add_finalizer(env, stop, p, poller_fn_finalize, NULL, NULL) != napi_ok) {
    p->refs = 1;  // never finalised: the uv handle is then the only owner
    poller_stop(p);
    return throw_napi(env, "pollReadable: napi_add_finalizer failed");
  }
  p->refs = 3;
  if (napi_add_finalizer(env, want, p, poller_fn_finalize, NULL, NULL) != napi_ok) {
    p->refs = 2;
    poller_stop(p);
    return throw_napi(env, "pollReadable: napi_add_finalizer failed");
  }
  if (napi_add_async_cleanup_hook(env, poller_cleanup_hook, p, &p->cleanup) != napi_ok) {
    p->cleanup = NULL;
    poller_stop(p);
    return throw_napi(env, "pollReadable: napi_add_async_cleanup_hook failed");
  }
  return obj;
}

// exchangePaths(a, b): renameat2(RENAME_EXCHANGE), both names swap their files in one atomic step.
static napi_value js_exchangePaths(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  if (!get_args(env, info, 2, argv, "exchangePaths")) return NULL;
  char *a = get_string(env, argv[0], "exchangePaths", "a");
  if (!a) return NULL;
  char *b = get_string(env, argv[1], "exchangePaths", "b");
  napi_value ret = NULL;
  if (b) {
    if (renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE) < 0)
      throw_errno(env, errno, "renameat2 %s <-> %s", a, b);
    else
      ret = make_undefined(env);
  }
  free(a);
  free(b);
  return ret;
}

static napi_value js_close(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  int fd;
  if (!get_args(env, info, 1, argv, "close") || !get_fd(env, argv[0], "close", &fd)) return NULL;
  // Linux releases the fd even when close fails with EINTR: never retry (it could close a reused fd).
  if (close(fd) < 0 && errno != EINTR) return throw_errno(env, errno, "close fd %d", fd);
  return make_undefined(env);
}

// ---------------------------------------------------------------------------------------------
// Unix stream sockets, client side

static napi_value js_connectUnix(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  if (!get_args(env, info, 1, argv, "connectUnix")) return NULL;
  char *path = get_string(env, argv[0], "connectUnix", "path");
  if (!path) return NULL;
  napi_value ret = NULL;
  struct sockaddr_un sa;
  int fd = -1;
  if (!fill_sockaddr_un(env, "connectUnix", path, &sa)) goto out;
  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    throw_errno(env, errno, "socket(AF_UNIX) for %s", path);
    goto out;
  }
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    int err = errno;
    if (err == EINTR) {
      // An interrupted blocking connect goes on in the background: wait for it, then read its result.
      struct pollfd pfd = {.fd = fd, .events = POLLOUT};
      int r;
      do r = poll(&pfd, 1, -1);
      while (r < 0 && errno == EINTR);
      socklen_t l = sizeof(err);
      if (r < 0)
        err = errno;
      else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l) < 0)
        err = errno;
    }
    if (err != 0) {
      throw_errno(env, err, "connect %s", path);
      close(fd);
      goto out;
    }
  }
  ret = make_int(env, fd);
  if (!ret) close(fd);
out:
  free(path);
  return ret;
}

static napi_value js_writeAll(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  int fd;
  const uint8_t *data;
  size_t len;
  if (!get_args(env, info, 2, argv, "writeAll") || !get_fd(env, argv[0], "writeAll", &fd) ||
      !get_bytes(env, argv[1], "writeAll", "data", &data, &len))
    return NULL;
  size_t off = 0;
  bool sock = true;
  while (off < len) {
    ssize_t n = sock ? send(fd, data + off, len - off, MSG_NOSIGNAL) : write(fd, data + off, len - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == ENOTSOCK && sock) {  // a pipe or a file: plain write
        sock = false;
        continue;
      }
      // EAGAIN here is SO_SNDTIMEO expiring (or a nonblocking fd): an error for a blocking writer.
      return throw_errno(env, errno, "write fd %d: %zu of %zu bytes written", fd, off, len);
    }
    off += (size_t)n;
  }
  return make_undefined(env);
}

static napi_value js_recvMsg(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  int fd;
  int64_t max_data, oob_size;
  if (!get_args(env, info, 3, argv, "recvMsg") || !get_fd(env, argv[0], "recvMsg", &fd) ||
      !get_int(env, argv[1], "recvMsg", "maxData", 1, MAX_IO_BYTES, &max_data) ||
      !get_int(env, argv[2], "recvMsg", "oobSize", 0, MAX_OOB_BYTES, &oob_size))
    return NULL;

  uint8_t *buf = malloc((size_t)max_data);
  // malloc alignment satisfies struct cmsghdr
  void *ctl = oob_size ? calloc(1, (size_t)oob_size) : NULL;
  if (!buf || (oob_size && !ctl)) {
    free(buf);
    free(ctl);
    return throw_errno(env, ENOMEM, "recvmsg fd %d", fd);
  }
  struct iovec iov = {.iov_base = buf, .iov_len = (size_t)max_data};
  struct msghdr msg;
  ssize_t n;
  do {
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl;
    msg.msg_controllen = (size_t)oob_size;
    n = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    int err = errno;
    free(buf);
    free(ctl);
    return throw_errno(env, err, "recvmsg fd %d", fd);
  }

  // Collect fds from every SCM_RIGHTS message (normally exactly one).
  size_t nfds = 0, cap = 0;
  int *fds = NULL;
  bool oom = false;
  if (ctl && msg.msg_controllen > 0) {
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      const int *in = (const int *)CMSG_DATA(c);
      for (size_t i = 0; i < k; i++) {
        int f;
        memcpy(&f, in + i, sizeof(int));
        if (oom) {
          close(f);
          continue;
        }
        if (nfds == cap) {
          size_t ncap = cap ? cap * 2 : 8;
          int *nf = realloc(fds, ncap * sizeof(int));
          if (!nf) {
            oom = true;
            close(f);
            continue;
          }
          fds = nf;
          cap = ncap;
        }
        fds[nfds++] = f;
      }
    }
  }
  free(ctl);
  if (oom) {
    close_fds(fds, nfds);
    free(fds);
    free(buf);
    return throw_errno(env, ENOMEM, "recvmsg fd %d: collecting fds", fd);
  }

  napi_value obj, data, arr, v, ctrunc;
  bool ok = napi_create_object(env, &obj) == napi_ok &&
            napi_create_buffer_copy(env, (size_t)n, buf, NULL, &data) == napi_ok &&
            napi_set_named_property(env, obj, "data", data) == napi_ok &&
            napi_create_array_with_length(env, nfds, &arr) == napi_ok &&
            napi_get_boolean(env, (msg.msg_flags & MSG_CTRUNC) != 0, &ctrunc) == napi_ok &&
            napi_set_named_property(env, obj, "ctrunc", ctrunc) == napi_ok;
  for (size_t i = 0; ok && i < nfds; i++)
    ok = napi_create_int32(env, fds[i], &v) == napi_ok &&
         napi_set_element(env, arr, (uint32_t)i, v) == napi_ok;
  ok = ok && napi_set_named_property(env, obj, "fds", arr) == napi_ok;
  free(buf);
  if (!ok) {
    close_fds(fds, nfds);  // nobody would ever close them
    free(fds);
    return throw_napi(env, "recvMsg: building the result failed");
  }
  free(fds);
  return obj;
}

static napi_value js_setTimeouts(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  int fd;
  int64_t ms;
  if (!get_args(env, info, 2, argv, "setTimeouts") || !get_fd(env, argv[0], "setTimeouts", &fd) ||
      !get_int(env, argv[1], "setTimeouts", "ms", 0, INT32_MAX, &ms))
    return NULL;
  struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};
  if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0)
    return throw_errno(env, errno, "setsockopt SO_RCVTIMEO fd %d", fd);
  if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0)
    return throw_errno(env, errno, "setsockopt SO_SNDTIMEO fd %d", fd);
  return make_undefined(env);
}

// ---------------------------------------------------------------------------------------------
// fds and processes

static int set_cloexec(int fd, bool on) {
  int fl = fcntl(fd, F_GETFD);
  if (fl < 0) return -1;
  int nfl = on ? (fl | FD_CLOEXEC) : (fl & ~FD_CLOEXEC);
  if (nfl != fl && fcntl(fd, F_SETFD, nfl) < 0) return -1;
  return 0;
}

static napi_value js_setInheritable(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  int fd;
  bool inheritable;
  if (!get_args(env, info, 2, argv, "setInheritable") ||
      !get_fd(env, argv[0], "setInheritable", &fd) ||
      !get_bool(env, argv[1], "setInheritable", "inheritable", &inheritable))
    return NULL;
  if (set_cloexec(fd, !inheritable) < 0)
    return throw_errno(env, errno, "fcntl F_SETFD fd %d", fd);
  return make_undefined(env);
}

static napi_value js_dupCloexec(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  int fd;
  int64_t min_fd;
  if (!get_args(env, info, 2, argv, "dupCloexec") || !get_fd(env, argv[0], "dupCloexec", &fd) ||
      !get_int(env, argv[1], "dupCloexec", "minFd", 0, INT32_MAX, &min_fd))
    return NULL;
  int d = fcntl(fd, F_DUPFD_CLOEXEC, (int)min_fd);
  if (d < 0) return throw_errno(env, errno, "fcntl F_DUPFD_CLOEXEC fd %d (min %lld)", fd, (long long)min_fd);
  napi_value v = make_int(env, d);
  if (!v) close(d);
  return v;
}

// The open fds >= 3 without FD_CLOEXEC, ascending: what a process inherited to pass on (vmwrapper). One readdir of
// /proc/self/fd and one fcntl per fd, where reading /proc/self/fdinfo/N costs an open, two reads and a close each.
static napi_value js_inheritableFds(napi_env env, napi_callback_info info) {
  (void)info;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return throw_errno(env, errno, "opendir /proc/self/fd");
  int dfd = dirfd(d), fds[1024], n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char *end;
    long fd = strtol(e->d_name, &end, 10);
    if (*end || end == e->d_name || fd < 3 || fd == dfd) continue;
    int flags = fcntl((int)fd, F_GETFD);
    if (flags < 0 || (flags & FD_CLOEXEC)) continue;
    if (n == (int)(sizeof fds / sizeof fds[0])) {
      closedir(d);
      return throw_errno(env, EMFILE, "more than %d inheritable fds", n);
    }
    fds[n++] = (int)fd;
  }
  closedir(d);
  for (int i = 1; i < n; i++)  // insertion sort: a handful of fds
    for (int j = i; j > 0 && fds[j - 1] > fds[j]; j--) {
      int t = fds[j];
      fds[j] = fds[j - 1];
      fds[j - 1] = t;
    }
  napi_value arr;
  if (napi_create_array_with_length(env, (size_t)n, &arr) != napi_ok) return NULL;
  for (int i = 0; i < n; i++) {
    napi_value v = make_int(env, fds[i]);
    if (!v || napi_set_element(env, arr, (uint32_t)i, v) != napi_ok) return NULL;
  }
  return arr;
}

// Marks every fd >= 3 close-on-exec. close_range (Linux 5.11) does it in one call; older kernels
// get a walk of /proc/self/fd.
static int cloexec_from_3(void) {
  if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) == 0) return 0;
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int dfd = dirfd(d);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    char *end;
    long fd = strtol(e->d_name, &end, 10);
    if (*end || end == e->d_name || fd < 3 || fd == dfd) continue;
    set_cloexec((int)fd, true);  // EBADF: closed meanwhile, nothing to do
  }
  closedir(d);
  return 0;
}

static napi_value js_execve(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  if (!get_args(env, info, 4, argv, "execve")) return NULL;
  char *path = NULL, **av = NULL, **ev = NULL;
  int *keep = NULL;
  uint32_t nkeep = 0;
  path = get_string(env, argv[0], "execve", "path");
  if (!path) return NULL;
  av = get_string_array(env, argv[1], "execve", "argv");
  if (!av) goto out;
  ev = get_string_array(env, argv[2], "execve", "env");
  if (!ev) goto out;
  if (!get_fd_array(env, argv[3], "execve", "keepFds", &keep, &nkeep, 65536)) goto out;

  // Check every fd to keep before touching any process state.
  int *keep_old = nkeep ? calloc(nkeep, sizeof(int)) : NULL;
  if (nkeep && !keep_old) {
    throw_errno(env, ENOMEM, "execve %s", path);
    goto out;
  }
  for (uint32_t i = 0; i < nkeep; i++) {
    keep_old[i] = fcntl(keep[i], F_GETFD);
    if (keep_old[i] < 0) {
      throw_errno(env, errno, "execve %s: keepFds fd %d", path, keep[i]);
      free(keep_old);
      goto out;
    }
  }

  // Node marks 0..2 close-on-exec at start-up and libuv may leave them O_NONBLOCK: the new program
  // needs plain blocking stdio.
  int std_fl[3], std_fd[3];
  for (int i = 0; i < 3; i++) {
    std_fl[i] = fcntl(i, F_GETFL);
    std_fd[i] = fcntl(i, F_GETFD);
    if (std_fl[i] >= 0 && (std_fl[i] & O_NONBLOCK)) fcntl(i, F_SETFL, std_fl[i] & ~O_NONBLOCK);
    if (std_fd[i] >= 0 && (std_fd[i] & FD_CLOEXEC)) fcntl(i, F_SETFD, std_fd[i] & ~FD_CLOEXEC);
  }
  // Everything else Node has open (epoll, eventfds, sockets, files) must not leak into the new program.
  int cerr = cloexec_from_3() < 0 ? errno : 0;
  for (uint32_t i = 0; !cerr && i < nkeep; i++)
    if (keep[i] >= 3 && set_cloexec(keep[i], false) < 0) cerr = errno;

  // Node ignores SIGPIPE and SIGXFSZ; ignored dispositions and the mask survive execve.
  struct sigaction dfl, old_pipe, old_xfsz;
  sigset_t empty, old_mask;
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigemptyset(&empty);
  int eerr = cerr;
  if (!cerr) {
    sigaction(SIGPIPE, &dfl, &old_pipe);
    sigaction(SIGXFSZ, &dfl, &old_xfsz);
    pthread_sigmask(SIG_SETMASK, &empty, &old_mask);
    execve(path, av, ev);
    eerr = errno;
    // Still here: put back what Node relies on (a default SIGPIPE would kill it on the next EPIPE).
    pthread_sigmask(SIG_SETMASK, &old_mask, NULL);
    sigaction(SIGPIPE, &old_pipe, NULL);
    sigaction(SIGXFSZ, &old_xfsz, NULL);
  }
  for (int i = 0; i < 3; i++) {
    if (std_fl[i] >= 0) fcntl(i, F_SETFL, std_fl[i]);
    if (std_fd[i] >= 0) fcntl(i, F_SETFD, std_fd[i]);
  }
  // Fds to keep go back to their old flags; other fds stay close-on-exec (harmless: libuv spawns
  // with explicit stdio and every fd it creates is close-on-exec anyway).
  for (uint32_t i = 0; i < nkeep; i++)
    if (keep[i] >= 3) fcntl(keep[i], F_SETFD, keep_old[i]);
  free(keep_old);
  if (cerr)
    throw_errno(env, cerr, "execve %s: preparing fds", path);
  else
    throw_errno(env, eerr, "execve %s", path);

out:
  free(path);
  free_strv(av);
  free_strv(ev);
  free(keep);
  return NULL;
}

// ---------------------------------------------------------------------------------------------
// netns-bound operations
//
// setns(CLONE_NEWNET) moves only the calling thread (Node's main thread). Each operation enters the
// target netns, makes its object and leaves again in the same synchronous call, so no JS ever runs in
// a foreign netns. The object keeps the netns it was created in (a tap: the netns current when
// /dev/net/tun was opened; a socket: the netns current at socket()).

typedef struct {
  int orig;    // this thread's netns before entering
  int target;  // the netns at nsPath
} netns_guard_t;

// Enters the netns at ns_path (the calling thread only: the main thread or a pool thread). 0, or -errno with `what`
// naming the step that failed and nothing left open.
static int netns_enter_in(const char *fn, const char *ns_path, netns_guard_t *g, char *what, size_t wlen) {
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
static bool netns_enter(napi_env env, const char *fn, const char *ns_path, netns_guard_t *g) {
  char what[320];
  int r = netns_enter_in(fn, ns_path, g, what, sizeof(what));
  if (r < 0) throw_errno(env, -r, "%s", what);
  return r == 0;
}

// Returns to the original netns. Failing that, the thread would run everything that follows (sockets, child
// processes, a pool thread's later work) in a foreign netns: abort instead.
static void netns_leave(netns_guard_t *g, const char *ns_path) {
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
static bool get_netns_link(napi_env env, const char *fn, napi_value *argv, char **ns_path, char **name) {
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

static napi_value js_openTap(napi_env env, napi_callback_info info) {
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

static void settle_promise(napi_env env, napi_deferred deferred, int err, const char *what, napi_value ok);
static napi_value queue_promise(napi_env env, const char *name, napi_async_execute_callback execute,
                                napi_async_complete_callback done, void *data, napi_async_work *work, napi_deferred *deferred);

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
static napi_value js_openTapAsync(napi_env env, napi_callback_info info) {
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

// The first setting that is not name=value with a name of [a-z0-9_.-] (no leading '.', no ".."), or NULL.
static const char *sysctl_bad_setting(char **settings) {
  for (char **p = settings; *p; p++) {
    char *eq = strchr(*p, '=');
    size_t nlen = eq ? (size_t)(eq - *p) : 0;
    bool ok = eq && nlen > 0 && nlen < 200 && (*p)[0] != '.' && strstr(*p, "..") == NULL;
    for (size_t i = 0; ok && i < nlen; i++) {
      char c = (*p)[i];
      ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.' || c == '-';
    }
    if (!ok) return *p;
  }
  return NULL;
}

// Writes each checked setting to /proc/sys in the calling thread's netns (/proc/sys/net shows the netns of the thread
// that opens the file); stops at the first failure: its errno, with *failed the setting. 0 when all were written.
static int sysctl_write_all(char **settings, const char **failed) {
  for (char **p = settings; *p; p++) {
    char path[256] = "/proc/sys/";
    char *eq = strchr(*p, '=');
    size_t nlen = (size_t)(eq - *p);
    memcpy(path + 10, *p, nlen);
    path[10 + nlen] = '\0';
    for (char *c = path + 10; *c; c++)
      if (*c == '.') *c = '/';
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      *failed = *p;
      return errno;
    }
    size_t vlen = strlen(eq + 1);
    ssize_t w;
    do w = write(fd, eq + 1, vlen);
    while (w < 0 && errno == EINTR);
    int err = w < 0 ? errno : (size_t)w != vlen ? EIO : 0;
    close(fd);
    if (err) {
      *failed = *p;
      return err;
    }
  }
  return 0;
}

// sysctlInNetns(nsPath, ["net.ipv4.conf.all.rp_filter=0", ...]): writes each setting to /proc/sys inside the
// netns. /proc/sys/net shows the netns of the thread that opens the file, so the files are opened inside;
// the netns is left before returning, also on an error. Names are checked before anything is entered.
static napi_value js_sysctlInNetns(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  if (!get_args(env, info, 2, argv, "sysctlInNetns")) return NULL;
  char *ns_path = get_string(env, argv[0], "sysctlInNetns", "nsPath");
  if (!ns_path) return NULL;
  char **settings = get_string_array(env, argv[1], "sysctlInNetns", "settings");
  napi_value ret = NULL;
  if (!settings) goto out;
  const char *bad = sysctl_bad_setting(settings);
  if (bad) {
    throw_type(env, "sysctlInNetns: setting \"%s\" is not name=value with a name of [a-z0-9_.-]", bad);
    goto out;
  }
  netns_guard_t g;
  if (!netns_enter(env, "sysctlInNetns", ns_path, &g)) goto out;
  const char *failed = NULL;
  int err = sysctl_write_all(settings, &failed);
  netns_leave(&g, ns_path);
  if (err) {
    throw_errno(env, err, "sysctl %s in %s", failed, ns_path);
    goto out;
  }
  napi_get_undefined(env, &ret);
out:
  free(ns_path);
  if (settings) free_strv(settings);
  return ret;
}

// What both socket makers share: nsPath and ifname (a link name) from argv[0..1], then socket(domain, type)
// made inside the netns at nsPath, and with want_index the ifindex of ifname there (an ifindex is per netns).
// Returns the fd, or -1 with an exception pending. The caller frees a->ns_path and a->ifname either way.
typedef struct {
  char *ns_path;
  char *ifname;
  unsigned int ifindex;
} netns_socket_t;

static int socket_in_netns(napi_env env, const char *fn, napi_value *argv, int domain, int type, bool want_index,
                           netns_socket_t *a) {
  if (!get_netns_link(env, fn, argv, &a->ns_path, &a->ifname)) return -1;
  netns_guard_t g;
  if (!netns_enter(env, fn, a->ns_path, &g)) return -1;
  // The socket belongs to the netns current at socket(); options and bind act in that netns from anywhere, so
  // only socket() (and the ifindex lookup) runs inside.
  a->ifindex = want_index ? if_nametoindex(a->ifname) : 0;
  int err = want_index && a->ifindex == 0 ? errno : 0;
  int fd = err ? -1 : socket(domain, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (!err && fd < 0) err = errno;
  netns_leave(&g, a->ns_path);
  if (want_index && a->ifindex == 0) throw_errno(env, err, "if_nametoindex %s in %s", a->ifname, a->ns_path);
  else if (fd < 0) throw_errno(env, err, "socket(%s) in %s", domain == AF_PACKET ? "AF_PACKET, SOCK_RAW" : "AF_INET, SOCK_DGRAM", a->ns_path);
  return fd;
}

// The end of both socket makers: the fd as a JS number when `ok`, else closed (its exception is pending).
static napi_value socket_made(napi_env env, int fd, bool ok, netns_socket_t *a) {
  napi_value ret = ok ? make_int(env, fd) : NULL;
  if (!ret && fd >= 0) close(fd);
  free(a->ns_path);
  free(a->ifname);
  return ret;
}

static napi_value js_udpSocketInNetns(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  int64_t port;
  if (!get_args(env, info, 3, argv, "udpSocketInNetns") ||
      !get_int(env, argv[2], "udpSocketInNetns", "port", 0, 65535, &port))
    return NULL;
  netns_socket_t a = {0};
  int fd = socket_in_netns(env, "udpSocketInNetns", argv, AF_INET, SOCK_DGRAM, false, &a);
  if (fd < 0) return socket_made(env, fd, false, &a);
  int one = 1;
  const char *what = NULL;
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0)
    what = "setsockopt SO_REUSEADDR";
  else if (setsockopt(fd, SOL_SOCKET, SO_BROADCAST, &one, sizeof(one)) < 0)
    what = "setsockopt SO_BROADCAST";
  else if (setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof(one)) < 0)
    what = "setsockopt IP_PKTINFO";
  else if (setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, a.ifname, (socklen_t)strlen(a.ifname) + 1) < 0)
    what = "setsockopt SO_BINDTODEVICE";
  if (what) {
    throw_errno(env, errno, "%s %s in %s", what, a.ifname, a.ns_path);
    return socket_made(env, fd, false, &a);
  }
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  bool ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
  if (!ok) throw_errno(env, errno, "bind 0.0.0.0:%lld on %s in %s", (long long)port, a.ifname, a.ns_path);
  return socket_made(env, fd, ok, &a);
}

// An AF_PACKET socket for IPv6 frames (ETH_P_IPV6) bound to one link inside the netns at nsPath: the RA and
// DHCPv6 servers read the frames the VM sends into its tap and write theirs straight back into the tap, so a
// reply can reach no other MAC and needs no route or neighbour entry in the pod netns. PACKET_IGNORE_OUTGOING:
// only frames received on the link (from the VM), not the bridge's own transmissions towards it.
// Bound with ETH_P_ALL, not ETH_P_IPV6: the tap is a bridge port, and the bridge's rx_handler consumes every frame
// before protocol-specific handlers run, so a socket bound to ETH_P_IPV6 on a port receives nothing; ETH_P_ALL
// sockets see the frame first. The BPF filter keeps everything but the wanted IPv6 frames out.
// filter: a classic BPF program (struct sock_filter[], 8 bytes each) attached before the socket is bound, so no
// frame the program refuses is ever queued (the socket is made with protocol 0 and receives nothing until bind).
static napi_value js_packetSocketInNetns(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  const uint8_t *prog = NULL;
  size_t prog_len = 0;
  if (!get_args(env, info, 3, argv, "packetSocketInNetns") ||
      !get_bytes(env, argv[2], "packetSocketInNetns", "filter", &prog, &prog_len))
    return NULL;
  if (prog_len == 0 || prog_len % sizeof(struct sock_filter) != 0 || prog_len / sizeof(struct sock_filter) > BPF_MAXINSNS)
    return throw_type(env, "packetSocketInNetns: filter must be 1 to %d BPF instructions of %zu bytes, got %zu bytes",
                      BPF_MAXINSNS, sizeof(struct sock_filter), prog_len);
  netns_socket_t a = {0};
  int fd = socket_in_netns(env, "packetSocketInNetns", argv, AF_PACKET, SOCK_RAW, true, &a);
  if (fd < 0) return socket_made(env, fd, false, &a);
  int one = 1;
  struct sock_fprog fprog = {.len = (unsigned short)(prog_len / sizeof(struct sock_filter)), .filter = (struct sock_filter *)prog};
  if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &fprog, sizeof(fprog)) < 0) {
    throw_errno(env, errno, "setsockopt SO_ATTACH_FILTER (%u instructions) on %s in %s", fprog.len, a.ifname, a.ns_path);
    return socket_made(env, fd, false, &a);
  }
  if (setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof(one)) < 0) {
    throw_errno(env, errno, "setsockopt PACKET_IGNORE_OUTGOING %s in %s", a.ifname, a.ns_path);
    return socket_made(env, fd, false, &a);
  }
  struct sockaddr_ll sll;
  memset(&sll, 0, sizeof(sll));
  sll.sll_family = AF_PACKET;
  sll.sll_protocol = htons(ETH_P_ALL);
  sll.sll_ifindex = (int)a.ifindex;
  bool ok = bind(fd, (struct sockaddr *)&sll, sizeof(sll)) == 0;
  if (!ok) throw_errno(env, errno, "bind AF_PACKET to %s in %s", a.ifname, a.ns_path);
  return socket_made(env, fd, ok, &a);
}

static napi_value js_recvFrom(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  int fd;
  int64_t max;
  if (!get_args(env, info, 2, argv, "recvFrom") || !get_fd(env, argv[0], "recvFrom", &fd) ||
      !get_int(env, argv[1], "recvFrom", "max", 1, MAX_IO_BYTES, &max))
    return NULL;
  uint8_t *buf = malloc((size_t)max);
  if (!buf) return throw_errno(env, ENOMEM, "recvmsg fd %d", fd);
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(struct in_pktinfo)) + 256];
  } ctl;
  struct sockaddr_in from;
  struct iovec iov = {.iov_base = buf, .iov_len = (size_t)max};
  struct msghdr msg;
  ssize_t n;
  do {
    memset(&msg, 0, sizeof(msg));
    memset(&from, 0, sizeof(from));
    msg.msg_name = &from;
    msg.msg_namelen = sizeof(from);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof(ctl.buf);
    n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    int err = errno;
    free(buf);
    if (err == EAGAIN || err == EWOULDBLOCK) return make_null(env);
    return throw_errno(env, err, "recvmsg fd %d", fd);
  }
  int ifindex = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
      struct in_pktinfo pi;
      memcpy(&pi, CMSG_DATA(c), sizeof(pi));
      ifindex = pi.ipi_ifindex;
    } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      // not possible on AF_INET, but never leak an fd
      close_fds((const int *)CMSG_DATA(c), (c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    }
  }
  char addr[INET_ADDRSTRLEN] = "";
  if (from.sin_family == AF_INET) inet_ntop(AF_INET, &from.sin_addr, addr, sizeof(addr));

  napi_value obj, data, v;
  bool ok = napi_create_object(env, &obj) == napi_ok &&
            napi_create_buffer_copy(env, (size_t)n, buf, NULL, &data) == napi_ok &&
            napi_set_named_property(env, obj, "data", data) == napi_ok &&
            napi_create_string_utf8(env, addr, NAPI_AUTO_LENGTH, &v) == napi_ok &&
            napi_set_named_property(env, obj, "address", v) == napi_ok &&
            napi_create_int32(env, ntohs(from.sin_port), &v) == napi_ok &&
            napi_set_named_property(env, obj, "port", v) == napi_ok &&
            napi_create_int32(env, ifindex, &v) == napi_ok &&
            napi_set_named_property(env, obj, "ifindex", v) == napi_ok;
  free(buf);
  if (!ok) return throw_napi(env, "recvFrom: building the result failed");
  return obj;
}

static napi_value js_sendTo(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  int fd;
  const uint8_t *data;
  size_t len;
  int64_t port;
  if (!get_args(env, info, 4, argv, "sendTo") || !get_fd(env, argv[0], "sendTo", &fd) ||
      !get_bytes(env, argv[1], "sendTo", "data", &data, &len) ||
      !get_int(env, argv[3], "sendTo", "port", 0, 65535, &port))
    return NULL;
  char *address = get_string(env, argv[2], "sendTo", "address");
  if (!address) return NULL;
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, address, &sa.sin_addr) != 1) {
    throw_type(env, "sendTo: address must be a dotted-quad IPv4 address, got '%s'", address);
    free(address);
    return NULL;
  }
  ssize_t n;
  do n = sendto(fd, data, len, MSG_NOSIGNAL | MSG_DONTWAIT, (struct sockaddr *)&sa, sizeof(sa));
  while (n < 0 && errno == EINTR);
  if (n < 0) {
    throw_errno(env, errno, "sendto fd %d %s:%lld", fd, address, (long long)port);
    free(address);
    return NULL;
  }
  free(address);
  return make_int(env, n);
}

// ---------------------------------------------------------------------------------------------
// sd_notify: one datagram to $NOTIFY_SOCKET (a path, or "@name" for the abstract namespace), as
// systemd's sd_notify() sends it. Blocking sendto on a fresh SOCK_DGRAM socket, closed at once.

static napi_value js_notifyDatagram(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  const uint8_t *data;
  size_t len;
  if (!get_args(env, info, 2, argv, "notifyDatagram") ||
      !get_bytes(env, argv[1], "notifyDatagram", "data", &data, &len))
    return NULL;
  char *path = get_string(env, argv[0], "notifyDatagram", "path");
  if (!path) return NULL;
  napi_value ret = NULL;
  struct sockaddr_un sa;
  socklen_t salen;
  size_t plen = strlen(path);
  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  if (plen < 2 || (path[0] != '/' && path[0] != '@') || plen >= sizeof(sa.sun_path)) {
    throw_type(env, "notifyDatagram: %s is not an absolute path or @abstract name shorter than %zu bytes", path,
               sizeof(sa.sun_path));
    free(path);
    return NULL;
  }
  memcpy(sa.sun_path, path, plen);
  if (path[0] == '@') {
    sa.sun_path[0] = '\0';  // abstract: no terminating NUL, the length says where the name ends
    salen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + plen);
  } else {
    salen = (socklen_t)sizeof(sa);
  }
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    throw_errno(env, errno, "socket(AF_UNIX, SOCK_DGRAM) for %s", path);
    free(path);
    return NULL;
  }
  ssize_t n;
  do n = sendto(fd, data, len, MSG_NOSIGNAL, (struct sockaddr *)&sa, salen);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    throw_errno(env, errno, "sendto %s", path);
  else
    ret = make_int(env, n);
  close(fd);
  free(path);
  return ret;
}

// ---------------------------------------------------------------------------------------------
// named netns, as iproute2's `ip netns add` / `ip netns del` make them (the same files, so `ip -n <name>`, CNI
// plugins and `ip netns list` see them): <dir> is a shared mount point (bound on itself once, so the netns
// mounts below it propagate to other mount namespaces), <dir>/<name> an empty file with the netns bind-mounted
// on it. netnsAdd runs on a libuv pool thread: unshare(CLONE_NEWNET) moves only that thread, which binds its new
// netns and goes back to its own before it runs anything else.

// Settles a pool-thread work's promise: rejected with errno_error(err, what) when err is set, else resolved with ok
// (undefined when NULL).
static void settle_promise(napi_env env, napi_deferred deferred, int err, const char *what, napi_value ok) {
  napi_value v = ok;
  if (err) {
    v = errno_error(env, err, what);
    if (!v) napi_create_string_utf8(env, what, NAPI_AUTO_LENGTH, &v);
    napi_reject_deferred(env, deferred, v);
    return;
  }
  if (!v) napi_get_undefined(env, &v);
  napi_resolve_deferred(env, deferred, v);
}

// A promise settled by `done` once `execute` ran on a pool thread; NULL with an exception pending on failure.
static napi_value queue_promise(napi_env env, const char *name, napi_async_execute_callback execute,
                                napi_async_complete_callback done, void *data, napi_async_work *work, napi_deferred *deferred) {
  napi_value promise = NULL, name_v;
  if (napi_create_promise(env, deferred, &promise) != napi_ok ||
      napi_create_string_utf8(env, name, NAPI_AUTO_LENGTH, &name_v) != napi_ok ||
      napi_create_async_work(env, NULL, name_v, execute, done, data, work) != napi_ok)
    return throw_napi(env, "napi async work");
  if (napi_queue_async_work(env, *work) != napi_ok) {
    napi_delete_async_work(env, *work);
    return throw_napi(env, "napi_queue_async_work");
  }
  return promise;
}

typedef struct {
  napi_async_work work;
  napi_deferred deferred;
  char *dir;
  char *path;
  char **settings;  // netnsAdd, netnsMake: sysctls written inside the new netns before it is left (NULL: none)
  int fd;           // netnsMake: the new netns (its result); netnsBind: the netns to bind
  int err;
  char what[320];
} netns_add_t;

// Records the failure of `what` (printf format) with err, which the caller took from errno first.
__attribute__((format(printf, 3, 4))) static void netns_add_fail(netns_add_t *w, int err, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->what, sizeof(w->what), fmt, ap);
  va_end(ap);
  w->err = err;
}

// What `ip netns add` does before the bind: <dir> made and shared (bound on itself first when it is no mount point,
// EINVAL), <path> created empty. False with the failure recorded.
static bool netns_prepare_path(netns_add_t *w, const char *op) {
  int err;
  if (mkdir(w->dir, 0755) < 0 && (err = errno) != EEXIST) {
    netns_add_fail(w, err, "%s: mkdir %s", op, w->dir);
    return false;
  }
  bool bound = false;
  while (mount("", w->dir, "none", MS_SHARED | MS_REC, NULL) < 0) {
    err = errno;
    if (err != EINVAL || bound) {
      netns_add_fail(w, err, "%s: make %s a shared mount", op, w->dir);
      return false;
    }
    if (mount(w->dir, w->dir, "none", MS_BIND | MS_REC, NULL) < 0) {
      netns_add_fail(w, errno, "%s: bind %s on itself", op, w->dir);
      return false;
    }
    bound = true;
  }
  int fd = open(w->path, O_RDONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0);
  if (fd < 0) {
    netns_add_fail(w, errno, "%s: create %s", op, w->path);
    return false;
  }
  close(fd);
  return true;
}

static void netns_add_execute(napi_env env, void *data) {
  (void)env;
  netns_add_t *w = data;
  int err;
  if (!netns_prepare_path(w, "netnsAdd")) return;
  const char *step = NULL;
  err = 0;
  int orig = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  if (orig < 0) {
    err = errno, step = "open /proc/thread-self/ns/net";
  } else if (unshare(CLONE_NEWNET) < 0) {
    err = errno, step = "unshare(CLONE_NEWNET)";
    close(orig);
  } else {
    const char *failed = NULL;
    if (mount("/proc/thread-self/ns/net", w->path, "none", MS_BIND, NULL) < 0) {
      err = errno, step = "bind the new netns";
    } else if (w->settings && (err = sysctl_write_all(w->settings, &failed)) != 0) {
      // made, but not as asked: gone again, as if it had never been
      snprintf(w->what, sizeof(w->what), "sysctl -w %s", failed);
      step = w->what;
      umount2(w->path, MNT_DETACH);
    }
    // a pool thread left in the pod's netns would run later work there: abort rather than go on
    if (setns(orig, CLONE_NEWNET) < 0) {
      fprintf(stderr, "vmpod_native: setns back after creating %s failed: %s; aborting\n", w->path, strerror(errno));
      abort();
    }
    close(orig);
  }
  if (err) {
    unlink(w->path);
    char what[sizeof(w->what)];
    snprintf(what, sizeof(what), "%s", step);
    netns_add_fail(w, err, "netnsAdd %s: %s", w->path, what);
  }
}

// netnsMake: a new netns with its sysctls, held by an fd only (nothing mounts it: it is gone with the fd).
static void netns_make_execute(napi_env env, void *data) {
  (void)env;
  netns_add_t *w = data;
  int orig = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  if (orig < 0) {
    netns_add_fail(w, errno, "netnsMake: open /proc/thread-self/ns/net");
    return;
  }
  if (unshare(CLONE_NEWNET) < 0) {
    netns_add_fail(w, errno, "netnsMake: unshare(CLONE_NEWNET)");
    close(orig);
    return;
  }
  const char *failed = NULL;
  int err = w->settings ? sysctl_write_all(w->settings, &failed) : 0;
  if (err) netns_add_fail(w, err, "netnsMake: sysctl -w %s", failed);
  else if ((w->fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC)) < 0)
    netns_add_fail(w, errno, "netnsMake: open the new netns");
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
  netns_add_t *w = data;
  if (!netns_prepare_path(w, "netnsBind")) return;
  char src[64];
  snprintf(src, sizeof(src), "/proc/self/fd/%d", w->fd);
  if (mount(src, w->path, "none", MS_BIND, NULL) < 0) {
    int err = errno;
    unlink(w->path);
    netns_add_fail(w, err, "netnsBind %s: bind the netns", w->path);
  }
}

static void netns_add_free(netns_add_t *w) {
  free(w->dir);
  free(w->path);
  if (w->settings) free_strv(w->settings);
  free(w);
}

static void netns_add_complete(napi_env env, napi_status status, void *data) {
  netns_add_t *w = data;
  if (status != napi_ok) netns_add_fail(w, ECANCELED, "netns %s: cancelled", w->path);
  settle_promise(env, w->deferred, w->err, w->what, NULL);
  napi_delete_async_work(env, w->work);
  netns_add_free(w);
}

// A name for a file in <dir>: 1 to 255 bytes, no '/', not "." or "..".
static bool netns_name_ok(const char *name) {
  size_t n = strlen(name);
  return n > 0 && n < 256 && strchr(name, '/') == NULL && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

// netnsAdd(dir, name, sysctls?: string[]): the named netns, with the sysctls (as sysctlInNetns takes them) written
// inside it by the thread that made it; a failure removes it again.
static napi_value js_netnsAdd(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok || argc < 2)
    return throw_type(env, "netnsAdd: expected (dir, name[, sysctls])");
  netns_add_t *w = calloc(1, sizeof(*w));
  if (!w) return throw_errno(env, ENOMEM, "netnsAdd");
  napi_value promise = NULL;
  char *name = NULL;
  w->dir = get_string(env, argv[0], "netnsAdd", "dir");
  if (!w->dir) goto fail;
  name = get_string(env, argv[1], "netnsAdd", "name");
  if (!name) goto fail;
  if (w->dir[0] != '/' || !netns_name_ok(name)) {
    throw_type(env, "netnsAdd: dir must be absolute and name 1 to 255 bytes without '/', got \"%s\" and \"%s\"", w->dir, name);
    goto fail;
  }
  size_t plen = strlen(w->dir) + 1 + strlen(name) + 1;
  w->path = malloc(plen);
  if (!w->path) {
    throw_errno(env, ENOMEM, "netnsAdd");
    goto fail;
  }
  snprintf(w->path, plen, "%s/%s", w->dir, name);
  napi_valuetype t = napi_undefined;
  if (argc > 2) napi_typeof(env, argv[2], &t);
  if (t != napi_undefined) {
    w->settings = get_string_array(env, argv[2], "netnsAdd", "sysctls");
    if (!w->settings) goto fail;
    const char *bad = sysctl_bad_setting(w->settings);
    if (bad) {
      throw_type(env, "netnsAdd: setting \"%s\" is not name=value with a name of [a-z0-9_.-]", bad);
      goto fail;
    }
  }
  promise = queue_promise(env, "vmpod.netnsAdd", netns_add_execute, netns_add_complete, w, &w->work, &w->deferred);
  if (!promise) goto fail;
  free(name);
  return promise;
fail:
  // a created promise that is never settled is only garbage: the caller sees the exception
  free(name);
  netns_add_free(w);
  return NULL;
}

static void netns_make_complete(napi_env env, napi_status status, void *data) {
  netns_add_t *w = data;
  if (status != napi_ok && !w->err) netns_add_fail(w, ECANCELED, "netnsMake: cancelled");
  napi_value v = NULL;
  if (!w->err && napi_create_int32(env, w->fd, &v) != napi_ok) netns_add_fail(w, ENOMEM, "netnsMake: the result");
  if (w->err && w->fd >= 0) close(w->fd);
  settle_promise(env, w->deferred, w->err, w->what, w->err ? NULL : v);
  napi_delete_async_work(env, w->work);
  netns_add_free(w);
}

// netnsMake(sysctls?: string[]) -> Promise<fd>: a new netns on a pool thread, the sysctls written inside it, held by
// the fd it resolves with (close it to let it go; netnsBind mounts it under a name).
static napi_value js_netnsMake(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  if (napi_get_cb_info(env, info, &argc, argv, NULL, NULL) != napi_ok) return throw_type(env, "netnsMake: expected ([sysctls])");
  netns_add_t *w = calloc(1, sizeof(*w));
  if (!w) return throw_errno(env, ENOMEM, "netnsMake");
  w->fd = -1;
  napi_valuetype t = napi_undefined;
  if (argc > 0) napi_typeof(env, argv[0], &t);
  if (t != napi_undefined) {
    w->settings = get_string_array(env, argv[0], "netnsMake", "sysctls");
    const char *bad = w->settings ? sysctl_bad_setting(w->settings) : NULL;
    if (!w->settings || bad) {
      if (bad) throw_type(env, "netnsMake: setting \"%s\" is not name=value with a name of [a-z0-9_.-]", bad);
      netns_add_free(w);
      return NULL;
    }
  }
  napi_value promise = queue_promise(env, "vmpod.netnsMake", netns_make_execute, netns_make_complete, w, &w->work, &w->deferred);
  if (!promise) netns_add_free(w);
  return promise;
}

// netnsBind(fd, dir, name) -> Promise: the netns of fd (netnsMake's) at <dir>/<name>, as netnsAdd would make one
// there; fd stays the caller's.
static napi_value js_netnsBind(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  if (!get_args(env, info, 3, argv, "netnsBind")) return NULL;
  int fd;
  if (!get_fd(env, argv[0], "netnsBind", &fd)) return NULL;
  netns_add_t *w = calloc(1, sizeof(*w));
  if (!w) return throw_errno(env, ENOMEM, "netnsBind");
  w->fd = fd;
  char *name = NULL;
  w->dir = get_string(env, argv[1], "netnsBind", "dir");
  if (w->dir) name = get_string(env, argv[2], "netnsBind", "name");
  if (!w->dir || !name || w->dir[0] != '/' || !netns_name_ok(name)) {
    if (w->dir && name) throw_type(env, "netnsBind: dir must be absolute and name 1 to 255 bytes without '/', got \"%s\" and \"%s\"", w->dir, name);
    free(name);
    netns_add_free(w);
    return NULL;
  }
  size_t plen = strlen(w->dir) + 1 + strlen(name) + 1;
  w->path = malloc(plen);
  if (!w->path) {
    free(name);
    netns_add_free(w);
    return throw_errno(env, ENOMEM, "netnsBind");
  }
  snprintf(w->path, plen, "%s/%s", w->dir, name);
  free(name);
  napi_value promise = queue_promise(env, "vmpod.netnsBind", netns_bind_execute, netns_add_complete, w, &w->work, &w->deferred);
  if (!promise) netns_add_free(w);
  return promise;
}

// `ip netns del`: detach the netns mount and remove the file. The kernel frees the netns once nothing holds it
// (a process in it, an open fd such as a tap's). A path that is no mount (EINVAL) is still removed.
static void netns_del_execute(napi_env env, void *data) {
  (void)env;
  netns_add_t *w = data;
  if (umount2(w->path, MNT_DETACH) < 0 && errno != EINVAL)
    netns_add_fail(w, errno, "netnsDel: umount %s", w->path);
  else if (unlink(w->path) < 0)
    netns_add_fail(w, errno, "netnsDel: remove %s", w->path);
}

// netnsDel(path) -> Promise: on a pool thread (the unlink can wait on the filesystem's journal)
static napi_value js_netnsDel(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  char *path = get_args(env, info, 1, argv, "netnsDel") ? get_string(env, argv[0], "netnsDel", "path") : NULL;
  if (!path) return NULL;
  if (path[0] != '/') {
    throw_type(env, "netnsDel: path must be absolute, got \"%s\"", path);
    free(path);
    return NULL;
  }
  netns_add_t *w = calloc(1, sizeof(*w));
  if (!w) {
    free(path);
    return throw_errno(env, ENOMEM, "netnsDel");
  }
  w->path = path;
  napi_value promise = queue_promise(env, "vmpod.netnsDel", netns_del_execute, netns_add_complete, w, &w->work, &w->deferred);
  if (!promise) netns_add_free(w);
  return promise;
}

// ---------------------------------------------------------------------------------------------
// rtnetlink in a netns
//
// netlinkInNetns(nsPath, requests, force) runs a batch of requests in the netns at nsPath on a libuv pool thread:
// the thread enters the netns, opens a NETLINK_ROUTE socket there, runs the requests in order, and goes back to its
// own netns. A request (integers in host order; src/net/rtnl.ts builds them):
//   u32 kind, u32 body length, body
//   kind 0, a netlink message: u32 n; n x { u32 offset; char name[16] }: the ifindex of link `name` (in the netns)
//           goes in as a u32 at `offset` of the message, which follows. Its answer: an ACK, or a dump's messages up
//           to NLMSG_DONE.
//   kind 1, a persistent tap: char name[16]; u32 flags (IFF_*): TUNSETIFF, then TUNSETPERSIST, as `ip tuntap add`.
//   kind 2, an nf_tables transaction: the messages from NFNL_MSG_BATCH_BEGIN to NFNL_MSG_BATCH_END, sent at once
//           on a NETLINK_NETFILTER socket in the netns (all of it is committed, or none).
//   kind 3, sysctls: "name=value" lines (16 at most), written to /proc/sys in the netns, as sysctlInNetns does.
// The answer, per request that ran: i32 errno (0: done), u32 data length, u32 text length, the data (a dump's
// messages), the text (on a failure: strerror, then the kernel's extended ack or what failed). Without force the batch stops at the first
// failure, as `ip -batch` does; with force every request runs, as `ip -force -batch`.

#define NL_RECV_BYTES (64 * 1024)
#define NL_MAX_BATCH (4 * 1024 * 1024)
#define NL_TIMEOUT_S 15

typedef struct {
  napi_async_work work;
  napi_deferred deferred;
  char *ns_path;
  uint8_t *req;
  size_t req_len;
  bool force;
  uint8_t *out;
  size_t out_len, out_cap;
  int err;  // the whole call failed (netns, socket, memory): what says why
  char what[320];
} nl_batch_t;

static bool nl_put(nl_batch_t *w, const void *p, size_t n) {
  if (w->out_len + n > w->out_cap) {
    size_t cap = w->out_cap ? w->out_cap : 4096;
    while (cap < w->out_len + n) cap *= 2;
    uint8_t *o = realloc(w->out, cap);
    if (!o) return false;
    w->out = o, w->out_cap = cap;
  }
  memcpy(w->out + w->out_len, p, n);
  w->out_len += n;
  return true;
}

// The text of NLMSGERR_ATTR_MSG in an error or done message (capped acks: the TLVs follow struct nlmsgerr).
static void nl_extack(const struct nlmsghdr *m, size_t skip, char *text, size_t cap) {
  if (!(m->nlmsg_flags & NLM_F_ACK_TLVS) || m->nlmsg_len < NLMSG_HDRLEN + skip) return;
  const uint8_t *p = (const uint8_t *)NLMSG_DATA(m) + skip, *end = (const uint8_t *)m + m->nlmsg_len;
  while (p + sizeof(struct nlattr) <= end) {
    const struct nlattr *a = (const void *)p;
    if (a->nla_len < sizeof(*a) || p + a->nla_len > end) return;
    if ((a->nla_type & NLA_TYPE_MASK) == NLMSGERR_ATTR_MSG) {
      snprintf(text, cap, "%.*s", (int)(a->nla_len - sizeof(*a)), (const char *)(a + 1));
      size_t l = strlen(text);
      while (l > 0 && (text[l - 1] == '\n' || text[l - 1] == '\0')) text[--l] = '\0';
      return;
    }
    p += NLA_ALIGN(a->nla_len);
  }
}

// Sends one message and reads its answer, appending a dump's messages to the output. Returns 0 or an errno.
static int nl_exchange(int sock, uint8_t *msg, size_t len, uint32_t seq, uint8_t *buf, nl_batch_t *w, char *text, size_t tcap) {
  struct nlmsghdr *h = (struct nlmsghdr *)msg;
  if (len < NLMSG_HDRLEN || h->nlmsg_len != len) {
    snprintf(text, tcap, "malformed netlink request (%zu bytes, header says %u)", len, len >= NLMSG_HDRLEN ? h->nlmsg_len : 0);
    return EINVAL;
  }
  bool dump = (h->nlmsg_flags & NLM_F_DUMP) == NLM_F_DUMP;
  h->nlmsg_flags |= NLM_F_REQUEST | (dump ? 0 : NLM_F_ACK);
  h->nlmsg_seq = seq;
  h->nlmsg_pid = 0;
  ssize_t n;
  do n = send(sock, msg, len, 0);
  while (n < 0 && errno == EINTR);
  if (n < 0) return snprintf(text, tcap, "send"), errno;
  for (;;) {
    struct iovec iov = {buf, NL_RECV_BYTES};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    do n = recvmsg(sock, &mh, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
      int err = errno == EAGAIN ? ETIMEDOUT : errno;
      snprintf(text, tcap, "no answer from the kernel");
      return err;
    }
    if (mh.msg_flags & MSG_TRUNC) return snprintf(text, tcap, "answer larger than %d bytes", NL_RECV_BYTES), EMSGSIZE;
    size_t left = (size_t)n;
    for (struct nlmsghdr *m = (struct nlmsghdr *)buf; NLMSG_OK(m, left); m = NLMSG_NEXT(m, left)) {
      if (m->nlmsg_seq != seq) continue;
      if (m->nlmsg_type == NLMSG_ERROR || m->nlmsg_type == NLMSG_DONE) {
        int code = 0;
        if (m->nlmsg_len >= NLMSG_HDRLEN + sizeof(int)) code = -*(const int *)NLMSG_DATA(m);
        nl_extack(m, m->nlmsg_type == NLMSG_ERROR ? sizeof(struct nlmsgerr) : sizeof(int), text, tcap);
        return code;
      }
      if (dump && !nl_put(w, m, NLMSG_ALIGN(m->nlmsg_len) <= left ? NLMSG_ALIGN(m->nlmsg_len) : m->nlmsg_len)) return ENOMEM;
    }
  }
}

// `ip tuntap add dev <name> mode tap [vnet_hdr]`: a persistent tap, no fd kept.
static int nl_tap(const uint8_t *body, size_t len, char *text, size_t tcap) {
  if (len != IFNAMSIZ + 4) return snprintf(text, tcap, "malformed tap request"), EINVAL;
  struct ifreq ifr;
  memset(&ifr, 0, sizeof(ifr));
  memcpy(ifr.ifr_name, body, IFNAMSIZ - 1);
  uint32_t flags;
  memcpy(&flags, body + IFNAMSIZ, 4);
  ifr.ifr_flags = (short)flags;
  int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC), err = 0;
  if (fd < 0) return snprintf(text, tcap, "open /dev/net/tun"), errno;
  if (ioctl(fd, TUNSETIFF, &ifr) < 0) err = errno, snprintf(text, tcap, "ioctl(TUNSETIFF) %s", ifr.ifr_name);
  else if (ioctl(fd, TUNSETPERSIST, 1) < 0) err = errno, snprintf(text, tcap, "ioctl(TUNSETPERSIST) %s", ifr.ifr_name);
  close(fd);
  return err;
}

// An nf_tables transaction (kind 2): the batch (BATCH_BEGIN .. BATCH_END, each message asking for an ACK) goes in one
// send on a NETLINK_NETFILTER socket in the netns; the kernel runs it during the send and commits all of it or none,
// so its answers are queued by the time send returns: read them without waiting, the first error is the answer.
static int nl_netfilter(int *nfsock, uint8_t *body, size_t len, uint8_t *buf, char *text, size_t tcap) {
  if (*nfsock < 0) {
    int one = 1;
    *nfsock = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
    if (*nfsock < 0) return snprintf(text, tcap, "socket(NETLINK_NETFILTER)"), errno;
    setsockopt(*nfsock, SOL_NETLINK, NETLINK_CAP_ACK, &one, sizeof(one));
    setsockopt(*nfsock, SOL_NETLINK, NETLINK_EXT_ACK, &one, sizeof(one));
  }
  ssize_t n;
  do n = send(*nfsock, body, len, 0);
  while (n < 0 && errno == EINTR);
  if (n < 0) return snprintf(text, tcap, "send"), errno;
  int first = 0;
  for (;;) {
    do n = recv(*nfsock, buf, NL_RECV_BYTES, MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0) return errno == EAGAIN ? first : (snprintf(text, tcap, "recv"), errno);
    size_t left = (size_t)n;
    for (struct nlmsghdr *m = (struct nlmsghdr *)buf; NLMSG_OK(m, left); m = NLMSG_NEXT(m, left)) {
      if (m->nlmsg_type != NLMSG_ERROR || m->nlmsg_len < NLMSG_HDRLEN + sizeof(int) || first) continue;
      first = -*(const int *)NLMSG_DATA(m);
      if (first) nl_extack(m, sizeof(struct nlmsgerr), text, tcap);
    }
  }
}

// Sysctls (kind 3): "name=value" lines, as sysctlInNetns takes them, written in this thread's netns (the pod's).
static int nl_sysctl(const uint8_t *body, size_t len, char *text, size_t tcap) {
  char copy[4096];
  char *settings[17];
  size_t n = 0;
  if (len == 0 || len >= sizeof(copy)) return snprintf(text, tcap, "malformed sysctl request"), EINVAL;
  memcpy(copy, body, len);
  copy[len] = '\0';
  for (char *save = NULL, *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (n == 16) return snprintf(text, tcap, "more than 16 sysctls in one request"), EINVAL;
    settings[n++] = line;
  }
  settings[n] = NULL;
  const char *bad = sysctl_bad_setting(settings);
  if (bad) return snprintf(text, tcap, "setting \"%s\" is not name=value with a name of [a-z0-9_.-]", bad), EINVAL;
  const char *failed = NULL;
  int err = sysctl_write_all(settings, &failed);
  if (err) snprintf(text, tcap, "sysctl -w %s", failed);
  return err;
}

// One request (kind, body); 0 or an errno, with text saying what.
static int nl_request(int sock, int *nfsock, uint32_t kind, uint8_t *body, size_t len, uint32_t seq, uint8_t *buf, nl_batch_t *w, char *text, size_t tcap) {
  if (kind == 1) return nl_tap(body, len, text, tcap);
  if (kind == 2) return nl_netfilter(nfsock, body, len, buf, text, tcap);
  if (kind == 3) return nl_sysctl(body, len, text, tcap);
  if (kind != 0 || len < 4) return snprintf(text, tcap, "unknown request kind %u", kind), EINVAL;
  uint32_t nfix;
  memcpy(&nfix, body, 4);
  size_t fixes = 4 + (size_t)nfix * (4 + IFNAMSIZ);
  if (nfix > 16 || fixes > len) return snprintf(text, tcap, "malformed fixups"), EINVAL;
  uint8_t *msg = body + fixes;
  size_t mlen = len - fixes;
  for (uint32_t i = 0; i < nfix; i++) {
    uint32_t off;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    memcpy(&off, body + 4 + i * (4 + IFNAMSIZ), 4);
    memcpy(ifr.ifr_name, body + 8 + i * (4 + IFNAMSIZ), IFNAMSIZ - 1);
    if (off + 4 > mlen) return snprintf(text, tcap, "fixup outside the message"), EINVAL;
    // an ioctl on any socket looks the name up in the socket's netns
    if (ioctl(sock, SIOCGIFINDEX, &ifr) < 0) return snprintf(text, tcap, "Cannot find device \"%s\"", ifr.ifr_name), errno;
    uint32_t idx = (uint32_t)ifr.ifr_ifindex;
    memcpy(msg + off, &idx, 4);
  }
  return nl_exchange(sock, msg, mlen, seq, buf, w, text, tcap);
}

// The requests, in the netns (this pool thread is in it).
static void nl_run_all(nl_batch_t *w, int sock, uint8_t *buf) {
  int nfsock = -1;
  for (size_t at = 0, seq = 1; at < w->req_len; seq++) {
    char text[256] = "";
    int32_t head[3] = {0, 0, 0};
    size_t mark = w->out_len;
    uint32_t kind = 0, len = 0;
    if (!nl_put(w, head, sizeof(head))) goto oom;
    bool whole = w->req_len - at >= 8;
    if (whole) memcpy(&kind, w->req + at, 4), memcpy(&len, w->req + at + 4, 4);
    whole = whole && len <= w->req_len - at - 8;
    int err = whole ? nl_request(sock, &nfsock, kind, w->req + at + 8, len, (uint32_t)seq, buf, w, text, sizeof(text))
                    : (snprintf(text, sizeof(text), "truncated request"), EINVAL);
    if (err) {
      // a failed dump gives no data; the text starts with strerror, as iproute2 says "RTNETLINK answers: <strerror>"
      char sbuf[128], full[sizeof(text)];
      w->out_len = mark + sizeof(head);
      snprintf(full, sizeof(full), "%s%s%s", strerror_r(err, sbuf, sizeof(sbuf)), text[0] ? ": " : "", text);
      memcpy(text, full, sizeof(text));
    }
    head[0] = err;
    head[1] = (int32_t)(w->out_len - mark - sizeof(head));
    head[2] = (int32_t)strlen(text);
    if (!nl_put(w, text, strlen(text))) goto oom;
    memcpy(w->out + mark, head, sizeof(head));
    if (!whole || (err && !w->force)) break;
    at += 8 + len;
  }
  if (nfsock >= 0) close(nfsock);
  return;
oom:
  if (nfsock >= 0) close(nfsock);
  w->err = ENOMEM;
  snprintf(w->what, sizeof(w->what), "netlinkInNetns %s: answer", w->ns_path);
}

static void nl_batch_execute(napi_env env, void *data) {
  (void)env;
  nl_batch_t *w = data;
  const char *step = NULL;
  int orig = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  int target = orig < 0 ? -1 : open(w->ns_path, O_RDONLY | O_CLOEXEC);
  uint8_t *buf = malloc(NL_RECV_BYTES);
  if (orig < 0) w->err = errno, step = "open /proc/thread-self/ns/net";
  else if (target < 0) w->err = errno, step = "open the netns";
  else if (!buf) w->err = ENOMEM, step = "memory";
  else if (setns(target, CLONE_NEWNET) < 0) w->err = errno, step = "setns";
  else {
    int sock = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (sock < 0) {
      w->err = errno, step = "socket(AF_NETLINK)";
    } else {
      int one = 1;
      struct timeval tv = {NL_TIMEOUT_S, 0};
      setsockopt(sock, SOL_NETLINK, NETLINK_CAP_ACK, &one, sizeof(one));
      setsockopt(sock, SOL_NETLINK, NETLINK_EXT_ACK, &one, sizeof(one));
      setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      nl_run_all(w, sock, buf);
      close(sock);
    }
    // a pool thread left in the pod's netns would run later work there: abort rather than go on
    if (setns(orig, CLONE_NEWNET) < 0) {
      fprintf(stderr, "vmpod_native: setns back from %s failed: %s; aborting\n", w->ns_path, strerror(errno));
      abort();
    }
  }
  if (step) snprintf(w->what, sizeof(w->what), "netlinkInNetns %s: %s", w->ns_path, step);
  free(buf);
  if (target >= 0) close(target);
  if (orig >= 0) close(orig);
}

static void nl_batch_free(nl_batch_t *w) {
  free(w->ns_path);
  free(w->req);
  free(w->out);
  free(w);
}

static void nl_batch_complete(napi_env env, napi_status status, void *data) {
  nl_batch_t *w = data;
  napi_value v = NULL;
  if (status != napi_ok && !w->err) w->err = ECANCELED, snprintf(w->what, sizeof(w->what), "netlinkInNetns %s: cancelled", w->ns_path);
  if (!w->err && napi_create_buffer_copy(env, w->out_len, w->out_len ? w->out : (const void *)"", NULL, &v) != napi_ok)
    w->err = ENOMEM, snprintf(w->what, sizeof(w->what), "netlinkInNetns %s: answer buffer", w->ns_path);
  settle_promise(env, w->deferred, w->err, w->what, v);
  napi_delete_async_work(env, w->work);
  nl_batch_free(w);
}

static napi_value js_netlinkInNetns(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  if (!get_args(env, info, 3, argv, "netlinkInNetns")) return NULL;
  nl_batch_t *w = calloc(1, sizeof(*w));
  if (!w) return throw_errno(env, ENOMEM, "netlinkInNetns");
  const uint8_t *data;
  size_t len;
  napi_value promise = NULL;
  w->ns_path = get_string(env, argv[0], "netlinkInNetns", "nsPath");
  if (!w->ns_path || !get_bytes(env, argv[1], "netlinkInNetns", "requests", &data, &len) ||
      !get_bool(env, argv[2], "netlinkInNetns", "force", &w->force))
    goto fail;
  if (w->ns_path[0] != '/' || len > NL_MAX_BATCH) {
    throw_type(env, "netlinkInNetns: nsPath must be absolute and requests at most %d bytes", NL_MAX_BATCH);
    goto fail;
  }
  w->req = malloc(len ? len : 1);
  if (!w->req) {
    throw_errno(env, ENOMEM, "netlinkInNetns");
    goto fail;
  }
  memcpy(w->req, data, len);
  w->req_len = len;
  promise = queue_promise(env, "vmpod.netlinkInNetns", nl_batch_execute, nl_batch_complete, w, &w->work, &w->deferred);
  if (promise) return promise;
fail:
  nl_batch_free(w);
  return NULL;
}

static napi_value Init(napi_env env, napi_value exports) {
  static const struct {
    const char *name;
    napi_callback cb;
  } fns[] = {
      {"listenUnix", js_listenUnix},
      {"accept", js_accept},
      {"peerCred", js_peerCred},
      {"read", js_read},
      {"sendMsg", js_sendMsg},
      {"trySendMsg", js_trySendMsg},
      {"lockExclusive", js_lockExclusive},
      {"pollReadable", js_pollReadable},
      {"fastGetServer", js_fastGetServer},
      {"spawnChild", js_spawnChild},
      {"killGroup", js_killGroup},
      {"close", js_close},
      {"exchangePaths", js_exchangePaths},
      {"connectUnix", js_connectUnix},
      {"writeAll", js_writeAll},
      {"recvMsg", js_recvMsg},
      {"setTimeouts", js_setTimeouts},
      {"setInheritable", js_setInheritable},
      {"dupCloexec", js_dupCloexec},
      {"execve", js_execve},
      {"inheritableFds", js_inheritableFds},
      {"openTap", js_openTap},
      {"openTapAsync", js_openTapAsync},
      {"udpSocketInNetns", js_udpSocketInNetns},
      {"packetSocketInNetns", js_packetSocketInNetns},
      {"sysctlInNetns", js_sysctlInNetns},
      {"recvFrom", js_recvFrom},
      {"sendTo", js_sendTo},
      {"notifyDatagram", js_notifyDatagram},
      {"netnsAdd", js_netnsAdd},
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
