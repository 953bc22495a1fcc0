// Process-wide settings of the daemon: mallocArenaMax, the number of glibc's malloc arenas; reserveFds, the fd table
// sized at once.

#include "common.h"

#include <malloc.h>
#include <sys/resource.h>

// At most n malloc arenas from now on, as MALLOC_ARENA_MAX=n would set them at exec (glibc's M_ARENA_MAX). glibc gives
// each thread that allocates under contention an arena of its own, up to eight per CPU, and keeps what is freed in
// it: with the event loop, libuv's pool and V8's workers, megabytes the daemon does not need (docs/performance.md).
// Threads that have an arena keep it; those that start later share.
napi_value js_mallocArenaMax(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  int64_t n;
  if (!get_args(env, info, 1, argv, "mallocArenaMax") || !get_int(env, argv[0], "mallocArenaMax", "n", 1, 64, &n))
    return NULL;
  if (mallopt(M_ARENA_MAX, (int)n) != 1) {
    napi_throw_error(env, NULL, "mallocArenaMax: mallopt(M_ARENA_MAX) failed");
    return NULL;
  }
  return make_undefined(env);
}

// The kernel's fd table grows by doubling when an fd past its end is taken, and in a process with threads each growth
// waits for an RCU grace period (expand_fdtable: milliseconds) in the thread that took the fd: the event loop, when a
// daemon restoring hundreds of pods passes 256, 512 and 1024 fds. One fd taken at n - 1 (at most the soft
// RLIMIT_NOFILE) and closed grows the table once, here on a pool thread; it never shrinks.
typedef struct {
  napi_async_work work;
  napi_deferred deferred;
  int64_t want;
  int size;  // the table holds at least this many fds now
  int err;
} reserve_work_t;

static void reserve_execute(napi_env env, void *data) {
  (void)env;
  reserve_work_t *w = data;
  int64_t n = w->want;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && (int64_t)rl.rlim_cur < n) n = (int64_t)rl.rlim_cur;
  if (n < 4) return;
  int src = open("/", O_PATH | O_CLOEXEC);
  if (src < 0) {
    w->err = errno;
    return;
  }
  int d = fcntl(src, F_DUPFD_CLOEXEC, (int)(n - 1));
  if (d < 0) w->err = errno;
  else {
    w->size = d + 1;
    close(d);
  }
  close(src);
}

static void reserve_complete(napi_env env, napi_status status, void *data) {
  reserve_work_t *w = data;
  napi_value size = NULL;
  if (status != napi_ok && !w->err) w->err = ECANCELED;
  if (!w->err) napi_create_int32(env, w->size, &size);
  settle_promise(env, w->deferred, w->err, "reserveFds", size);
  napi_delete_async_work(env, w->work);
  free(w);
}

// reserveFds(n) -> Promise<number>: the fd table grown to hold n fds (fewer under a lower soft RLIMIT_NOFILE), on a
// pool thread; resolves with how many it holds at least (0: the limit is below 4, nothing done).
napi_value js_reserveFds(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  int64_t n;
  if (!get_args(env, info, 1, argv, "reserveFds") || !get_int(env, argv[0], "reserveFds", "n", 1, 1 << 24, &n))
    return NULL;
  reserve_work_t *w = calloc(1, sizeof(*w));
  if (!w) return throw_errno(env, ENOMEM, "reserveFds");
  w->want = n;
  napi_value promise = queue_promise(env, "vmpod.reserveFds", reserve_execute, reserve_complete, w, &w->work, &w->deferred);
  if (!promise) free(w);
  return promise;
}
