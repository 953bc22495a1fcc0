// fds and processes: close, dup close-on-exec (dupCloexec), the scan of inherited fds
// (inheritableFds), and execve in place with the fds to keep (what vmwrapper does to become qemu).

#include "common.h"

napi_value js_close(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  int fd;
  if (!get_args(env, info, 1, argv, "close") || !get_fd(env, argv[0], "close", &fd)) return NULL;
  // Linux releases the fd even when close fails with EINTR: never retry (it could close a reused fd).
  if (close(fd) < 0 && errno != EINTR) return throw_errno(env, errno, "close fd %d", fd);
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

napi_value js_dupCloexec(napi_env env, napi_callback_info info) {
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
napi_value js_inheritableFds(napi_env env, napi_callback_info info) {
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

napi_value js_execve(napi_env env, napi_callback_info info) {
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
