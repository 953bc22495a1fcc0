// The fast get server: the fd server's accept loop in C, answering gets of registered keys without entering JS
// (typed in src/native.ts). The protocol's constants come from native/protocol.h, generated from src/protocol; which
// frames it answers and which it hands to JS is held to the TS codec by test/unit/fastget-frames.test.ts.
#include "common.h"
#include "protocol.h"

// The fd server's accept loop, in C on the event loop's thread. Connections are watched by an epoll set of ours,
// itself watched by one uv_poll (libuv's own poll per fd costs five syscalls per connection). A connection from uid
// 0 (or a primary gid of
// allowedGids) stays here while it sends complete get requests of keys JS registered (the reply bytes and dup's of
// the fds, per key): each is answered with one send of the header and one sendmsg of the payload with the fds,
// without entering JS. Anything else is handed to JS (adopt) with the bytes read so far: another command, a key
// not registered, a partial or bad header, a peer that needs JS's checks, a socket whose peer is not reading,
// the connection limit. The only JS calls are adopt and accept errors; register/unregister run on the same thread,
// so a key unregistered is never answered again.
//
// A connection answered right after its accept is not put in the epoll set at once: it waits on a "settling" list,
// and a timer reads each such connection FG_SETTLE_MS later, when its client has almost always hung up (vmwrapper
// reads its one reply and exits). The hang-up then costs one recv and the close, not an epoll_ctl ADD, a wake-up, an
// epoll_wait and a DEL. A connection still open then (EAGAIN) joins the epoll set; one that sent more is served then:
// a second request on a connection whose first was a get waits at most FG_SETTLE_MS.

#define FG_HDR PROTO_HEADER_SIZE
#define FG_KEY PROTO_KEY_SIZE
#define FG_BUCKETS 256
#define FG_MAX_FDS 16
#define FG_MAX_GIDS 64
#define FG_SETTLE_MS 1     // how long an answered connection waits before its hang-up is looked for
#define FG_OUTQ_MAX 65536  // bytes the peer has not read yet, beyond which JS (with its write queue) serves

typedef struct fg_entry {
  struct fg_entry *next;
  char key[FG_KEY + 1];  // trimmed, NUL-terminated
  uint8_t *reply;        // the 77-byte header, then the payload
  size_t len;
  int fds[FG_MAX_FDS];   // our dup's (CLOEXEC)
  int nfds;
} fg_entry;

struct fg_server;
typedef struct fg_conn {
  struct fg_server *srv;
  struct fg_conn *prev, *next;
  int fd;
  size_t have;
  uint8_t buf[FG_HDR];
  uint64_t last;  // uv_now of the last request answered (or of the accept)
  uint64_t served;
  bool polled;  // in the epoll set
  struct fg_conn *sprev, *snext;  // on the settling list
  bool settling;
  struct ucred cred;
} fg_conn;

typedef struct fg_server {
  uv_poll_t listen;
  uv_poll_t events;  // the epoll set of the connections
  uv_timer_t sweep;
  uv_timer_t settle;  // reads the settling connections
  uv_loop_t *loop;
  int epfd;
  napi_env env;
  napi_ref on_adopt, on_error, self;
  napi_async_context async;
  napi_async_cleanup_hook_handle cleanup;
  int lfd;
  bool active;
  bool accepting;
  int handles;  // uv handles not closed yet: listen, events, sweep, settle
  int refs;     // handles + the JS functions not finalised yet
  fg_entry *buckets[FG_BUCKETS];
  fg_conn *conns;
  fg_conn *settling;  // answered, not in the epoll set yet
  int nconns, js_conns, max_conns;
  uint64_t idle_ms;
  gid_t gids[FG_MAX_GIDS];
  int ngids;
  double gets;
} fg_server;

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

static uint32_t fg_hash(const char *k) {
  uint32_t h = 2166136261u;
  for (; *k; k++) h = (h ^ (uint8_t)*k) * 16777619u;
  return h % FG_BUCKETS;
}

static fg_entry **fg_find(fg_server *s, const char *key) {
  fg_entry **p = &s->buckets[fg_hash(key)];
  while (*p && strcmp((*p)->key, key) != 0) p = &(*p)->next;
  return p;
}

static void fg_entry_free(fg_entry *e) {
  close_fds(e->fds, (size_t)e->nfds);
  free(e->reply);
  free(e);
}

// The header's key as the JS decoder reads it: trimmed at both ends.
static bool fg_header_key(const uint8_t *k, char out[FG_KEY + 1]) {
  size_t a = 0, b = FG_KEY;
  while (a < b && PROTO_KEY_TRIMMED(k[a])) a++;
  while (b > a && PROTO_KEY_TRIMMED(k[b - 1])) b--;
  if (a == b) return false;
  memcpy(out, k + a, b - a);
  out[b - a] = 0;
  return strlen(out) == b - a;  // an inner NUL: not a key we registered
}

static void fg_unsettle(fg_conn *c) {
  if (!c->settling) return;
  if (c->sprev) c->sprev->snext = c->snext;
  else c->srv->settling = c->snext;
  if (c->snext) c->snext->sprev = c->sprev;
  c->sprev = c->snext = NULL;
  c->settling = false;
}

static void fg_unlink_conn(fg_conn *c) {
  fg_server *s = c->srv;
  fg_unsettle(c);
  if (c->prev) c->prev->next = c->next;
  else s->conns = c->next;
  if (c->next) c->next->prev = c->prev;
  s->nconns--;
}

static void fg_close_conn(fg_conn *c) {
  fg_unlink_conn(c);
  // out of the epoll set before the close: a close takes a socket out only with its last reference, and a plugin
  // spawned a moment ago still holds one (exec releases the vfork parent before it closes the close-on-exec fds);
  // the set would go on reporting the socket with a pointer to freed memory
  if (c->polled) epoll_ctl(c->srv->epfd, EPOLL_CTL_DEL, c->fd, NULL);
  close(c->fd);
  free(c);
}

static void fg_call(fg_server *s, napi_ref fn, size_t argc, napi_value *argv) {
  napi_env env = s->env;
  napi_value cb, recv, result;
  if (napi_get_reference_value(env, fn, &cb) != napi_ok || napi_get_reference_value(env, s->self, &recv) != napi_ok)
    return;
  if (napi_make_callback(env, s->async, recv, cb, argc, argv, &result) != napi_ok) {
    bool pending = false;
    napi_is_exception_pending(env, &pending);
    if (pending) {
      napi_value exc;
      if (napi_get_and_clear_last_exception(env, &exc) == napi_ok) napi_fatal_exception(env, exc);
    }
  }
}

// Gives fd to JS: adopt(fd, bytes already read or null, peer {pid, uid, gid} or null, connections held here).
static void fg_adopt(fg_server *s, int fd, const uint8_t *prefix, size_t n, const struct ucred *cred) {
  napi_env env = s->env;
  napi_handle_scope scope;
  if (napi_open_handle_scope(env, &scope) != napi_ok) {
    close(fd);
    return;
  }
  napi_value argv[4];
  void *copy;
  bool ok = napi_create_int32(env, fd, &argv[0]) == napi_ok;
  if (ok && n > 0) ok = napi_create_buffer_copy(env, n, prefix, &copy, &argv[1]) == napi_ok;
  else if (ok) ok = napi_get_null(env, &argv[1]) == napi_ok;
  if (ok && cred) {
    napi_value v;
    ok = napi_create_object(env, &argv[2]) == napi_ok && napi_create_int32(env, (int32_t)cred->pid, &v) == napi_ok &&
         napi_set_named_property(env, argv[2], "pid", v) == napi_ok && napi_create_int64(env, (int64_t)cred->uid, &v) == napi_ok &&
         napi_set_named_property(env, argv[2], "uid", v) == napi_ok && napi_create_int64(env, (int64_t)cred->gid, &v) == napi_ok &&
         napi_set_named_property(env, argv[2], "gid", v) == napi_ok;
  } else if (ok) {
    ok = napi_get_null(env, &argv[2]) == napi_ok;
  }
  if (ok) ok = napi_create_int32(env, s->nconns, &argv[3]) == napi_ok;
  if (ok) fg_call(s, s->on_adopt, 4, argv);
  else close(fd);
  napi_close_handle_scope(env, scope);
}

// Hands a connection of ours to JS, with what it sent so far.
static void fg_handoff(fg_conn *c) {
  fg_server *s = c->srv;
  int fd = c->fd;
  uint8_t buf[FG_HDR];
  size_t n = c->have;
  struct ucred cred = c->cred;
  memcpy(buf, c->buf, n);
  fg_unlink_conn(c);
  if (c->polled) epoll_ctl(s->epfd, EPOLL_CTL_DEL, fd, NULL);  // JS watches it next
  free(c);
  fg_adopt(s, fd, buf, n, &cred);
}

static uint32_t fg_be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

// A complete header in c->buf: answered here (true), or false when JS must serve it.
static bool fg_serve(fg_conn *c) {
  fg_server *s = c->srv;
  const uint8_t *b = c->buf;
  char key[FG_KEY + 1];
  // a get without payload or fds, of a key JS registered. Anything else goes to JS: a get with a payload asks for more
  // queues ({"queues": N}), which the daemon opens in the pod netns; JS says what is wrong with the rest
  if (fg_be32(b + PROTO_OFF_MAGIC) != PROTO_MAGIC || b[PROTO_OFF_COMMAND] != PROTO_CMD_GET ||
      fg_be32(b + PROTO_OFF_DATA_SIZE) != 0 || fg_be32(b + PROTO_OFF_OOB_SIZE) != 0 || !fg_header_key(b + PROTO_OFF_KEY, key))
    return false;
  fg_entry *e = *fg_find(s, key);
  if (!e) return false;
  int outq = 0;  // nothing unread before the first answer
  if (c->served > 0 && (ioctl(c->fd, SIOCOUTQ, &outq) < 0 || outq > FG_OUTQ_MAX)) return false;
  ssize_t n;
  do n = send(c->fd, e->reply, FG_HDR, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;  // nothing sent: JS queues it
  if (n != FG_HDR) {
    fg_close_conn(c);  // gone, or a partial write the peer cannot make sense of
    return true;
  }
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * FG_MAX_FDS)];
  } ctl;
  memset(&ctl, 0, sizeof(ctl));
  struct iovec iov = {.iov_base = e->reply + FG_HDR, .iov_len = e->len - FG_HDR};
  struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
  if (e->nfds > 0) {
    msg.msg_control = ctl.buf;
    msg.msg_controllen = put_scm_rights(ctl.buf, e->fds, (size_t)e->nfds);
  }
  do n = sendmsg(c->fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n != (ssize_t)(e->len - FG_HDR)) {
    fg_close_conn(c);  // with 64 KB unread at most, 200 KB of socket buffer take a reply: the peer is gone
    return true;
  }
  s->gets++;
  c->served++;
  c->have = 0;
  c->last = uv_now(s->loop);
  return true;
}

// Reads what the peer sent and answers or hands over. True: c is still ours, with nothing more to read now.
static bool fg_conn_read(fg_conn *c) {
  ssize_t n;
  do n = recv(c->fd, c->buf + c->have, FG_HDR - c->have, MSG_DONTWAIT);
  while (n < 0 && errno == EINTR);
  if (n < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
    fg_close_conn(c);
    return false;
  }
  if (n == 0) {
    if (c->have == 0) fg_close_conn(c);  // a clean hang-up
    else fg_handoff(c);                 // EOF inside a header: JS says what was wrong
    return false;
  }
  c->have += (size_t)n;
  if (c->have < FG_HDR) {
    fg_handoff(c);
    return false;
  }
  struct fg_server *s = c->srv;
  uint64_t before = s->gets;
  if (!fg_serve(c)) {
    fg_handoff(c);
    return false;
  }
  return s->gets != before;  // answered (false: the send failed and c was closed)
}

// The epoll set has ready connections: each is read (level-triggered: what is left comes back next turn).
static void fg_events_cb(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  fg_server *s = h->data;
  struct epoll_event ev[64];
  int n;
  do n = epoll_wait(s->epfd, ev, 64, 0);
  while (n < 0 && errno == EINTR);
  for (int i = 0; i < n && s->active; i++) fg_conn_read(ev[i].data.ptr);  // a stop from JS ends the batch
}

// Puts c in the epoll set (handed to JS if that fails).
static void fg_watch(fg_conn *c) {
  struct epoll_event e = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = c};
  if (epoll_ctl(c->srv->epfd, EPOLL_CTL_ADD, c->fd, &e) < 0) {
    fg_handoff(c);
    return;
  }
  c->polled = true;
}

// Reads every settling connection: a hang-up closes it, a request is served, silence puts it in the epoll set.
static void fg_settle_cb(uv_timer_t *t) {
  fg_server *s = t->data;
  while (s->settling && s->active) {
    fg_conn *c = s->settling;
    fg_unsettle(c);
    if (fg_conn_read(c)) fg_watch(c);
  }
}

// src/protocol/peer.ts allowedByCred: the part of the peer rule the credentials decide.
static bool fg_peer_allowed(fg_server *s, const struct ucred *cr) {
  if (cr->uid == 0) return true;
  for (int i = 0; i < s->ngids; i++)
    if (s->gids[i] == cr->gid) return true;
  return false;  // JS reads the supplementary groups: it serves or refuses
}

static void fg_accept_cb(uv_poll_t *h, int status, int events) {
  (void)events;
  fg_server *s = h->data;
  if (!s->active) return;
  napi_env env = s->env;
  if (status < 0) {
    napi_handle_scope scope;
    if (napi_open_handle_scope(env, &scope) != napi_ok) return;
    napi_value err = errno_error(env, -status, "poll of the listening socket");
    if (err) fg_call(s, s->on_error, 1, &err);
    napi_close_handle_scope(env, scope);
    return;
  }
  // one accept per wake-up, as the JS server: the poll is level-triggered, so no accept ends in EAGAIN
  int fd;
  do fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED) return;
    int err = errno;
    napi_handle_scope scope;
    if (napi_open_handle_scope(env, &scope) != napi_ok) return;
    napi_value jerr = errno_error(env, err, "accept");
    if (jerr) fg_call(s, s->on_error, 1, &jerr);  // EMFILE: JS's reserve fd takes the newcomer and closes it
    napi_close_handle_scope(env, scope);
    return;
  }
  struct ucred cr;
  socklen_t len = sizeof(cr);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0 || !fg_peer_allowed(s, &cr) ||
      s->nconns + s->js_conns >= s->max_conns) {
    fg_adopt(s, fd, NULL, 0, NULL);
    return;
  }
  fg_conn *c = calloc(1, sizeof(*c));
  if (!c) {
    fg_adopt(s, fd, NULL, 0, NULL);
    return;
  }
  c->srv = s;
  c->fd = fd;
  c->cred = cr;
  c->last = uv_now(s->loop);
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  s->nconns++;
  // the request is usually there already (a client writes it right after connect): answered now; then the settling
  // list, or (nothing came yet) the epoll set, waits for the next request or the hang-up
  if (!fg_conn_read(c)) return;  // answered and closed, or handed over
  if (c->served > 0 && c->have == 0) {
    c->snext = s->settling;
    if (s->settling) s->settling->sprev = c;
    s->settling = c;
    c->settling = true;
    if (!uv_is_active((uv_handle_t *)&s->settle)) uv_timer_start(&s->settle, fg_settle_cb, FG_SETTLE_MS, 0);
    return;
  }
  fg_watch(c);
}

// Closes connections that sent nothing for idle_ms (JS's idle rule for its own connections).
static void fg_sweep_cb(uv_timer_t *t) {
  fg_server *s = t->data;
  uint64_t now = uv_now(t->loop);
  for (fg_conn *c = s->conns, *next; c; c = next) {
    next = c->next;
    if (now - c->last >= s->idle_ms) fg_close_conn(c);
  }
}

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

