// The get baseline: a minimal server that answers every request with the same bytes and the same fds as
// tapmanager's reply to a get (captured once by `get-client capture`). Single thread, blocking accept:
// accept, read the 77-byte header, write the header, sendmsg the payload with the fds (SCM_RIGHTS), close.
//   fd-echo-server SOCKET REPLYFILE NFDS     prints "ready" on stdout once listening; SIGTERM ends it
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define HDR 77

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: fd-echo-server SOCKET REPLYFILE NFDS\n");
    return 2;
  }
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
    }
    close(c);
  }
}
