// Unix sockets: the daemon's listening socket (listenUnix, accept, peerCred, read, trySendMsg with SCM_RIGHTS), the
// client's (connectUnix, writeAll, recvMsg, setTimeouts) and the sd_notify datagram (notifyDatagram).

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

napi_value js_listenUnix(napi_env env, napi_callback_info info) {
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

napi_value js_accept(napi_env env, napi_callback_info info) {
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

napi_value js_peerCred(napi_env env, napi_callback_info info) {
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

napi_value js_read(napi_env env, napi_callback_info info) {
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

// The addon's one send: one non-blocking sendmsg(MSG_DONTWAIT|MSG_NOSIGNAL) of data with SCM_RIGHTS(fds); one filler
// byte 0x00 when data is empty and fds are given (a stream socket carries no cmsg without data). Returns the bytes
// written (the fds went with them), or -1 when the socket is full and nothing was written (the caller waits for
// writability and tries again). It never waits, so a slow peer never stalls the event loop.
napi_value js_trySendMsg(napi_env env, napi_callback_info info) {
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

// ---------------------------------------------------------------------------------------------
// Unix stream sockets, client side

napi_value js_connectUnix(napi_env env, napi_callback_info info) {
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

napi_value js_writeAll(napi_env env, napi_callback_info info) {
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

napi_value js_recvMsg(napi_env env, napi_callback_info info) {
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

napi_value js_setTimeouts(napi_env env, napi_callback_info info) {
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
// sd_notify: one datagram to $NOTIFY_SOCKET (a path, or "@name" for the abstract namespace), as
// systemd's sd_notify() sends it. Blocking sendto on a fresh SOCK_DGRAM socket, closed at once.

napi_value js_notifyDatagram(napi_env env, napi_callback_info info) {
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
