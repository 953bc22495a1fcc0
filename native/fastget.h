// The fast get server's shared parts: its limits, the key table's entries, a connection, the server; what
// fastget.c (the accept loop, the reads and answers) and fastget_js.c (the JS object, its methods) offer each other.
#pragma once

#include "common.h"
#include "protocol.h"

#define FG_HDR PROTO_HEADER_SIZE
#define FG_KEY PROTO_KEY_SIZE
#define FG_BUCKETS 256
#define FG_MAX_FDS 16
#define FG_MAX_GIDS 64
#define FG_SETTLE_MS 1         // how long an answered connection waits before its hang-up is looked for
#define FG_OUTQ_MAX 65536      // bytes the peer has not read yet, beyond which JS (with its write queue) serves
#define FG_ACCEPTS_PER_WAKE 8  // connections taken per wake-up of the listening socket

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
  uint64_t adoptions;  // connections handed to JS since the start
} fg_server;

// fastget.c
fg_entry **fg_find(fg_server *s, const char *key);
void fg_entry_free(fg_entry *e);
void fg_close_conn(fg_conn *c);
void fg_accept_cb(uv_poll_t *h, int status, int events);
void fg_events_cb(uv_poll_t *h, int status, int events);
void fg_sweep_cb(uv_timer_t *t);
