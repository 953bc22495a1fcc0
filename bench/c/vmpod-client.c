// The client side of the benchmarks, the same for tapmanager and for the baselines: Virtlet's protocol
// (docs/protocol.md), a new connection per request as vmwrapper and a CRI runtime make it. C, so that the client's
// own cost is the same small constant on both sides.
//   vmpod-client loop SOCKET KEY N OUTFILE      N gets in a row; each latency (us) as a line of OUTFILE
//   vmpod-client capture SOCKET KEY OUTFILE     one get; the reply's bytes (header + payload) to OUTFILE
//   vmpod-client add|release SOCKET PAR OUTFILE KEY...
//       one add (or release) per KEY, PAR worker processes at once; each latency (us) a line of OUTFILE.<worker>;
//       prints the wall time of the whole set (us)
//   vmpod-client restart SOCKET KEY... -- DAEMON_ARGV...
//       forks and execs the daemon (its PID is printed), connects as soon as the socket takes a connection, and
//       times the first answer (any reply, to a get of the first KEY) and the time until every KEY answered a get
//       with its fds (a key that gets an error reply is asked again, for up to 20 s)
// Every received fd is checked (fstat) and closed. Exit 1 with the reason on stderr on any failure.
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HDR 77
#define KEYSZ 64

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static pid_t daemon_pid = -1;

static void die(const char *what) {
  fprintf(stderr, "vmpod-client: %s: %s\n", what, errno ? strerror(errno) : "protocol");
  if (daemon_pid > 0) kill(daemon_pid, SIGTERM); // restart: never leave the daemon we started behind
  exit(1);
}

static uint32_t be32(const unsigned char *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

static unsigned char reply[1 << 20];

static int dial(const char *sock) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) die("socket");
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  strncpy(a.sun_path, sock, sizeof a.sun_path - 1);
  if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// one request on connected fd; returns the reply's command byte, the reply (header + payload) in reply[],
// its length in *len; received fds are checked and closed
static int exchange(int fd, int cmd, const char *key, const char *payload, size_t *len) {
  unsigned char req[HDR];
  size_t plen = payload ? strlen(payload) : 0;
  memset(req, 0, sizeof req);
  req[0] = req[1] = req[2] = req[3] = 0x42;
  req[4] = (unsigned char)cmd;
  req[5] = plen >> 24, req[6] = plen >> 16, req[7] = plen >> 8, req[8] = plen;
  memset(req + 13, ' ', KEYSZ);
  memcpy(req + 13, key, strlen(key));
  if (send(fd, req, HDR, MSG_NOSIGNAL) != HDR) die("send");
  if (plen && send(fd, payload, plen, MSG_NOSIGNAL) != (ssize_t)plen) die("send payload");
  if (recv(fd, reply, HDR, MSG_WAITALL) != HDR) die("recv header");
  errno = 0;
  if (be32(reply) != 0x42424242) die("bad magic in the reply");
  uint32_t dsz = be32(reply + 5), oob = be32(reply + 9);
  if (dsz > sizeof reply - HDR || oob > 4096) die("reply too large");
  size_t got = 0;
  if (dsz > 0 || oob > 0) {
    char cbuf[4096];
    struct iovec iov = {.iov_base = reply + HDR, .iov_len = dsz ? dsz : 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = oob ? cbuf : NULL, .msg_controllen = oob};
    ssize_t n = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
    if (n <= 0) die("recvmsg payload");
    got = (size_t)n;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      int nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      int *fds = (int *)CMSG_DATA(c);
      for (int i = 0; i < nfd; i++) {
        struct stat st;
        if (fstat(fds[i], &st) < 0) die("fstat received fd");
        close(fds[i]);
      }
    }
    while (got < dsz) {
      ssize_t r = recv(fd, reply + HDR + got, dsz - got, 0);
      if (r <= 0) die("recv payload");
      got += (size_t)r;
    }
  }
  if (len) *len = HDR + dsz;
  return reply[4];
}

static int request(const char *sock, int cmd, const char *key, const char *payload, size_t *len) {
  int fd = dial(sock);
  if (fd < 0) die("connect");
  int r = exchange(fd, cmd, key, payload, len);
  close(fd);
  return r;
}

static int set_op(const char *op, const char *sock, int par, const char *out, int nkeys, char **keys) {
  int cmd = strcmp(op, "add") == 0 ? 0 : 1;
  double t0 = now_us();
  for (int w = 0; w < par; w++) {
    pid_t p = fork();
    if (p < 0) die("fork");
    if (p > 0) continue;
    char path[4096];
    snprintf(path, sizeof path, "%s.%d", out, w);
    FILE *f = fopen(path, "w");
    if (!f) die("open out");
    for (int i = w; i < nkeys; i += par) {
      char payload[512];
      snprintf(payload, sizeof payload, "{\"podNetworkDesc\":{\"podId\":\"%s\",\"podNs\":\"bench\",\"podName\":\"%s\",\"DNS\":null}}", keys[i], keys[i]);
      double t = now_us();
      int r = request(sock, cmd, keys[i], cmd == 0 ? payload : NULL, NULL);
      if (r != (0x80 | cmd)) {
        errno = 0;
        fprintf(stderr, "vmpod-client: %s %s: error reply: %.*s\n", op, keys[i], (int)be32(reply + 5), reply + HDR);
        _exit(1);
      }
      fprintf(f, "%.1f\n", now_us() - t);
    }
    fclose(f);
    _exit(0);
  }
  int bad = 0, st;
  while (wait(&st) > 0)
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) bad++;
  printf("%.1f\n", now_us() - t0);
  return bad ? 1 : 0;
}

static int restart(const char *sock, int nkeys, char **keys, char **argv) {
  double t0 = now_us();
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid > 0) daemon_pid = pid;
  if (pid == 0) {
    // the daemon must not hold our stdout (the caller reads it to its end): its output goes to VMPOD_BENCH_LOG
    const char *log = getenv("VMPOD_BENCH_LOG");
    int out = open(log ? log : "/dev/null", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (out < 0 || dup2(out, 1) < 0 || dup2(out, 2) < 0) _exit(126);
    execv(argv[0], argv);
    _exit(127);
  }
  int fd;
  while ((fd = dial(sock)) < 0) {
    if (now_us() - t0 > 20e6 || waitpid(pid, NULL, WNOHANG) == pid) {
      errno = 0;
      die("the daemon did not take a connection within 20 s (or exited)");
    }
    usleep(200);
  }
  exchange(fd, 2, nkeys ? keys[0] : "vmpod-bench-none", NULL, NULL);
  double first = now_us();
  close(fd);
  int retries = 0;
  for (int i = 0; i < nkeys; i++) {
    while (request(sock, 2, keys[i], NULL, NULL) != 0x82) {
      retries++;
      if (now_us() - t0 > 20e6) {
        errno = 0;
        die("a pod did not answer get within 20 s");
      }
      usleep(1000);
    }
  }
  printf("{\"pid\":%d,\"firstAnswerUs\":%.1f,\"allAnsweredUs\":%.1f,\"retries\":%d}\n", pid, first - t0, now_us() - t0, retries);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 5 && strcmp(argv[1], "capture") == 0) {
    size_t n;
    if (request(argv[2], 2, argv[3], NULL, &n) != 0x82) die("get");
    FILE *f = fopen(argv[4], "w");
    if (!f || fwrite(reply, 1, n, f) != n || fclose(f) != 0) die("write capture");
    return 0;
  }
  if (argc == 6 && strcmp(argv[1], "loop") == 0) {
    int n = atoi(argv[4]);
    double *lat = calloc(n, sizeof *lat);
    for (int i = 0; i < n; i++) {
      double t = now_us();
      if (request(argv[2], 2, argv[3], NULL, NULL) != 0x82) die("get");
      lat[i] = now_us() - t;
    }
    FILE *f = fopen(argv[5], "w");
    if (!f) die("open out");
    for (int i = 0; i < n; i++) fprintf(f, "%.1f\n", lat[i]);
    fclose(f);
    return 0;
  }
  if (argc >= 6 && (strcmp(argv[1], "add") == 0 || strcmp(argv[1], "release") == 0)) return set_op(argv[1], argv[2], atoi(argv[3]), argv[4], argc - 5, argv + 5);
  if (argc >= 4 && strcmp(argv[1], "restart") == 0) {
    int sep = 3;
    while (sep < argc && strcmp(argv[sep], "--") != 0) sep++;
    if (sep + 1 < argc) {
      argv[sep] = NULL;
      return restart(argv[2], sep - 3, argv + 3, argv + sep + 1);
    }
  }
  fprintf(stderr, "usage: see the comment at the top of vmpod-client.c\n");
  return 2;
}
