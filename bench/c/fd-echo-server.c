// The get baseline: a minimal server that answers every request with the same bytes and the same fds as
// tapmanager's reply to a get (captured once by `get-client capture`). Single thread, blocking accept:
// accept, read the 77-byte header, write the header, sendmsg the payload with the fds (SCM_RIGHTS), close.
//   fd-echo-server SOCKET REPLYFILE NFDS [hold]    prints "ready" on stdout once listening; SIGTERM ends it
// hold: what the protocol makes any server do after a get (a connection carries requests until its peer's EOF): the
// answered connection is kept, and read 1 ms later (the EOF: closed; nothing yet: kept another 1 ms); the accept
// waits in poll, with a 1 ms timeout while connections are kept.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define HDR 77
#define KEPT 4096  // connections held at once in hold mode (a ring)

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

// hold mode's ring: connections answered, oldest first
static int kept[KEPT];
static long long kept_at[KEPT];
static int head, tail;

// Keeps c on the ring since `at`; false when the ring is full (the caller closes it).
static int keep(int c, long long at) {
  if ((tail + 1) % KEPT == head) return 0;
  kept[tail] = c;
  kept_at[tail] = at;
  tail = (tail + 1) % KEPT;
  return 1;
}

// Reads every kept connection 1 ms old: the EOF (or an error, or a request this server does not expect) closes it,
// nothing yet keeps it another 1 ms.
static void read_kept(void) {
  long long now = now_ns();
  while (head != tail && now - kept_at[head] >= 1000000) {
    int c = kept[head];
    head = (head + 1) % KEPT;
    char b;
    if (!(recv(c, &b, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN && keep(c, now))) close(c);
  }
}

int main(int argc, char **argv) {
  if (argc != 4 && !(argc == 5 && strcmp(argv[4], "hold") == 0)) {
    fprintf(stderr, "usage: fd-echo-server SOCKET REPLYFILE NFDS [hold]\n");
    return 2;
  }
  int hold = argc == 5;
  static unsigned char reply[1 << 20];
  FILE *f = fopen(argv[2], "r");
  if (!f) return perror("reply file"), 1;
  size_t len = fread(reply, 1, sizeof reply, f);
  fclose(f);
  if (len < HDR) return fprintf(stderr, "fd-echo-server: reply shorter than a header\n"), 1;
  int nfds = atoi(argv[3]);
  int fds[16];
  if (nfds < 0 || nfds > 16) return 2;
  for (int i = 0; i < nfds; i++) fds[i] = open("/dev/null", O_RDWR | O_CLOEXEC);
  char cbuf[CMSG_SPACE(sizeof fds)];
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  strncpy(a.sun_path, argv[1], sizeof a.sun_path - 1);
  unlink(argv[1]);
  if (bind(s, (struct sockaddr *)&a, sizeof a) < 0 || listen(s, 512) < 0) return perror("bind/listen"), 1;
  signal(SIGPIPE, SIG_IGN);
  printf("ready\n");
  fflush(stdout);
  unsigned char hdr[HDR];
  for (;;) {
    if (hold) {
      read_kept();
      struct pollfd p = {.fd = s, .events = POLLIN};
      if (poll(&p, 1, head != tail ? 1 : -1) <= 0) continue;
    }
    int c = accept4(s, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR) continue;
      return perror("accept"), 1;
    }
    if (recv(c, hdr, HDR, MSG_WAITALL) == HDR) {
      send(c, reply, HDR, MSG_NOSIGNAL);
      struct iovec iov = {.iov_base = reply + HDR, .iov_len = len - HDR};
      struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
      if (nfds > 0) {
        m.msg_control = cbuf;
        m.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
        struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
        memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
      }
      sendmsg(c, &m, MSG_NOSIGNAL);
      if (hold && keep(c, now_ns())) continue;
    }
    close(c);
  }
}
