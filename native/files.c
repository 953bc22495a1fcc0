// Files: an exclusive flock held by an fd (lockExclusive) and an atomic swap of two paths (exchangePaths).

#include "common.h"

// An exclusive, non-blocking flock on a directory (or file), held by the returned fd (CLOEXEC) until it is
// closed or the process ends. Another holder: throws with code EWOULDBLOCK/EAGAIN.
napi_value js_lockExclusive(napi_env env, napi_callback_info info) {
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

// exchangePaths(a, b): renameat2(RENAME_EXCHANGE), both names swap their files in one atomic step.
napi_value js_exchangePaths(napi_env env, napi_callback_info info) {
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
