// The fast get server's loop: the fd server's accept loop in C, answering gets of registered keys without entering
// JS (its JS object is fastget_js.c; typed in src/native.ts). The protocol's constants come from native/protocol.h,
// generated from src/protocol; which frames it answers and which it hands to JS is held to the TS codec by
// test/unit/fastget-frames.test.ts.
#include "fastget.h"

// The fd server's accept loop, in C on the event loop's thread. Each wake-up of the listening socket takes up to
// FG_ACCEPTS_PER_WAKE connections while they stay here. Connections are watched by an epoll set of ours, itself watched
// by one uv_poll (libuv's own poll per fd costs five syscalls per connection). A connection from uid 0 (or a primary
// gid of allowedGids) stays here while it sends complete get requests of keys JS registered (the reply bytes and dup's
// of the fds, per key): each is answered with one send of the header and one sendmsg of the payload with the fds,
// without entering JS. Anything else is handed to JS (adopt) with the bytes read so far: another command, a key not
// registered, a partial or bad header, a peer that needs JS's checks, a socket whose peer is not reading, the
// connection limit. The only JS calls are adopt and accept errors; register/unregister run on the same thread, so a key
// unregistered is never answered again.
//
// A connection answered right after its accept is not put in the epoll set at once: it waits on a "settling" list,
// and a timer reads each such connection FG_SETTLE_MS later, when its client has almost always hung up (vmwrapper
// reads its one reply and exits). The hang-up then costs one recv and the close, not an epoll_ctl ADD, a wake-up, an
// epoll_wait and a DEL. A connection still open then (EAGAIN) joins the epoll set; one that sent more is served then:
// a second request on a connection whose first was a get waits at most FG_SETTLE_MS.

static uint32_t fg_hash(const char *k) {
  uint32_t h = 2166136261u;
  for (; *k; k++) h = (h ^ (uint8_t)*k) * 16777619u;
  return h % FG_BUCKETS;
}

fg_entry **fg_find(fg_server *s, const char *key) {
  fg_entry **p = &s->buckets[fg_hash(key)];
  while (*p && strcmp((*p)->key, key) != 0) p = &(*p)->next;
  return p;
}

void fg_entry_free(fg_entry *e) {
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

void fg_close_conn(fg_conn *c) {
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
  s->adoptions++;
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
void fg_events_cb(uv_poll_t *h, int status, int events) {
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

// Reports an error of the listening socket to JS.
static void fg_listen_error(fg_server *s, int err, const char *what) {
  napi_handle_scope scope;
  if (napi_open_handle_scope(s->env, &scope) != napi_ok) return;
  napi_value jerr = errno_error(s->env, err, what);
  if (jerr) fg_call(s, s->on_error, 1, &jerr);
  napi_close_handle_scope(s->env, scope);
}

// Takes in a connection the peer rule lets stay here: answered at once when its request is there already (a client
// writes it right after connect), then the settling list, or (nothing came yet) the epoll set, waits for the next
// request or the hang-up.
static void fg_take(fg_server *s, int fd, const struct ucred *cr) {
  fg_conn *c = calloc(1, sizeof(*c));
  if (!c) {
    fg_adopt(s, fd, NULL, 0, NULL);
    return;
  }
  c->srv = s;
  c->fd = fd;
  c->cred = *cr;
  c->last = uv_now(s->loop);
  c->next = s->conns;
  if (s->conns) s->conns->prev = c;
  s->conns = c;
  s->nconns++;
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

// Accepts one connection: false when none is waiting, or the accept failed (JS has the error).
static bool fg_accept_one(fg_server *s) {
  int fd;
  do fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    // EMFILE: JS's reserve fd takes the newcomer and closes it
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED) fg_listen_error(s, errno, "accept");
    return false;
  }
  struct ucred cr;
  socklen_t len = sizeof(cr);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0 || !fg_peer_allowed(s, &cr) ||
      s->nconns + s->js_conns >= s->max_conns)
    fg_adopt(s, fd, NULL, 0, NULL);
  else
    fg_take(s, fd, &cr);
  return true;
}

// The listening socket is readable: up to FG_ACCEPTS_PER_WAKE connections are taken in this turn of the loop (under
// load several gets wait, and each one more saves a turn; the poll is level-triggered, so what is left wakes it
// again). A connection handed to JS ends the batch: its request runs first, and the loop turns before the next.
void fg_accept_cb(uv_poll_t *h, int status, int events) {
  (void)events;
  fg_server *s = h->data;
  if (!s->active) return;
  if (status < 0) {
    fg_listen_error(s, -status, "poll of the listening socket");
    return;
  }
  uint64_t adoptions = s->adoptions;
  int taken = 0;
  while (taken < FG_ACCEPTS_PER_WAKE && s->active && s->adoptions == adoptions && fg_accept_one(s)) taken++;
}

// Closes connections that sent nothing for idle_ms (JS's idle rule for its own connections).
void fg_sweep_cb(uv_timer_t *t) {
  fg_server *s = t->data;
  uint64_t now = uv_now(t->loop);
  for (fg_conn *c = s->conns, *next; c; c = next) {
    next = c->next;
    if (now - c->last >= s->idle_ms) fg_close_conn(c);
  }
}
