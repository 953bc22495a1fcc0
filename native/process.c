// Process-wide settings of the daemon: mallocArenaMax, the number of glibc's malloc arenas.

#include "common.h"

#include <malloc.h>

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
