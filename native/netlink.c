// Netlink in a netns: a batch of rtnetlink requests, persistent taps, nf_tables transactions and sysctls, run in
// order on a pool thread (or, with offLoop false, the event loop's thread) inside the netns (netlinkInNetns).

#include "common.h"

// ---------------------------------------------------------------------------------------------
// rtnetlink in a netns
//
// netlinkInNetns(nsPath, requests, force, offLoop = true) runs a batch of requests in the netns at nsPath on a libuv
// pool thread, or with offLoop false on the calling thread (the promise settled before the call returns: no pool
// thread to wake, for a batch the caller would only wait for): the thread enters the netns, opens a NETLINK_ROUTE
// socket there, runs the requests in order, and goes back to its own netns. A request (integers in host order;
// src/net/rtnl.ts builds them):
//   u32 kind, u32 body length, body
//   kind 0, a netlink message: u32 n; n x { u32 offset; char name[16] }: the ifindex of link `name` (in the netns)
//           goes in as a u32 at `offset` of the message, which follows. Its answer: an ACK, or a dump's messages up
//           to NLMSG_DONE.
//   kind 1, a persistent tap: char name[16]; u32 flags (IFF_*): TUNSETIFF, then TUNSETPERSIST, as `ip tuntap add`.
//   kind 2, an nf_tables transaction: the messages from NFNL_MSG_BATCH_BEGIN to NFNL_MSG_BATCH_END, sent at once
//           on a NETLINK_NETFILTER socket in the netns (all of it is committed, or none).
//   kind 3, sysctls: "name=value" lines (16 at most), written to /proc/sys in the netns (sysctl.c).
// The answer, per request that ran: i32 errno (0: done), u32 data length, u32 text length, the data (a dump's
// messages), the text (on a failure: strerror, then the kernel's extended ack or what failed). Without force the
// batch stops at the first failure, as `ip -batch` does; with force every request runs, as `ip -force -batch`.

#define NL_RECV_BYTES (64 * 1024)
#define NL_MAX_BATCH (4 * 1024 * 1024)
#define NL_TIMEOUT_S 15

typedef struct {
  napi_async_work work;
  napi_deferred deferred;
  char *ns_path;
  uint8_t *req;
  size_t req_len;
  bool force;
  uint8_t *out;
  size_t out_len, out_cap;
  int err;  // the whole call failed (netns, socket, memory): what says why
  char what[320];
} nl_batch_t;

static bool nl_put(nl_batch_t *w, const void *p, size_t n) {
  if (w->out_len + n > w->out_cap) {
    size_t cap = w->out_cap ? w->out_cap : 4096;
    while (cap < w->out_len + n) cap *= 2;
    uint8_t *o = realloc(w->out, cap);
    if (!o) return false;
    w->out = o, w->out_cap = cap;
  }
  memcpy(w->out + w->out_len, p, n);
  w->out_len += n;
  return true;
}

// The text of NLMSGERR_ATTR_MSG in an error or done message (capped acks: the TLVs follow struct nlmsgerr).
static void nl_extack(const struct nlmsghdr *m, size_t skip, char *text, size_t cap) {
  if (!(m->nlmsg_flags & NLM_F_ACK_TLVS) || m->nlmsg_len < NLMSG_HDRLEN + skip) return;
  const uint8_t *p = (const uint8_t *)NLMSG_DATA(m) + skip, *end = (const uint8_t *)m + m->nlmsg_len;
  while (p + sizeof(struct nlattr) <= end) {
    const struct nlattr *a = (const void *)p;
    if (a->nla_len < sizeof(*a) || p + a->nla_len > end) return;
    if ((a->nla_type & NLA_TYPE_MASK) == NLMSGERR_ATTR_MSG) {
      snprintf(text, cap, "%.*s", (int)(a->nla_len - sizeof(*a)), (const char *)(a + 1));
      size_t l = strlen(text);
      while (l > 0 && (text[l - 1] == '\n' || text[l - 1] == '\0')) text[--l] = '\0';
      return;
    }
    p += NLA_ALIGN(a->nla_len);
  }
}

// Sends one message and reads its answer, appending a dump's messages to the output. Returns 0 or an errno.
static int nl_exchange(int sock, uint8_t *msg, size_t len, uint32_t seq, uint8_t *buf, nl_batch_t *w, char *text, size_t tcap) {
  struct nlmsghdr *h = (struct nlmsghdr *)msg;
  if (len < NLMSG_HDRLEN || h->nlmsg_len != len) {
    snprintf(text, tcap, "malformed netlink request (%zu bytes, header says %u)", len, len >= NLMSG_HDRLEN ? h->nlmsg_len : 0);
    return EINVAL;
  }
  bool dump = (h->nlmsg_flags & NLM_F_DUMP) == NLM_F_DUMP;
  h->nlmsg_flags |= NLM_F_REQUEST | (dump ? 0 : NLM_F_ACK);
  h->nlmsg_seq = seq;
  h->nlmsg_pid = 0;
  ssize_t n;
  do n = send(sock, msg, len, 0);
  while (n < 0 && errno == EINTR);
  if (n < 0) return snprintf(text, tcap, "send"), errno;
  for (;;) {
    struct iovec iov = {buf, NL_RECV_BYTES};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    do n = recvmsg(sock, &mh, 0);
    while (n < 0 && errno == EINTR);
    if (n < 0) {
      int err = errno == EAGAIN ? ETIMEDOUT : errno;
      snprintf(text, tcap, "no answer from the kernel");
      return err;
    }
    if (mh.msg_flags & MSG_TRUNC) return snprintf(text, tcap, "answer larger than %d bytes", NL_RECV_BYTES), EMSGSIZE;
    size_t left = (size_t)n;
    for (struct nlmsghdr *m = (struct nlmsghdr *)buf; NLMSG_OK(m, left); m = NLMSG_NEXT(m, left)) {
      if (m->nlmsg_seq != seq) continue;
      if (m->nlmsg_type == NLMSG_ERROR || m->nlmsg_type == NLMSG_DONE) {
        int code = 0;
        if (m->nlmsg_len >= NLMSG_HDRLEN + sizeof(int)) code = -*(const int *)NLMSG_DATA(m);
        nl_extack(m, m->nlmsg_type == NLMSG_ERROR ? sizeof(struct nlmsgerr) : sizeof(int), text, tcap);
        return code;
      }
      if (dump && !nl_put(w, m, NLMSG_ALIGN(m->nlmsg_len) <= left ? NLMSG_ALIGN(m->nlmsg_len) : m->nlmsg_len)) return ENOMEM;
    }
  }
}

// `ip tuntap add dev <name> mode tap [vnet_hdr]`: a persistent tap, no fd kept.
static int nl_tap(const uint8_t *body, size_t len, char *text, size_t tcap) {
  if (len != IFNAMSIZ + 4) return snprintf(text, tcap, "malformed tap request"), EINVAL;
  struct ifreq ifr;
  memset(&ifr, 0, sizeof(ifr));
  memcpy(ifr.ifr_name, body, IFNAMSIZ - 1);
  uint32_t flags;
  memcpy(&flags, body + IFNAMSIZ, 4);
  ifr.ifr_flags = (short)flags;
  int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC), err = 0;
  if (fd < 0) return snprintf(text, tcap, "open /dev/net/tun"), errno;
  if (ioctl(fd, TUNSETIFF, &ifr) < 0) err = errno, snprintf(text, tcap, "ioctl(TUNSETIFF) %s", ifr.ifr_name);
  else if (ioctl(fd, TUNSETPERSIST, 1) < 0) err = errno, snprintf(text, tcap, "ioctl(TUNSETPERSIST) %s", ifr.ifr_name);
  close(fd);
  return err;
}

// An nf_tables transaction (kind 2): the batch (BATCH_BEGIN .. BATCH_END, each message asking for an ACK) goes in one
// send on a NETLINK_NETFILTER socket in the netns; the kernel runs it during the send and commits all of it or none,
// so its answers are queued by the time send returns: read them without waiting, the first error is the answer.
static int nl_netfilter(int *nfsock, uint8_t *body, size_t len, uint8_t *buf, char *text, size_t tcap) {
  if (*nfsock < 0) {
    int one = 1;
    *nfsock = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
    if (*nfsock < 0) return snprintf(text, tcap, "socket(NETLINK_NETFILTER)"), errno;
    setsockopt(*nfsock, SOL_NETLINK, NETLINK_CAP_ACK, &one, sizeof(one));
    setsockopt(*nfsock, SOL_NETLINK, NETLINK_EXT_ACK, &one, sizeof(one));
  }
  ssize_t n;
  do n = send(*nfsock, body, len, 0);
  while (n < 0 && errno == EINTR);
  if (n < 0) return snprintf(text, tcap, "send"), errno;
  int first = 0;
  for (;;) {
    do n = recv(*nfsock, buf, NL_RECV_BYTES, MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    if (n < 0) return errno == EAGAIN ? first : (snprintf(text, tcap, "recv"), errno);
    size_t left = (size_t)n;
    for (struct nlmsghdr *m = (struct nlmsghdr *)buf; NLMSG_OK(m, left); m = NLMSG_NEXT(m, left)) {
      if (m->nlmsg_type != NLMSG_ERROR || m->nlmsg_len < NLMSG_HDRLEN + sizeof(int) || first) continue;
      first = -*(const int *)NLMSG_DATA(m);
      if (first) nl_extack(m, sizeof(struct nlmsgerr), text, tcap);
    }
  }
}

// Sysctls (kind 3): "name=value" lines, as netnsMake takes them, written in this thread's netns (the pod's).
static int nl_sysctl(const uint8_t *body, size_t len, char *text, size_t tcap) {
  char copy[4096];
  char *settings[17];
  size_t n = 0;
  if (len == 0 || len >= sizeof(copy)) return snprintf(text, tcap, "malformed sysctl request"), EINVAL;
  memcpy(copy, body, len);
  copy[len] = '\0';
  for (char *save = NULL, *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    if (n == 16) return snprintf(text, tcap, "more than 16 sysctls in one request"), EINVAL;
    settings[n++] = line;
  }
  settings[n] = NULL;
  const char *bad = sysctl_bad_setting(settings);
  if (bad) return snprintf(text, tcap, "setting \"%s\" is not name=value with a name of [a-z0-9_.-]", bad), EINVAL;
  const char *failed = NULL;
  int err = sysctl_write_all(settings, &failed);
  if (err) snprintf(text, tcap, "sysctl -w %s", failed);
  return err;
}

// One request (kind, body); 0 or an errno, with text saying what.
static int nl_request(int sock, int *nfsock, uint32_t kind, uint8_t *body, size_t len, uint32_t seq, uint8_t *buf, nl_batch_t *w, char *text, size_t tcap) {
  if (kind == 1) return nl_tap(body, len, text, tcap);
  if (kind == 2) return nl_netfilter(nfsock, body, len, buf, text, tcap);
  if (kind == 3) return nl_sysctl(body, len, text, tcap);
  if (kind != 0 || len < 4) return snprintf(text, tcap, "unknown request kind %u", kind), EINVAL;
  uint32_t nfix;
  memcpy(&nfix, body, 4);
  size_t fixes = 4 + (size_t)nfix * (4 + IFNAMSIZ);
  if (nfix > 16 || fixes > len) return snprintf(text, tcap, "malformed fixups"), EINVAL;
  uint8_t *msg = body + fixes;
  size_t mlen = len - fixes;
  for (uint32_t i = 0; i < nfix; i++) {
    uint32_t off;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    memcpy(&off, body + 4 + i * (4 + IFNAMSIZ), 4);
    memcpy(ifr.ifr_name, body + 8 + i * (4 + IFNAMSIZ), IFNAMSIZ - 1);
    if (off + 4 > mlen) return snprintf(text, tcap, "fixup outside the message"), EINVAL;
    // an ioctl on any socket looks the name up in the socket's netns
    if (ioctl(sock, SIOCGIFINDEX, &ifr) < 0) return snprintf(text, tcap, "Cannot find device \"%s\"", ifr.ifr_name), errno;
    uint32_t idx = (uint32_t)ifr.ifr_ifindex;
    memcpy(msg + off, &idx, 4);
  }
  return nl_exchange(sock, msg, mlen, seq, buf, w, text, tcap);
}

// The requests, in the netns (this pool thread is in it).
static void nl_run_all(nl_batch_t *w, int sock, uint8_t *buf) {
  int nfsock = -1;
  for (size_t at = 0, seq = 1; at < w->req_len; seq++) {
    char text[256] = "";
    int32_t head[3] = {0, 0, 0};
    size_t mark = w->out_len;
    uint32_t kind = 0, len = 0;
    if (!nl_put(w, head, sizeof(head))) goto oom;
    bool whole = w->req_len - at >= 8;
    if (whole) memcpy(&kind, w->req + at, 4), memcpy(&len, w->req + at + 4, 4);
    whole = whole && len <= w->req_len - at - 8;
    int err = whole ? nl_request(sock, &nfsock, kind, w->req + at + 8, len, (uint32_t)seq, buf, w, text, sizeof(text))
                    : (snprintf(text, sizeof(text), "truncated request"), EINVAL);
    if (err) {
      // a failed dump gives no data; the text starts with strerror, as iproute2 says "RTNETLINK answers: <strerror>"
      char sbuf[128], full[sizeof(text)];
      w->out_len = mark + sizeof(head);
      snprintf(full, sizeof(full), "%s%s%s", strerror_r(err, sbuf, sizeof(sbuf)), text[0] ? ": " : "", text);
      memcpy(text, full, sizeof(text));
    }
    head[0] = err;
    head[1] = (int32_t)(w->out_len - mark - sizeof(head));
    head[2] = (int32_t)strlen(text);
    if (!nl_put(w, text, strlen(text))) goto oom;
    memcpy(w->out + mark, head, sizeof(head));
    if (!whole || (err && !w->force)) break;
    at += 8 + len;
  }
  if (nfsock >= 0) close(nfsock);
  return;
oom:
  if (nfsock >= 0) close(nfsock);
  w->err = ENOMEM;
  snprintf(w->what, sizeof(w->what), "netlinkInNetns %s: answer", w->ns_path);
}

static void nl_batch_execute(napi_env env, void *data) {
  (void)env;
  nl_batch_t *w = data;
  const char *step = NULL;
  int orig = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
  int target = orig < 0 ? -1 : open(w->ns_path, O_RDONLY | O_CLOEXEC);
  uint8_t *buf = malloc(NL_RECV_BYTES);
  if (orig < 0) w->err = errno, step = "open /proc/thread-self/ns/net";
  else if (target < 0) w->err = errno, step = "open the netns";
  else if (!buf) w->err = ENOMEM, step = "memory";
  else if (setns(target, CLONE_NEWNET) < 0) w->err = errno, step = "setns";
  else {
    int sock = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (sock < 0) {
      w->err = errno, step = "socket(AF_NETLINK)";
    } else {
      int one = 1;
      struct timeval tv = {NL_TIMEOUT_S, 0};
      setsockopt(sock, SOL_NETLINK, NETLINK_CAP_ACK, &one, sizeof(one));
      setsockopt(sock, SOL_NETLINK, NETLINK_EXT_ACK, &one, sizeof(one));
      setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      nl_run_all(w, sock, buf);
      close(sock);
    }
    // a pool thread left in the pod's netns would run later work there: abort rather than go on
    if (setns(orig, CLONE_NEWNET) < 0) {
      fprintf(stderr, "vmpod_native: setns back from %s failed: %s; aborting\n", w->ns_path, strerror(errno));
      abort();
    }
  }
  if (step) snprintf(w->what, sizeof(w->what), "netlinkInNetns %s: %s", w->ns_path, step);
  free(buf);
  if (target >= 0) close(target);
  if (orig >= 0) close(orig);
}

static void nl_batch_free(nl_batch_t *w) {
  free(w->ns_path);
  free(w->req);
  free(w->out);
  free(w);
}

// Settles the promise with the answers (or the error) and frees w; status: the pool work's (napi_ok on the loop).
static void nl_batch_settle(napi_env env, napi_status status, nl_batch_t *w) {
  napi_value v = NULL;
  if (status != napi_ok && !w->err) w->err = ECANCELED, snprintf(w->what, sizeof(w->what), "netlinkInNetns %s: cancelled", w->ns_path);
  if (!w->err && napi_create_buffer_copy(env, w->out_len, w->out_len ? w->out : (const void *)"", NULL, &v) != napi_ok)
    w->err = ENOMEM, snprintf(w->what, sizeof(w->what), "netlinkInNetns %s: answer buffer", w->ns_path);
  settle_promise(env, w->deferred, w->err, w->what, v);
  nl_batch_free(w);
}

static void nl_batch_complete(napi_env env, napi_status status, void *data) {
  nl_batch_t *w = data;
  napi_delete_async_work(env, w->work);
  nl_batch_settle(env, status, w);
}

napi_value js_netlinkInNetns(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  napi_valuetype t;
  bool off_loop = true;
  if (!get_args(env, info, 4, argv, "netlinkInNetns")) return NULL;
  if (napi_typeof(env, argv[3], &t) != napi_ok) return throw_napi(env, "napi_typeof failed");
  if (t != napi_undefined && !get_bool(env, argv[3], "netlinkInNetns", "offLoop", &off_loop)) return NULL;
  nl_batch_t *w = calloc(1, sizeof(*w));
  if (!w) return throw_errno(env, ENOMEM, "netlinkInNetns");
  const uint8_t *data;
  size_t len;
  napi_value promise = NULL;
  w->ns_path = get_string(env, argv[0], "netlinkInNetns", "nsPath");
  if (!w->ns_path || !get_bytes(env, argv[1], "netlinkInNetns", "requests", &data, &len) ||
      !get_bool(env, argv[2], "netlinkInNetns", "force", &w->force))
    goto fail;
  if (w->ns_path[0] != '/' || len > NL_MAX_BATCH) {
    throw_type(env, "netlinkInNetns: nsPath must be absolute and requests at most %d bytes", NL_MAX_BATCH);
    goto fail;
  }
  w->req = malloc(len ? len : 1);
  if (!w->req) {
    throw_errno(env, ENOMEM, "netlinkInNetns");
    goto fail;
  }
  memcpy(w->req, data, len);
  w->req_len = len;
  if (off_loop) {
    promise = queue_promise(env, "vmpod.netlinkInNetns", nl_batch_execute, nl_batch_complete, w, &w->work, &w->deferred);
    if (promise) return promise;
    goto fail;
  }
  if (napi_create_promise(env, &w->deferred, &promise) != napi_ok) {
    throw_napi(env, "napi_create_promise failed");
    goto fail;
  }
  nl_batch_execute(env, w);
  nl_batch_settle(env, napi_ok, w);
  return promise;
fail:
  nl_batch_free(w);
  return NULL;
}
