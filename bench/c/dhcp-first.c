// The first DHCP / RA answer after a pod network is ready, as the VM sees it: a request written into the pod's tap
// (what the guest's NIC does), the answer read back from it. Times from "network ready" to the first answer.
//   dhcp-first [--ask WHAT] vmpod SOCKET KEY ADDJSONFILE
//       sends tapmanager an add (payload: ADDJSONFILE); ready = the add's reply; then a get for the tap fd
//       (the VM's MAC comes from the reply's csn)
//   dhcp-first [--ask WHAT] dnsmasq NSPATH TAP MAC -- DNSMASQ_ARGV...
//       opens TAP in the netns NSPATH (a hand-made pod); ready = the fork that execs dnsmasq there
// WHAT (default dhcp4), each request every 2 ms until one is answered:
//   dhcp4          DISCOVER (busybox udhcpc's shape) -> the OFFER of one of them
//   rs             Router Solicitation to ff02::2 -> the first Router Advertisement, whatever triggered it (the
//                  server's unsolicited one counts: a guest takes it the same)
//   solicit        DHCPv6 SOLICIT to ff02::1:2 -> the ADVERTISE (or REPLY) of one of them
//   solicit-rapid  the same SOLICIT with Rapid Commit -> the REPLY (or ADVERTISE) of one of them
// IPv6 frames are a guest's: source MAC the VM's, source address the link-local made from it (EUI-64), DUID-LL of
// that MAC, IA_NA (IAID = the MAC's last 4 bytes), ORO 23 24, Elapsed Time. A Neighbour Solicitation for that
// link-local is answered (a guest's kernel does; dnsmasq's kernel must resolve the client before it replies).
// Prints one JSON line: readyToAnswerUs, requestToAnswerUs (of the request answered; for rs the latest RS before the
// RA), attempts, answer (OFFER, RA, ADVERTISE, REPLY), for rs: solicited (the RA was unicast to us), raFlags (M 128,
// O 64), nsAnswered; for vmpod addUs. dnsmasq is stopped (SIGTERM) before exit. Exit 1 with the reason on stderr on
// failure or after 60 s without an answer.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define HDR 77
static pid_t dnsmasq_pid = -1;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void die(const char *what) {
  fprintf(stderr, "dhcp-first: %s: %s\n", what, errno ? strerror(errno) : "failed");
  if (dnsmasq_pid > 0) kill(dnsmasq_pid, SIGTERM), waitpid(dnsmasq_pid, NULL, 0);
  exit(1);
}

static uint32_t be32(const unsigned char *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

static unsigned char buf[1 << 16];

// one request on a fresh connection; the reply payload in buf (NUL-terminated), its first fd in *fd_out
static size_t request(const char *sock, int cmd, const char *key, const char *payload, size_t plen, int *fd_out) {
  unsigned char req[HDR];
  memset(req, 0, sizeof req);
  req[0] = req[1] = req[2] = req[3] = 0x42;
  req[4] = (unsigned char)cmd;
  req[5] = plen >> 24, req[6] = plen >> 16, req[7] = plen >> 8, req[8] = plen;
  memset(req + 13, ' ', 64);
  memcpy(req + 13, key, strlen(key));
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  strncpy(a.sun_path, sock, sizeof a.sun_path - 1);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) die("connect");
  if (send(fd, req, HDR, MSG_NOSIGNAL) != HDR || (plen && send(fd, payload, plen, MSG_NOSIGNAL) != (ssize_t)plen)) die("send");
  unsigned char h[HDR];
  if (recv(fd, h, HDR, MSG_WAITALL) != HDR) die("recv header");
  errno = 0;
  if (h[4] != (0x80 | cmd)) die("error reply");
  uint32_t dsz = be32(h + 5), oob = be32(h + 9);
  if (dsz >= sizeof buf || oob > 1024) die("reply too large");
  size_t got = 0;
  if (dsz || oob) {
    char cbuf[1024];
    struct iovec iov = {.iov_base = buf, .iov_len = dsz ? dsz : 1};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = oob ? cbuf : NULL, .msg_controllen = oob};
    ssize_t n = recvmsg(fd, &m, MSG_CMSG_CLOEXEC);
    if (n <= 0) die("recvmsg");
    got = n;
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    if (fd_out && c && c->cmsg_type == SCM_RIGHTS) memcpy(fd_out, CMSG_DATA(c), sizeof(int));
    while (got < dsz) {
      ssize_t r = recv(fd, buf + got, dsz - got, 0);
      if (r <= 0) die("recv payload");
      got += r;
    }
  }
  buf[dsz] = 0;
  close(fd);
  return dsz;
}

static uint16_t csum(const unsigned char *p, int n) {
  uint32_t s = 0;
  for (int i = 0; i + 1 < n; i += 2) s += p[i] << 8 | p[i + 1];
  while (s >> 16) s = (s & 0xffff) + (s >> 16);
  return ~s;
}

// Ethernet + IPv4 + UDP 68->67 + DHCP DISCOVER (broadcast flag, options 53, 61, 57, 60, 55)
static int discover(unsigned char *f, const unsigned char mac[6], uint32_t xid) {
  memset(f, 0, 600);
  memset(f, 0xff, 6);
  memcpy(f + 6, mac, 6);
  f[12] = 0x08;
  unsigned char *ip = f + 14, *udp = ip + 20, *d = udp + 8;
  d[0] = 1, d[1] = 1, d[2] = 6;
  d[4] = xid >> 24, d[5] = xid >> 16, d[6] = xid >> 8, d[7] = xid;
  d[10] = 0x80;
  memcpy(d + 28, mac, 6);
  unsigned char *o = d + 236;
  static const unsigned char cookie[] = {99, 130, 83, 99};
  memcpy(o, cookie, 4), o += 4;
  *o++ = 53, *o++ = 1, *o++ = 1;
  *o++ = 61, *o++ = 7, *o++ = 1, memcpy(o, mac, 6), o += 6;
  *o++ = 57, *o++ = 2, *o++ = 2, *o++ = 64;
  *o++ = 60, *o++ = 12, memcpy(o, "udhcp 1.36.1", 12), o += 12;
  static const unsigned char prl[] = {1, 3, 6, 12, 15, 26, 28, 42, 51, 54, 58, 59, 119, 121};
  *o++ = 55, *o++ = sizeof prl, memcpy(o, prl, sizeof prl), o += sizeof prl;
  *o++ = 255;
  int dlen = o - d;
  if (dlen < 300) dlen = 300;
  int ulen = 8 + dlen;
  udp[0] = 0, udp[1] = 68, udp[2] = 0, udp[3] = 67, udp[4] = ulen >> 8, udp[5] = ulen;
  ip[0] = 0x45, ip[2] = (20 + ulen) >> 8, ip[3] = (20 + ulen), ip[8] = 64, ip[9] = 17;
  memset(ip + 16, 0xff, 4);
  uint16_t c = csum(ip, 20);
  ip[10] = c >> 8, ip[11] = c;
  return 14 + 20 + ulen;
}

// ---- IPv6 (a guest's RS, SOLICIT, and its answer to a Neighbour Solicitation) ----

enum ask { ASK_DHCP4, ASK_RS, ASK_SOLICIT, ASK_SOLICIT_RAPID };

static void ll_from_mac(unsigned char a[16], const unsigned char mac[6]) {
  memset(a, 0, 16);
  a[0] = 0xfe, a[1] = 0x80;
  a[8] = mac[0] ^ 2, a[9] = mac[1], a[10] = mac[2], a[11] = 0xff, a[12] = 0xfe, a[13] = mac[3], a[14] = mac[4], a[15] = mac[5];
}

// the checksum of ICMPv6 and UDP over IPv6: pseudo-header (src, dst, length, next header) + payload
static uint16_t csum6(const unsigned char *ip, const unsigned char *p, int n) {
  uint32_t s = 0;
  for (int i = 8; i < 40; i += 2) s += ip[i] << 8 | ip[i + 1];
  s += (uint32_t)n >> 16, s += n & 0xffff, s += ip[6];
  for (int i = 0; i + 1 < n; i += 2) s += p[i] << 8 | p[i + 1];
  if (n & 1) s += p[n - 1] << 8;
  while (s >> 16) s = (s & 0xffff) + (s >> 16);
  uint16_t c = ~s;
  return c ? c : 0xffff;
}

// Ethernet + IPv6 header for a payload of plen bytes at f + 54; returns the frame's length
static int ip6_frame(unsigned char *f, const unsigned char dmac[6], const unsigned char mac[6], const unsigned char src[16], const unsigned char dst[16], int nh, int hlim, int plen) {
  memcpy(f, dmac, 6), memcpy(f + 6, mac, 6);
  f[12] = 0x86, f[13] = 0xdd;
  unsigned char *ip = f + 14;
  memset(ip, 0, 8);
  ip[0] = 0x60, ip[4] = plen >> 8, ip[5] = plen, ip[6] = nh, ip[7] = hlim;
  memcpy(ip + 8, src, 16), memcpy(ip + 24, dst, 16);
  uint16_t c = csum6(ip, f + 54, plen);
  unsigned char *ck = f + 54 + (nh == 58 ? 2 : 6);
  ck[0] = c >> 8, ck[1] = c;
  return 54 + plen;
}

static const unsigned char ALL_NODES[16] = {0xff, 2, [15] = 1}, ALL_ROUTERS[16] = {0xff, 2, [15] = 2}, ALL_DHCP[16] = {0xff, 2, [13] = 1, [15] = 2};

// RS from our link-local to ff02::2 with the Source Link-Layer Address option
static int rs(unsigned char *f, const unsigned char mac[6]) {
  unsigned char src[16], *p = f + 54;
  static const unsigned char dmac[6] = {0x33, 0x33, 0, 0, 0, 2};
  ll_from_mac(src, mac);
  memset(p, 0, 16);
  p[0] = 133, p[8] = 1, p[9] = 1, memcpy(p + 10, mac, 6);
  return ip6_frame(f, dmac, mac, src, ALL_ROUTERS, 58, 255, 16);
}

// SOLICIT 546 -> [ff02::1:2]:547: Client Identifier (DUID-LL), Elapsed Time, IA_NA, ORO (23, 24)[, Rapid Commit]
static int solicit(unsigned char *f, const unsigned char mac[6], uint32_t xid, int rapid) {
  unsigned char src[16], *u = f + 54, *d = u + 8, *o = d + 4;
  static const unsigned char dmac[6] = {0x33, 0x33, 0, 1, 0, 2};
  ll_from_mac(src, mac);
  d[0] = 1, d[1] = xid >> 16, d[2] = xid >> 8, d[3] = xid;
  *o++ = 0, *o++ = 1, *o++ = 0, *o++ = 10, *o++ = 0, *o++ = 3, *o++ = 0, *o++ = 1, memcpy(o, mac, 6), o += 6;
  *o++ = 0, *o++ = 8, *o++ = 0, *o++ = 2, *o++ = 0, *o++ = 0;
  *o++ = 0, *o++ = 3, *o++ = 0, *o++ = 12, memcpy(o, mac + 2, 4), o += 4, memset(o, 0, 8), o += 8;
  *o++ = 0, *o++ = 6, *o++ = 0, *o++ = 4, *o++ = 0, *o++ = 23, *o++ = 0, *o++ = 24;
  if (rapid) *o++ = 0, *o++ = 14, *o++ = 0, *o++ = 0;
  int ulen = o - u;
  u[0] = 546 >> 8, u[1] = 546 & 0xff, u[2] = 547 >> 8, u[3] = 547 & 0xff, u[4] = ulen >> 8, u[5] = ulen, u[6] = u[7] = 0;
  return ip6_frame(f, dmac, mac, src, ALL_DHCP, 17, 1, ulen);
}

// The NA a guest's kernel sends for a Neighbour Solicitation of its link-local (e: the NS frame); 0 when it is not one
static int na(unsigned char *f, const unsigned char *e, int n, const unsigned char mac[6]) {
  unsigned char me[16], *p = f + 54;
  ll_from_mac(me, mac);
  if (n < 54 + 24 || e[20] != 58 || e[54] != 135 || memcmp(e + 54 + 8, me, 16) != 0) return 0;
  static const unsigned char zero[16];
  int dad = memcmp(e + 22, zero, 16) == 0;  // from :: (the sender's DAD): the answer goes to all nodes
  static const unsigned char all_mac[6] = {0x33, 0x33, 0, 0, 0, 1};
  memset(p, 0, 32);
  p[0] = 136, p[4] = dad ? 0x20 : 0x60, memcpy(p + 8, me, 16), p[24] = 2, p[25] = 1, memcpy(p + 26, mac, 6);
  return ip6_frame(f, dad ? all_mac : e + 6, mac, me, dad ? ALL_NODES : e + 22, 58, 255, 32);
}

static int parse_mac(const char *s, unsigned char mac[6]) {
  unsigned int m[6];
  if (sscanf(s, "%2x:%2x:%2x:%2x:%2x:%2x", &m[0], &m[1], &m[2], &m[3], &m[4], &m[5]) != 6) return -1;
  for (int i = 0; i < 6; i++) mac[i] = m[i];
  return 0;
}

static const char *const ANSWER[] = {[2] = "OFFER", [134] = "RA"};

int main(int argc, char **argv) {
  int tap = -1, vnet = 0;
  unsigned char mac[6];
  double ready, add_us = -1;
  enum ask ask = ASK_DHCP4;
  if (argc > 2 && strcmp(argv[1], "--ask") == 0) {
    const char *w = argv[2];
    ask = !strcmp(w, "dhcp4") ? ASK_DHCP4 : !strcmp(w, "rs") ? ASK_RS : !strcmp(w, "solicit") ? ASK_SOLICIT : !strcmp(w, "solicit-rapid") ? ASK_SOLICIT_RAPID : -1;
    if ((int)ask < 0) {
      fprintf(stderr, "dhcp-first: --ask %s: not dhcp4, rs, solicit or solicit-rapid\n", w);
      return 2;
    }
    argv += 2, argc -= 2;
  }
  if (argc == 5 && strcmp(argv[1], "vmpod") == 0) {
    FILE *f = fopen(argv[4], "r");
    static char json[65536];
    size_t jl = f ? fread(json, 1, sizeof json, f) : 0;
    if (!f || jl == 0) die("read add payload");
    fclose(f);
    double t = now_us();
    request(argv[2], 0, argv[3], json, jl, NULL);
    ready = now_us();
    add_us = ready - t;
    // the VM's MAC: the CNI result's interface inside the pod (the one with "sandbox"), as tapmanager serves it
    const char *sb = strstr((char *)buf, "\"sandbox\"");
    const char *m = NULL;
    for (const char *q = sb; q && q > (char *)buf; q--)
      if (strncmp(q, "\"mac\":\"", 7) == 0) {
        m = q;
        break;
      }
    errno = 0;
    if (!m || parse_mac(m + 7, mac) < 0) die("no \"mac\" of the sandbox interface in the add reply");
    request(argv[2], 2, argv[3], NULL, 0, &tap);
    if (tap < 0) die("get gave no fd");
    struct ifreq ifr;
    if (ioctl(tap, TUNGETIFF, &ifr) < 0) die("TUNGETIFF");
    if (ifr.ifr_flags & IFF_VNET_HDR) {
      if (ioctl(tap, TUNGETVNETHDRSZ, &vnet) < 0) die("TUNGETVNETHDRSZ");
    }
  } else if (argc >= 7 && strcmp(argv[1], "dnsmasq") == 0 && strcmp(argv[5], "--") == 0) {
    int ns = open(argv[2], O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNET) < 0) die("setns");
    tap = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
    struct ifreq ifr = {0};
    strncpy(ifr.ifr_name, argv[3], IFNAMSIZ - 1);
    ifr.ifr_flags = IFF_TAP | IFF_NO_PI;
    if (tap < 0 || ioctl(tap, TUNSETIFF, &ifr) < 0) die("open tap");
    errno = 0;
    if (parse_mac(argv[4], mac) < 0) die("bad MAC");
    ready = now_us();
    dnsmasq_pid = fork();
    if (dnsmasq_pid == 0) {
      execv(argv[6], argv + 6);
      _exit(127);
    }
    if (dnsmasq_pid < 0) die("fork");
  } else {
    fprintf(stderr, "usage: dhcp-first [--ask dhcp4|rs|solicit|solicit-rapid] vmpod SOCKET KEY ADDJSONFILE | dhcp-first [--ask ...] dnsmasq NSPATH TAP MAC -- DNSMASQ_ARGV...\n");
    return 2;
  }
  int fl = fcntl(tap, F_GETFL);
  fcntl(tap, F_SETFL, fl | O_NONBLOCK);
  static unsigned char frame[700], out[200], in[1 << 16];
  unsigned char me[16];
  ll_from_mac(me, mac);
  // request ids: DHCPv4 xid (32 bits), DHCPv6 transaction-id (24 bits): room for 32768 attempts either way
  uint32_t xid0 = ask == ASK_DHCP4 ? (uint32_t)getpid() << 8 : ((uint32_t)getpid() & 0x1ff) << 15;
  static double sent[32768];
  int attempts = 0, ns_answered = 0;
  for (;;) {
    if (now_us() - ready > 60e6) {
      errno = 0;
      die("no answer within 60 s");
    }
    memset(frame, 0, vnet);
    uint32_t xid = xid0 + attempts;
    int n = ask == ASK_DHCP4 ? discover(frame + vnet, mac, xid) : ask == ASK_RS ? rs(frame + vnet, mac) : solicit(frame + vnet, mac, xid, ask == ASK_SOLICIT_RAPID);
    sent[attempts] = now_us();
    if (write(tap, frame, vnet + n) < 0) die("write tap");
    attempts++;
    double until = now_us() + 2000;
    for (double left; (left = until - now_us()) > 0;) {
      struct pollfd p = {.fd = tap, .events = POLLIN};
      if (poll(&p, 1, (int)(left / 1000) + 1) <= 0) continue;
      ssize_t r;
      while ((r = read(tap, in, sizeof in)) > 0) {
        unsigned char *e = in + vnet;
        r -= vnet;
        int answered = -1;  // index in sent[] of the request answered
        int kind = 0;       // DHCPv4 op, ICMPv6 type or DHCPv6 message type of the answer
        if (ask == ASK_DHCP4) {
          if (r < 14 + 20 + 8 + 240 || e[12] != 0x08 || e[13] != 0 || e[14 + 9] != 17) continue;
          unsigned char *u = e + 14 + (e[14] & 15) * 4, *d = u + 8;
          if (u[1] != 67 || d[0] != 2) continue;
          uint32_t x = be32(d + 4);
          if (x < xid0 || x >= xid0 + (uint32_t)attempts) continue;
          answered = x - xid0, kind = 2;
        } else {
          if (r < 54 + 4 || e[12] != 0x86 || e[13] != 0xdd) continue;
          int m = na(out + vnet, e, r, mac);
          if (m > 0) {
            memset(out, 0, vnet);
            if (write(tap, out, vnet + m) < 0) die("write tap (NA)");
            ns_answered++;
            continue;
          }
          if (ask == ASK_RS) {
            if (e[20] != 58 || e[54] != 134) continue;
            answered = attempts - 1, kind = 134;
          } else {
            unsigned char *u = e + 54, *d = u + 8;
            if (r < 54 + 8 + 4 || e[20] != 17 || (u[0] << 8 | u[1]) != 547 || (u[2] << 8 | u[3]) != 546 || (d[0] != 2 && d[0] != 7)) continue;
            uint32_t x = (uint32_t)d[1] << 16 | d[2] << 8 | d[3];
            if (x < xid0 || x >= xid0 + (uint32_t)attempts) continue;
            answered = x - xid0, kind = d[0];
          }
        }
        double t = now_us();
        const char *name = ask == ASK_DHCP4 || ask == ASK_RS ? ANSWER[kind] : kind == 2 ? "ADVERTISE" : "REPLY";
        printf("{\"readyToAnswerUs\":%.1f,\"requestToAnswerUs\":%.1f,\"attempts\":%d,\"answer\":\"%s\"", t - ready, t - sent[answered], attempts, name);
        if (ask == ASK_RS) printf(",\"solicited\":%s,\"raFlags\":%d", memcmp(e + 38, me, 16) == 0 ? "true" : "false", e[54 + 5]);
        if (ask != ASK_DHCP4) printf(",\"nsAnswered\":%d", ns_answered);
        if (add_us >= 0) printf(",\"addUs\":%.1f", add_us);
        printf("}\n");
        if (dnsmasq_pid > 0) kill(dnsmasq_pid, SIGTERM), waitpid(dnsmasq_pid, NULL, 0);
        return 0;
      }
    }
    if (attempts >= 32768) {
      errno = 0;
      die("too many attempts");
    }
  }
}
