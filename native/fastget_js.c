// The fast get server's JS object: fastGetServer makes it (the uv handles, the epoll set, the references) and its
// methods register and unregister replies, pause accepting, count and stop; its lifetime ends when the handles are
// closed and the methods collected. The loop that serves is fastget.c.
#include "fastget.h"

static void fg_unref(fg_server *s) {
  if (--s->refs == 0) free(s);
}

static void fg_handle_closed(fg_server *s) {
  if (--s->handles == 0 && s->cleanup) {
    napi_remove_async_cleanup_hook(s->cleanup);  // teardown may go on now
    s->cleanup = NULL;
  }
  fg_unref(s);
}

static void fg_server_handle_closed(uv_handle_t *h) { fg_handle_closed(h->data); }

static void fg_stop(fg_server *s) {
  if (!s->active) return;
  s->active = false;
  uv_close((uv_handle_t *)&s->listen, fg_server_handle_closed);  // the listening fd is JS's to close
  uv_close((uv_handle_t *)&s->events, fg_server_handle_closed);
  uv_close((uv_handle_t *)&s->sweep, fg_server_handle_closed);
  uv_close((uv_handle_t *)&s->settle, fg_server_handle_closed);
  close(s->epfd);
  while (s->conns) fg_close_conn(s->conns);
  for (int i = 0; i < FG_BUCKETS; i++)
    while (s->buckets[i]) {
      fg_entry *e = s->buckets[i];
      s->buckets[i] = e->next;
      fg_entry_free(e);
    }
  napi_async_destroy(s->env, s->async);
  napi_delete_reference(s->env, s->on_adopt);
  napi_delete_reference(s->env, s->on_error);
  napi_delete_reference(s->env, s->self);
}

static void fg_cleanup_hook(napi_async_cleanup_hook_handle h, void *arg) {
  (void)h;
  fg_stop(arg);
}

static void fg_fn_finalize(napi_env env, void *data, void *hint) {
  (void)env;
  (void)hint;
  fg_unref(data);
}

static fg_server *fg_this(napi_env env, napi_callback_info info, size_t *argc, napi_value *argv) {
  void *data = NULL;
  if (napi_get_cb_info(env, info, argc, argv, NULL, &data) != napi_ok) {
    throw_napi(env, "napi_get_cb_info failed");
    return NULL;
  }
  return data;
}

// A method whose first argument is a key: the server and a malloc'd copy of the key (NULL: an exception is pending).
static char *fg_key_call(napi_env env, napi_callback_info info, size_t want, napi_value *argv, const char *usage,
                         fg_server **s) {
  size_t argc = want;
  *s = fg_this(env, info, &argc, argv);
  if (!*s) return NULL;
  if (argc < want) {
    throw_type(env, "%s", usage);
    return NULL;
  }
  return get_string(env, argv[0], usage, "key");
}

// register(key, reply, fds): reply = the 77-byte header then the payload (at least 1 byte); fds are dup'ed.
static napi_value js_fg_register(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  fg_server *s;
  char *key = fg_key_call(env, info, 3, argv, "register: expects (key, reply, fds)", &s);
  if (!key) return NULL;
  const uint8_t *reply;
  size_t len;
  int *fds = NULL;
  uint32_t nfds = 0;
  napi_value ret = NULL;
  fg_entry *e = NULL;
  if (!get_bytes(env, argv[1], "register", "reply", &reply, &len) || !get_fd_array(env, argv[2], "register", "fds", &fds, &nfds, FG_MAX_FDS))
    goto out;
  if (strlen(key) == 0 || strlen(key) > FG_KEY || len <= FG_HDR) {
    throw_errno(env, EINVAL, "register %s: a key of 1 to %d bytes and a reply longer than its header", key, FG_KEY);
    goto out;
  }
  if (!s->active) {
    ret = make_undefined(env);
    goto out;
  }
  e = calloc(1, sizeof(*e));
  if (!e || !(e->reply = malloc(len))) {
    throw_errno(env, ENOMEM, "register %s", key);
    goto out;
  }
  memcpy(e->reply, reply, len);
  e->len = len;
  strcpy(e->key, key);
  for (uint32_t i = 0; i < nfds; i++) {
    int d = fcntl(fds[i], F_DUPFD_CLOEXEC, 3);
    if (d < 0) {
      throw_errno(env, errno, "register %s: dup fd %d", key, fds[i]);
      goto out;
    }
    e->fds[e->nfds++] = d;
  }
  fg_entry **p = fg_find(s, key);
  if (*p) {
    fg_entry *old = *p;
    e->next = old->next;
    fg_entry_free(old);
  }
  *p = e;
  e = NULL;
  ret = make_undefined(env);
out:
  if (e) fg_entry_free(e);
  free(fds);
  free(key);
  return ret;
}

static napi_value js_fg_unregister(napi_env env, napi_callback_info info) {
  napi_value argv[1];
  fg_server *s;
  char *key = fg_key_call(env, info, 1, argv, "unregister: expects (key)", &s);
  if (!key) return NULL;
  fg_entry **p = fg_find(s, key);
  if (*p) {
    fg_entry *e = *p;
    *p = e->next;
    fg_entry_free(e);
  }
  free(key);
  return make_undefined(env);
}

// want(readable, writable): accept or pause accepting (writable is not used: the DuplexPoller shape).
static napi_value js_fg_want(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2];
  fg_server *s = fg_this(env, info, &argc, argv);
  if (!s) return NULL;
  bool r;
  if (argc < 1) return throw_type(env, "want: expects (readable, writable)");
  if (!get_bool(env, argv[0], "want", "readable", &r)) return NULL;
  if (!s->active || r == s->accepting) return make_undefined(env);
  int rc = r ? uv_poll_start(&s->listen, UV_READABLE, fg_accept_cb) : uv_poll_stop(&s->listen);
  if (rc < 0) return throw_errno(env, -rc, "uv_poll_start fd %d", s->lfd);
  s->accepting = r;
  return make_undefined(env);
}

static napi_value js_fg_set_js_connections(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  fg_server *s = fg_this(env, info, &argc, argv);
  if (!s) return NULL;
  int64_t n;
  if (argc < 1) return throw_type(env, "setJsConnections: expects (n)");
  if (!get_int(env, argv[0], "setJsConnections", "n", 0, INT32_MAX, &n)) return NULL;
  s->js_conns = (int)n;
  return make_undefined(env);
}

// stats(): { gets answered here since the start, connections held here now }
static napi_value js_fg_stats(napi_env env, napi_callback_info info) {
  size_t argc = 0;
  fg_server *s = fg_this(env, info, &argc, NULL);
  if (!s) return NULL;
  napi_value o, v;
  NAPI_OK(napi_create_object(env, &o), "napi_create_object failed");
  NAPI_OK(napi_create_double(env, s->gets, &v), "napi_create_double failed");
  NAPI_OK(napi_set_named_property(env, o, "gets", v), "napi_set_named_property failed");
  NAPI_OK(napi_create_int32(env, s->nconns, &v), "napi_create_int32 failed");
  NAPI_OK(napi_set_named_property(env, o, "connections", v), "napi_set_named_property failed");
  return o;
}

static napi_value js_fg_stop(napi_env env, napi_callback_info info) {
  size_t argc = 0;
  fg_server *s = fg_this(env, info, &argc, NULL);
  if (!s) return NULL;
  fg_stop(s);
  return make_undefined(env);
}

// fastGetServer(listenFd, { allowedGids, maxConnections, idleMs }, adopt(fd, prefix, peer, held), acceptError(err))
napi_value js_fastGetServer(napi_env env, napi_callback_info info) {
  napi_value argv[4], obj, name, v;
  int lfd;
  int64_t max_conns, idle_ms;
  uint32_t ngids = 0;
  napi_valuetype t1, t2;
  if (!get_args(env, info, 4, argv, "fastGetServer") || !get_fd(env, argv[0], "fastGetServer", &lfd)) return NULL;
  if (napi_typeof(env, argv[2], &t1) != napi_ok || t1 != napi_function || napi_typeof(env, argv[3], &t2) != napi_ok ||
      t2 != napi_function)
    return throw_type(env, "fastGetServer: adopt and acceptError must be functions");
  NAPI_OK(napi_get_named_property(env, argv[1], "maxConnections", &v), "napi_get_named_property failed");
  if (!get_int(env, v, "fastGetServer", "maxConnections", 1, INT32_MAX, &max_conns)) return NULL;
  NAPI_OK(napi_get_named_property(env, argv[1], "idleMs", &v), "napi_get_named_property failed");
  if (!get_int(env, v, "fastGetServer", "idleMs", 1, INT32_MAX, &idle_ms)) return NULL;
  NAPI_OK(napi_get_named_property(env, argv[1], "allowedGids", &v), "napi_get_named_property failed");
  if (!get_array_len(env, v, "fastGetServer", "allowedGids", &ngids)) return NULL;
  if (ngids > FG_MAX_GIDS) return throw_errno(env, EINVAL, "fastGetServer: %u allowed gids, at most %d", ngids, FG_MAX_GIDS);

  uv_loop_t *loop;
  NAPI_OK(napi_get_uv_event_loop(env, &loop), "napi_get_uv_event_loop failed");
  fg_server *s = calloc(1, sizeof(*s));
  if (!s) return throw_errno(env, ENOMEM, "fastGetServer");
  for (uint32_t i = 0; i < ngids; i++) {
    napi_value e;
    int64_t g;
    if (napi_get_element(env, v, i, &e) != napi_ok || !get_int(env, e, "fastGetServer", "allowedGids element", 0, UINT32_MAX, &g)) {
      free(s);
      return throw_napi(env, "fastGetServer: allowedGids");
    }
    s->gids[s->ngids++] = (gid_t)g;
  }
  s->env = env;
  s->loop = loop;
  s->lfd = lfd;
  s->max_conns = (int)max_conns;
  s->idle_ms = (uint64_t)idle_ms;
  s->listen.data = s;
  s->events.data = s;
  s->sweep.data = s;
  s->settle.data = s;
  static const struct {
    const char *name;
    napi_callback fn;
  } methods[] = {{"register", js_fg_register}, {"unregister", js_fg_unregister}, {"want", js_fg_want},
                 {"setJsConnections", js_fg_set_js_connections}, {"stats", js_fg_stats}, {"stop", js_fg_stop}};
  napi_value fns[sizeof(methods) / sizeof(methods[0])];
  if (napi_create_object(env, &obj) != napi_ok ||
      napi_create_string_utf8(env, "vmpod.fastGetServer", NAPI_AUTO_LENGTH, &name) != napi_ok) {
    free(s);
    return throw_napi(env, "fastGetServer: creating the server object failed");
  }
  for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
    if (napi_create_function(env, methods[i].name, NAPI_AUTO_LENGTH, methods[i].fn, s, &fns[i]) != napi_ok ||
        napi_set_named_property(env, obj, methods[i].name, fns[i]) != napi_ok) {
      free(s);
      return throw_napi(env, "fastGetServer: creating the server object failed");
    }
  s->epfd = epoll_create1(EPOLL_CLOEXEC);
  if (s->epfd < 0) {
    int err = errno;
    free(s);
    return throw_errno(env, err, "epoll_create1");
  }
  int r = uv_poll_init(loop, &s->listen, lfd);
  if (r == 0) {
    r = uv_poll_init(loop, &s->events, s->epfd);
    if (r < 0) {
      s->handles = 1;
      s->refs = 1;
      uv_close((uv_handle_t *)&s->listen, fg_server_handle_closed);
      close(s->epfd);
      return throw_errno(env, -r, "uv_poll_init epoll fd %d", s->epfd);
    }
  }
  if (r < 0) {
    close(s->epfd);
    free(s);
    return throw_errno(env, -r, "uv_poll_init fd %d", lfd);
  }
  uv_timer_init(loop, &s->sweep);
  uv_timer_init(loop, &s->settle);
  s->handles = 4;
  s->refs = 4;
  if (napi_create_reference(env, argv[2], 1, &s->on_adopt) != napi_ok ||
      napi_create_reference(env, argv[3], 1, &s->on_error) != napi_ok ||
      napi_create_reference(env, obj, 1, &s->self) != napi_ok || napi_async_init(env, obj, name, &s->async) != napi_ok) {
    if (s->on_adopt) napi_delete_reference(env, s->on_adopt);
    if (s->on_error) napi_delete_reference(env, s->on_error);
    if (s->self) napi_delete_reference(env, s->self);
    uv_close((uv_handle_t *)&s->listen, fg_server_handle_closed);
    uv_close((uv_handle_t *)&s->events, fg_server_handle_closed);
    uv_close((uv_handle_t *)&s->sweep, fg_server_handle_closed);
    uv_close((uv_handle_t *)&s->settle, fg_server_handle_closed);
    close(s->epfd);
    return throw_napi(env, "fastGetServer: napi reference failed");
  }
  s->active = true;
  napi_add_async_cleanup_hook(env, fg_cleanup_hook, s, &s->cleanup);
  for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
    s->refs++;
    if (napi_add_finalizer(env, fns[i], s, fg_fn_finalize, NULL, NULL) != napi_ok) {
      s->refs--;
      fg_stop(s);
      return throw_napi(env, "fastGetServer: napi_add_finalizer failed");
    }
  }
  uint64_t every = s->idle_ms / 4 < 1000 ? (s->idle_ms / 4 ? s->idle_ms / 4 : 1) : 1000;
  uv_timer_start(&s->sweep, fg_sweep_cb, every, every);
  uv_unref((uv_handle_t *)&s->sweep);
  uv_unref((uv_handle_t *)&s->settle);
  r = uv_poll_start(&s->events, UV_READABLE, fg_events_cb);
  if (r == 0) r = uv_poll_start(&s->listen, UV_READABLE, fg_accept_cb);
  if (r < 0) {
    fg_stop(s);
    return throw_errno(env, -r, "uv_poll_start fd %d", lfd);
  }
  s->accepting = true;
  return obj;
}
