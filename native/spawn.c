// spawnChild: a program run to completion without holding the event loop (declared in common.h; typed in
// src/native.ts). The daemon runs every CNI plugin through it.
//
// libuv's spawn forks the whole daemon (its page tables, then copy-on-write faults in the parent) and
// blocks the loop until the child has exec'd, on every plugin run. posix_spawn clones with CLONE_VM|CLONE_VFORK
// instead: nothing is copied, and the loop waits only for the exec itself. The child is then watched on the loop:
// its exit through a pidfd (Linux 5.3; waitid P_PIDFD 5.4), stdout and stderr through non-blocking pipes, stdin
// written as the pipe takes it. The child is reaped here (a run that exited 0 a little later: child_cb); libuv only
// waits for the pids it spawned itself.
//
// The child: argv is just the path (as libcni runs a plugin), the environment is exactly `env`, it leads a new
// session (so its process group can be signalled with whatever it starts), every signal is at its default and none
// is blocked (node ignores SIGPIPE; that must not reach the plugin), fds 0-2 are the three pipes and nothing else is
// inherited (every fd of this addon and of node is close-on-exec). One exception, glibc's: its two internal
// real-time signals (32 and 33, which it keeps for threads) stay ignored in the child; nobody sends them to a plugin.
//
// A child may be spawned with its stdin held (stdin null): the pipe stays open and empty until childStdin gives it
// its bytes. A CNI plugin reads its config to EOF before it does anything, so it can be exec'd while the caller
// finishes what must come before it runs (the exec and the start of its runtime overlap that work).
//
// The JS callback gets (CHILD_OVERFLOW) once when stdout or stderr passes maxOutputBytes (what follows is read and
// dropped: the caller decides whether to stop the child), then (CHILD_DONE, {code, signal, stdout, stderr}) once
// the child has exited and both pipes are at EOF, like child_process's 'close'.
#include "common.h"

#include <spawn.h>
#include <sys/wait.h>

#ifndef P_PIDFD
#define P_PIDFD 3
#endif

#define CHILD_OVERFLOW 1
#define CHILD_DONE 2
#define CHILD_READ_CHUNK 65536

typedef struct {
  uint8_t *data;
  size_t len, cap;
  bool eof;
  bool over;  // more than the limit came: the rest is dropped
} out_buf_t;

// At least one free byte in b, growing it a chunk at a time.
static bool out_room(out_buf_t *b) {
  if (b->cap > b->len) return true;
  uint8_t *p = realloc(b->data, b->cap + CHILD_READ_CHUNK);
  if (!p) return false;
  b->data = p;
  b->cap += CHILD_READ_CHUNK;
  return true;
}

typedef struct child_s {
  napi_env env;
  napi_ref cb;
  napi_async_context async;
  napi_async_cleanup_hook_handle cleanup;
  pid_t pid;
  // [0] the pidfd, [1] stdin (write end), [2] stdout, [3] stderr; each closed in its handle's close callback
  int fds[4];
  uv_poll_t h[4];
  bool polling[4];
  int open;  // uv handles not closed yet: the struct is freed when the last one is
  uint8_t *in;
  size_t in_len, in_off;
  out_buf_t out[2];  // stdout, stderr
  size_t limit;
  bool overflowed;
  bool exited;
  int code, sig;  // sig > 0: killed by it
  bool done;      // the result was delivered, or the env is going away
  bool held;      // spawned with its stdin held: in the held list until childStdin (or until it is freed)
  struct child_s *held_next;
} child_t;

// The children whose stdin is held, found by pid (childStdin). Any thread may run an addon instance: one lock.
static child_t *held_list;
static uv_mutex_t held_mu;
static uv_once_t held_once = UV_ONCE_INIT;

static void held_init(void) {
  uv_mutex_init(&held_mu);
}

static void held_add(child_t *c) {
  uv_once(&held_once, held_init);
  uv_mutex_lock(&held_mu);
  c->held = true;
  c->held_next = held_list;
  held_list = c;
  uv_mutex_unlock(&held_mu);
}

// Unlinks c, or the held child of env with this pid when c is NULL; returns it (NULL: none).
static child_t *held_take(child_t *c, napi_env env, pid_t pid) {
  uv_once(&held_once, held_init);
  uv_mutex_lock(&held_mu);
  child_t **at = &held_list;
  while (*at && (c ? *at != c : (*at)->env != env || (*at)->pid != pid)) at = &(*at)->held_next;
  child_t *found = *at;
  if (found) {
    *at = found->held_next;
    found->held = false;
  }
  uv_mutex_unlock(&held_mu);
  return found;
}

// A child whose exit status was read (WNOWAIT) and that is reaped a little later: see child_cb.
#define REAP_DELAY_MS 10

typedef struct {
  uv_timer_t t;
  int pidfd;
} reaper_t;

static void reaper_closed(uv_handle_t *hd) {
  free(hd->data);
}

static void reap(int pidfd) {
  siginfo_t si;
  int r;
  do r = waitid((idtype_t)P_PIDFD, (id_t)pidfd, &si, WEXITED | WNOHANG);
  while (r < 0 && errno == EINTR);
}

static void reap_cb(uv_timer_t *t) {
  reaper_t *rp = t->data;
  reap(rp->pidfd);
  close(rp->pidfd);
  uv_close((uv_handle_t *)&rp->t, reaper_closed);
}

// Reaps the exited child of pidfd REAP_DELAY_MS from now, on a timer that keeps no loop alive, then closes pidfd:
// true. False when no timer could be had (out of memory): nothing is taken, the caller reaps now.
static bool reap_later(uv_loop_t *loop, int pidfd) {
  reaper_t *rp = malloc(sizeof *rp);
  if (!rp || uv_timer_init(loop, &rp->t) != 0) {
    free(rp);
    return false;
  }
  rp->t.data = rp;
  rp->pidfd = pidfd;
  uv_timer_start(&rp->t, reap_cb, REAP_DELAY_MS, 0);
  uv_unref((uv_handle_t *)&rp->t);
  return true;
}

static void child_handle_closed(uv_handle_t *hd) {
  child_t *c = hd->data;
  int i = (int)((uv_poll_t *)hd - c->h);
  if (c->fds[i] >= 0) close(c->fds[i]);
  c->fds[i] = -1;
  if (--c->open > 0) return;
  if (c->held) held_take(c, NULL, 0);
  if (c->fds[1] >= 0) close(c->fds[1]);  // a held stdin that was never given (it has no handle)
  if (c->cleanup) napi_remove_async_cleanup_hook(c->cleanup);
  free(c->in);
  free(c->out[0].data);
  free(c->out[1].data);
  free(c);
}

static void child_close(child_t *c, int i) {
  if (!c->polling[i]) return;
  c->polling[i] = false;
  uv_poll_stop(&c->h[i]);
  uv_close((uv_handle_t *)&c->h[i], child_handle_closed);
}

static void child_release_js(child_t *c) {
  if (c->cb) napi_delete_reference(c->env, c->cb);
  if (c->async) napi_async_destroy(c->env, c->async);
  c->cb = NULL;
  c->async = NULL;
}

static void child_call(child_t *c, int kind, napi_value payload) {
  napi_value cb, recv, args[2], result;
  if (napi_get_reference_value(c->env, c->cb, &cb) != napi_ok || napi_get_global(c->env, &recv) != napi_ok) return;
  napi_create_int32(c->env, kind, &args[0]);
  args[1] = payload;
  if (napi_make_callback(c->env, c->async, recv, cb, 2, args, &result) != napi_ok) {
    bool pending = false;
    napi_is_exception_pending(c->env, &pending);
    napi_value exc;
    if (pending && napi_get_and_clear_last_exception(c->env, &exc) == napi_ok) napi_fatal_exception(c->env, exc);
  }
}

static napi_value out_buffer(napi_env env, out_buf_t *b) {
  napi_value v = NULL;
  napi_create_buffer_copy(env, b->len, b->len ? b->data : (const uint8_t *)"", NULL, &v);
  return v;
}

// Exited and both pipes at EOF: the result goes to JS, and everything of this child is closed.
static void child_maybe_done(child_t *c) {
  if (c->done || !c->exited || !c->out[0].eof || !c->out[1].eof) return;
  c->done = true;
  child_close(c, 1);  // a child that exits without reading all of its stdin
  napi_env env = c->env;
  napi_handle_scope scope;
  if (napi_open_handle_scope(env, &scope) == napi_ok) {
    napi_value r, code, sig;
    if (napi_create_object(env, &r) == napi_ok) {
      if (c->sig > 0) {
        napi_get_null(env, &code);
        napi_create_int32(env, c->sig, &sig);
      } else {
        napi_create_int32(env, c->code, &code);
        napi_get_null(env, &sig);
      }
      napi_set_named_property(env, r, "code", code);
      napi_set_named_property(env, r, "signal", sig);
      napi_set_named_property(env, r, "stdout", out_buffer(env, &c->out[0]));
      napi_set_named_property(env, r, "stderr", out_buffer(env, &c->out[1]));
      child_call(c, CHILD_DONE, r);
    }
    napi_close_handle_scope(env, scope);
  }
  child_release_js(c);
}

static void child_overflow(child_t *c) {
  if (c->overflowed) return;
  c->overflowed = true;
  napi_handle_scope scope;
  if (napi_open_handle_scope(c->env, &scope) != napi_ok) return;
  napi_value u;
  napi_get_undefined(c->env, &u);
  child_call(c, CHILD_OVERFLOW, u);
  napi_close_handle_scope(c->env, scope);
}

// Writes what the pipe takes of the child's stdin: true when some is left for when it is writable.
static bool stdin_write(child_t *c) {
  while (c->in_off < c->in_len) {
    ssize_t n = write(c->fds[1], c->in + c->in_off, c->in_len - c->in_off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return n < 0 && errno == EAGAIN;
    c->in_off += (size_t)n;
  }
  return false;
}

static void child_cb(uv_poll_t *hd, int status, int events) {
  (void)events;
  child_t *c = hd->data;
  int i = (int)(hd - c->h);
  if (c->done) return;
  if (i == 0) {  // the pidfd: readable once the child has exited
    // The status is read without reaping the child (WNOWAIT). The pidfd turns readable as the child's last thread
    // leaves its thread group; that thread has often woken us on its own CPU and been preempted there before it
    // finished exiting. Reaping now would make the kernel flush the child's /proc dentries, which spins until that
    // thread is done with them, so until the next tick takes the CPU from us, on the event loop (docs/performance.md
    // has the trace). A run that exited 0 is reaped REAP_DELAY_MS later; any other (a failure, a kill) now, so that
    // nothing of it is left when its error is told.
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    int r;
    do r = waitid((idtype_t)P_PIDFD, (id_t)c->fds[0], &si, WEXITED | WNOHANG | WNOWAIT);
    while (r < 0 && errno == EINTR);
    if (r == 0 && si.si_pid == 0 && status >= 0) return;  // not yet
    c->exited = true;
    if (r < 0 || status < 0) c->code = 127;  // cannot happen for our own child: reported as a failed run
    else if (si.si_code == CLD_EXITED) c->code = si.si_status;
    else c->sig = si.si_status;
    if (r == 0 && si.si_pid != 0) {
      bool ok = si.si_code == CLD_EXITED && si.si_status == 0;
      // the reaper takes the pidfd, closed after the reap (child_close stops polling it first, while it is open);
      // else it is reaped now and closed with its handle
      if (ok && reap_later(hd->loop, c->fds[0])) c->fds[0] = -1;
      else reap(c->fds[0]);
    }
    child_close(c, 0);
  } else if (i == 1) {  // stdin takes more
    // (EPIPE: the child closed its stdin; its exit status says what happened)
    if (status >= 0 && stdin_write(c)) return;
    child_close(c, 1);
  } else {
    out_buf_t *b = &c->out[i - 2];
    for (;;) {
      uint8_t scratch[4096];
      bool keep = !b->over && out_room(b);  // else read and dropped (past the limit, or out of memory)
      ssize_t n = keep ? read(c->fds[i], b->data + b->len, b->cap - b->len) : read(c->fds[i], scratch, sizeof(scratch));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EAGAIN && status >= 0) return;
      if (n <= 0) {  // EOF (or a read error: no more output either way)
        b->eof = true;
        child_close(c, i);
        break;
      }
      if (!keep) continue;
      b->len += (size_t)n;
      if (b->len > c->limit) {
        b->len = c->limit;
        b->over = true;
        child_overflow(c);
      }
    }
  }
  child_maybe_done(c);
}

static void child_cleanup_hook(napi_async_cleanup_hook_handle hk, void *arg) {
  (void)hk;
  child_t *c = arg;
  c->done = true;
  child_release_js(c);
  for (int i = 0; i < 4; i++) child_close(c, i);
}

// Moves an fd of ours above stdio (a daemon started with 0-2 closed gets pipes there; dup2 onto itself would
// leave the child's copy close-on-exec).
static int above_stdio(int fd) {
  if (fd > 2) return fd;
  int n = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  int err = errno;
  close(fd);
  errno = err;
  return n;
}

static int make_pipe(int p[2]) {
  if (pipe2(p, O_CLOEXEC) < 0) return errno;
  p[0] = above_stdio(p[0]);
  p[1] = above_stdio(p[1]);
  if (p[0] < 0 || p[1] < 0) {
    int err = errno;
    if (p[0] >= 0) close(p[0]);
    if (p[1] >= 0) close(p[1]);
    return err;
  }
  return 0;
}

// posix_spawn of path with argv [path] and exactly envp, its stdio on the three pipes, in a new session with
// every signal at its default. Returns 0 or the errno (the exec's own: ENOENT, EACCES, ENOEXEC, ETXTBSY...).
static int spawn_plugin(const char *path, char **envp, int in_r, int out_w, int err_w, pid_t *pid) {
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  int err = posix_spawn_file_actions_init(&fa);
  if (err) return err;
  err = posix_spawnattr_init(&at);
  if (err) {
    posix_spawn_file_actions_destroy(&fa);
    return err;
  }
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  if (!err) err = posix_spawn_file_actions_adddup2(&fa, in_r, 0);
  if (!err) err = posix_spawn_file_actions_adddup2(&fa, out_w, 1);
  if (!err) err = posix_spawn_file_actions_adddup2(&fa, err_w, 2);
  if (!err) err = posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  if (!err) err = posix_spawnattr_setsigmask(&at, &none);
  if (!err) err = posix_spawnattr_setsigdefault(&at, &all);
  char *argv[2] = {(char *)path, NULL};
  if (!err) err = posix_spawn(pid, path, &fa, &at, argv, envp);
  posix_spawnattr_destroy(&at);
  posix_spawn_file_actions_destroy(&fa);
  return err;
}

// Gives the child its stdin: what the pipe takes now (a CNI config is a few KiB: all of it), and then its end closes
// at once, not on a later turn of the loop (a plugin reads its stdin to EOF before it does anything); else the rest
// as the pipe takes it (child_cb).
static void stdin_give(child_t *c, uv_loop_t *loop) {
  if (!stdin_write(c)) {
    close(c->fds[1]);
    c->fds[1] = -1;
    return;
  }
  uv_poll_init(loop, &c->h[1], c->fds[1]);  // cannot fail for a pipe on Linux
  c->h[1].data = c;
  c->polling[1] = true;
  c->open++;
  uv_poll_start(&c->h[1], UV_WRITABLE, child_cb);
}

// spawnChild(path, env: string[], stdin: Uint8Array | null, maxOutputBytes, cb(kind, result)) -> pid
napi_value js_spawnChild(napi_env env, napi_callback_info info) {
  napi_value argv[5], name;
  const uint8_t *in = NULL;
  size_t in_len = 0;
  int64_t limit;
  napi_valuetype t;
  if (!get_args(env, info, 5, argv, "spawnChild")) return NULL;
  bool held = napi_typeof(env, argv[2], &t) == napi_ok && t == napi_null;
  if ((!held && !get_bytes(env, argv[2], "spawnChild", "stdin", &in, &in_len)) ||
      !get_int(env, argv[3], "spawnChild", "maxOutputBytes", 0, MAX_IO_BYTES, &limit))
    return NULL;
  if (napi_typeof(env, argv[4], &t) != napi_ok || t != napi_function)
    return throw_type(env, "spawnChild: cb must be a function");
  char *path = get_string(env, argv[0], "spawnChild", "path");
  if (!path) return NULL;
  char **envp = get_string_array(env, argv[1], "spawnChild", "env");
  if (!envp) {
    free(path);
    return NULL;
  }
  napi_value ret = NULL;
  int pin[2] = {-1, -1}, pout[2] = {-1, -1}, perr[2] = {-1, -1};
  child_t *c = calloc(1, sizeof(*c));
  int err = c ? 0 : ENOMEM;
  if (!err) err = make_pipe(pin);
  if (!err) err = make_pipe(pout);
  if (!err) err = make_pipe(perr);
  if (err) {
    throw_errno(env, err, "spawn %s: pipe", path);
    goto fail;
  }
  if (in_len > 0) {
    c->in = malloc(in_len);
    if (!c->in) {
      throw_errno(env, ENOMEM, "spawn %s: stdin of %zu bytes", path, in_len);
      goto fail;
    }
    memcpy(c->in, in, in_len);
  }
  err = spawn_plugin(path, envp, pin[0], pout[1], perr[1], &c->pid);
  if (err) {
    throw_errno(env, err, "spawn %s", path);
    goto fail;
  }
  close(pin[0]);
  close(pout[1]);
  close(perr[1]);
  pin[0] = pout[1] = perr[1] = -1;
  int pidfd = (int)syscall(SYS_pidfd_open, c->pid, 0);
  if (pidfd < 0) {
    // never happens on a kernel that has pidfds (5.3+): a child nobody could watch is stopped at once
    err = errno;
    kill(c->pid, SIGKILL);
    while (waitpid(c->pid, NULL, 0) < 0 && errno == EINTR) {
    }
    throw_errno(env, err, "spawn %s: pidfd_open", path);
    goto fail;
  }
  c->fds[0] = pidfd;
  c->fds[1] = pin[1];
  c->fds[2] = pout[0];
  c->fds[3] = perr[0];
  pin[1] = pout[0] = perr[0] = -1;
  for (int i = 1; i < 4; i++) fcntl(c->fds[i], F_SETFL, O_NONBLOCK);
  c->env = env;
  c->in_len = in_len;
  c->limit = (size_t)limit;
  uv_loop_t *loop;
  napi_get_uv_event_loop(env, &loop);
  for (int i = 0; i < 4; i++) {
    if (i == 1) continue;  // stdin: stdin_give, below or in childStdin
    uv_poll_init(loop, &c->h[i], c->fds[i]);  // cannot fail for a pipe or a pidfd on Linux
    c->h[i].data = c;
    c->polling[i] = true;
    c->open++;
  }
  if (napi_create_reference(env, argv[4], 1, &c->cb) != napi_ok ||
      napi_create_string_utf8(env, "vmpod.spawnChild", NAPI_AUTO_LENGTH, &name) != napi_ok ||
      napi_async_init(env, NULL, name, &c->async) != napi_ok ||
      napi_add_async_cleanup_hook(env, child_cleanup_hook, c, &c->cleanup) != napi_ok) {
    pid_t pid = c->pid;
    c->cleanup = NULL;
    kill(-pid, SIGKILL);
    child_cleanup_hook(NULL, c);  // closes the handles; the last close frees c
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
    }
    free(path);
    free_strv(envp);
    return throw_napi(env, "spawnChild: napi setup failed");
  }
  if (held) held_add(c);
  else stdin_give(c, loop);
  uv_poll_start(&c->h[0], UV_READABLE, child_cb);
  uv_poll_start(&c->h[2], UV_READABLE | UV_DISCONNECT, child_cb);
  uv_poll_start(&c->h[3], UV_READABLE | UV_DISCONNECT, child_cb);
  ret = make_int(env, c->pid);
  free(path);
  free_strv(envp);
  return ret;

fail:
  for (int i = 0; i < 2; i++) {
    if (pin[i] >= 0) close(pin[i]);
    if (pout[i] >= 0) close(pout[i]);
    if (perr[i] >= 0) close(perr[i]);
  }
  if (c) free(c->in);
  free(c);
  free(path);
  free_strv(envp);
  return NULL;
}

// childStdin(pid, stdin: Uint8Array): gives a child spawned with its stdin held (spawnChild's stdin null) these bytes,
// then EOF. A child that is done already gets nothing. ESRCH: no child of this instance waits for its stdin.
napi_value js_childStdin(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  int64_t pid;
  const uint8_t *in;
  size_t in_len;
  if (!get_args(env, info, 2, argv, "childStdin") || !get_int(env, argv[0], "childStdin", "pid", 1, INT32_MAX, &pid) ||
      !get_bytes(env, argv[1], "childStdin", "stdin", &in, &in_len))
    return NULL;
  child_t *c = held_take(NULL, env, (pid_t)pid);
  if (!c) return throw_errno(env, ESRCH, "childStdin %lld: no child of ours waits for its stdin", (long long)pid);
  if (!c->done && in_len > 0) {
    c->in = malloc(in_len);
    if (!c->in) {
      close(c->fds[1]);  // EOF: the child gets nothing
      c->fds[1] = -1;
      return throw_errno(env, ENOMEM, "childStdin %lld: stdin of %zu bytes", (long long)pid, in_len);
    }
    memcpy(c->in, in, in_len);
    c->in_len = in_len;
  }
  uv_loop_t *loop;
  napi_get_uv_event_loop(env, &loop);
  stdin_give(c, loop);
  return make_undefined(env);
}

// killGroup(pgid, signo) -> 0 or the errno: kill(-pgid, signo) without an exception (ESRCH, a group that is gone, is
// the usual answer to the sweep after a plugin's exit, and an exception costs the loop more than the kill).
napi_value js_killGroup(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  int64_t pgid, sig;
  if (!get_args(env, info, 2, argv, "killGroup") || !get_int(env, argv[0], "killGroup", "pgid", 2, INT32_MAX, &pgid) ||
      !get_int(env, argv[1], "killGroup", "signal", 0, 64, &sig))
    return NULL;
  return make_int(env, kill(-(pid_t)pgid, (int)sig) < 0 ? errno : 0);
}
