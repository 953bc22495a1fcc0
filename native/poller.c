// The poller: pollReadable watches an fd on the event loop (uv_poll) and calls back into JS on readable, writable or
// hang-up, with want() to change what is watched and stop() to end it.

#include "common.h"

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

napi_value js_pollReadable(napi_env env, napi_callback_info info) {
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
