// Datagram sockets inside a pod's netns: the DHCP UDP socket (udpSocketInNetns), the IPv6 packet socket
// (packetSocketInNetns), and their receive and send (recvFrom, recvFrame, sendTo).

#include "common.h"

// What both socket makers share: nsPath and ifname (a link name) from argv[0..1], then socket(domain, type)
// made inside the netns at nsPath, and with want_index the ifindex of ifname there (an ifindex is per netns).
// Returns the fd, or -1 with an exception pending. The caller frees a->ns_path and a->ifname either way.
typedef struct {
  char *ns_path;
  char *ifname;
  unsigned int ifindex;
} netns_socket_t;

static int socket_in_netns(napi_env env, const char *fn, napi_value *argv, int domain, int type, bool want_index,
                           netns_socket_t *a) {
  if (!get_netns_link(env, fn, argv, &a->ns_path, &a->ifname)) return -1;
  netns_guard_t g;
  if (!netns_enter(env, fn, a->ns_path, &g)) return -1;
  // The socket belongs to the netns current at socket(); options and bind act in that netns from anywhere, so
  // only socket() (and the ifindex lookup) runs inside.
  a->ifindex = want_index ? if_nametoindex(a->ifname) : 0;
  int err = want_index && a->ifindex == 0 ? errno : 0;
  int fd = err ? -1 : socket(domain, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (!err && fd < 0) err = errno;
  netns_leave(&g, a->ns_path);
  if (want_index && a->ifindex == 0) throw_errno(env, err, "if_nametoindex %s in %s", a->ifname, a->ns_path);
  else if (fd < 0) throw_errno(env, err, "socket(%s) in %s", domain == AF_PACKET ? "AF_PACKET, SOCK_RAW" : "AF_INET, SOCK_DGRAM", a->ns_path);
  return fd;
}

// The end of both socket makers: the fd as a JS number when `ok`, else closed (its exception is pending).
static napi_value socket_made(napi_env env, int fd, bool ok, netns_socket_t *a) {
  napi_value ret = ok ? make_int(env, fd) : NULL;
  if (!ret && fd >= 0) close(fd);
  free(a->ns_path);
  free(a->ifname);
  return ret;
}

napi_value js_udpSocketInNetns(napi_env env, napi_callback_info info) {
  napi_value argv[3];
  int64_t port;
  if (!get_args(env, info, 3, argv, "udpSocketInNetns") ||
      !get_int(env, argv[2], "udpSocketInNetns", "port", 0, 65535, &port))
    return NULL;
  netns_socket_t a = {0};
  int fd = socket_in_netns(env, "udpSocketInNetns", argv, AF_INET, SOCK_DGRAM, false, &a);
  if (fd < 0) return socket_made(env, fd, false, &a);
  int one = 1;
  const char *what = NULL;
  if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0)
    what = "setsockopt SO_REUSEADDR";
  else if (setsockopt(fd, SOL_SOCKET, SO_BROADCAST, &one, sizeof(one)) < 0)
    what = "setsockopt SO_BROADCAST";
  else if (setsockopt(fd, IPPROTO_IP, IP_PKTINFO, &one, sizeof(one)) < 0)
    what = "setsockopt IP_PKTINFO";
  else if (setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, a.ifname, (socklen_t)strlen(a.ifname) + 1) < 0)
    what = "setsockopt SO_BINDTODEVICE";
  if (what) {
    throw_errno(env, errno, "%s %s in %s", what, a.ifname, a.ns_path);
    return socket_made(env, fd, false, &a);
  }
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  bool ok = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
  if (!ok) throw_errno(env, errno, "bind 0.0.0.0:%lld on %s in %s", (long long)port, a.ifname, a.ns_path);
  return socket_made(env, fd, ok, &a);
}

// One boolean of an optional options object (undefined or null: none given, *out unchanged).
static bool get_opt_bool(napi_env env, napi_value opts, const char *fn, const char *key, bool *out) {
  napi_valuetype t;
  if (napi_typeof(env, opts, &t) != napi_ok) return throw_napi(env, "napi_typeof failed"), false;
  if (t == napi_undefined || t == napi_null) return true;
  if (t != napi_object) return throw_type(env, "%s: opts must be an object", fn), false;
  napi_value v;
  if (napi_get_named_property(env, opts, key, &v) != napi_ok || napi_typeof(env, v, &t) != napi_ok)
    return throw_napi(env, "napi_get_named_property failed"), false;
  return t == napi_undefined || get_bool(env, v, fn, key, out);
}

// An AF_PACKET socket for IPv6 frames (ETH_P_IPV6) bound to one link inside the netns at nsPath: the RA and
// DHCPv6 servers read the frames the VM sends into its tap and write theirs straight back into the tap, so a
// reply can reach no other MAC and needs no route or neighbour entry in the pod netns. PACKET_IGNORE_OUTGOING:
// only frames received on the link (from the VM), not the bridge's own transmissions towards it.
// Bound with ETH_P_ALL, not ETH_P_IPV6: the tap is a bridge port, and the bridge's rx_handler consumes every frame
// before protocol-specific handlers run, so a socket bound to ETH_P_IPV6 on a port receives nothing; ETH_P_ALL
// sockets see the frame first. The BPF filter keeps everything but the wanted IPv6 frames out.
// filter: a classic BPF program (struct sock_filter[], 8 bytes each) attached before the socket is bound, so no
// frame the program refuses is ever queued (the socket is made with protocol 0 and receives nothing until bind).
// PACKET_AUXDATA: recvFrame reports a frame whose checksum is still to be filled in (a guest with checksum offload).
// opts.vnetHdr (PACKET_VNET_HDR): each frame read or written is preceded by a struct virtio_net_hdr, as on a tap
// fd with IFF_VNET_HDR (the tests' guest relay).
napi_value js_packetSocketInNetns(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  const uint8_t *prog = NULL;
  size_t prog_len = 0;
  bool vnet_hdr = false;
  if (!get_args(env, info, 4, argv, "packetSocketInNetns") ||
      !get_bytes(env, argv[2], "packetSocketInNetns", "filter", &prog, &prog_len) ||
      !get_opt_bool(env, argv[3], "packetSocketInNetns", "vnetHdr", &vnet_hdr))
    return NULL;
  if (prog_len == 0 || prog_len % sizeof(struct sock_filter) != 0 || prog_len / sizeof(struct sock_filter) > BPF_MAXINSNS)
    return throw_type(env, "packetSocketInNetns: filter must be 1 to %d BPF instructions of %zu bytes, got %zu bytes",
                      BPF_MAXINSNS, sizeof(struct sock_filter), prog_len);
  netns_socket_t a = {0};
  int fd = socket_in_netns(env, "packetSocketInNetns", argv, AF_PACKET, SOCK_RAW, true, &a);
  if (fd < 0) return socket_made(env, fd, false, &a);
  int one = 1;
  struct sock_fprog fprog = {.len = (unsigned short)(prog_len / sizeof(struct sock_filter)), .filter = (struct sock_filter *)prog};
  if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &fprog, sizeof(fprog)) < 0) {
    throw_errno(env, errno, "setsockopt SO_ATTACH_FILTER (%u instructions) on %s in %s", fprog.len, a.ifname, a.ns_path);
    return socket_made(env, fd, false, &a);
  }
  const char *what = NULL;
  if (setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof(one)) < 0)
    what = "PACKET_IGNORE_OUTGOING";
  else if (setsockopt(fd, SOL_PACKET, PACKET_AUXDATA, &one, sizeof(one)) < 0)
    what = "PACKET_AUXDATA";
  else if (vnet_hdr && setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof(one)) < 0)
    what = "PACKET_VNET_HDR";
  if (what) {
    throw_errno(env, errno, "setsockopt %s %s in %s", what, a.ifname, a.ns_path);
    return socket_made(env, fd, false, &a);
  }
  struct sockaddr_ll sll;
  memset(&sll, 0, sizeof(sll));
  sll.sll_family = AF_PACKET;
  sll.sll_protocol = htons(ETH_P_ALL);
  sll.sll_ifindex = (int)a.ifindex;
  bool ok = bind(fd, (struct sockaddr *)&sll, sizeof(sll)) == 0;
  if (!ok) throw_errno(env, errno, "bind AF_PACKET to %s in %s", a.ifname, a.ns_path);
  return socket_made(env, fd, ok, &a);
}

// recvFrame(fd, max) on a packet socket made by packetSocketInNetns: {data, csumNotReady} or null (EAGAIN).
// csumNotReady: PACKET_AUXDATA's TP_STATUS_CSUMNOTREADY, a frame whose sender left its transport checksum to be
// filled in (CHECKSUM_PARTIAL: a virtio-net guest with offloads, a veth): the packet is whole, the checksum field not.
napi_value js_recvFrame(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  int fd;
  int64_t max;
  if (!get_args(env, info, 2, argv, "recvFrame") || !get_fd(env, argv[0], "recvFrame", &fd) ||
      !get_int(env, argv[1], "recvFrame", "max", 1, MAX_IO_BYTES, &max))
    return NULL;
  uint8_t *buf = malloc((size_t)max);
  if (!buf) return throw_errno(env, ENOMEM, "recvmsg fd %d", fd);
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(struct tpacket_auxdata))];
  } ctl;
  struct iovec iov = {.iov_base = buf, .iov_len = (size_t)max};
  struct msghdr msg;
  ssize_t n;
  do {
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof(ctl.buf);
    n = recvmsg(fd, &msg, MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    int err = errno;
    free(buf);
    if (err == EAGAIN || err == EWOULDBLOCK) return make_null(env);
    return throw_errno(env, err, "recvmsg fd %d", fd);
  }
  bool not_ready = false;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_PACKET && c->cmsg_type == PACKET_AUXDATA) {
      struct tpacket_auxdata aux;
      memcpy(&aux, CMSG_DATA(c), sizeof(aux));
      not_ready = (aux.tp_status & TP_STATUS_CSUMNOTREADY) != 0;
    }
  }
  napi_value obj, data, v;
  bool ok = napi_create_object(env, &obj) == napi_ok &&
            napi_create_buffer_copy(env, (size_t)n, buf, NULL, &data) == napi_ok &&
            napi_set_named_property(env, obj, "data", data) == napi_ok &&
            napi_get_boolean(env, not_ready, &v) == napi_ok &&
            napi_set_named_property(env, obj, "csumNotReady", v) == napi_ok;
  free(buf);
  if (!ok) return throw_napi(env, "recvFrame: building the result failed");
  return obj;
}

napi_value js_recvFrom(napi_env env, napi_callback_info info) {
  napi_value argv[2];
  int fd;
  int64_t max;
  if (!get_args(env, info, 2, argv, "recvFrom") || !get_fd(env, argv[0], "recvFrom", &fd) ||
      !get_int(env, argv[1], "recvFrom", "max", 1, MAX_IO_BYTES, &max))
    return NULL;
  uint8_t *buf = malloc((size_t)max);
  if (!buf) return throw_errno(env, ENOMEM, "recvmsg fd %d", fd);
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(struct in_pktinfo)) + 256];
  } ctl;
  struct sockaddr_in from;
  struct iovec iov = {.iov_base = buf, .iov_len = (size_t)max};
  struct msghdr msg;
  ssize_t n;
  do {
    memset(&msg, 0, sizeof(msg));
    memset(&from, 0, sizeof(from));
    msg.msg_name = &from;
    msg.msg_namelen = sizeof(from);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof(ctl.buf);
    n = recvmsg(fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    int err = errno;
    free(buf);
    if (err == EAGAIN || err == EWOULDBLOCK) return make_null(env);
    return throw_errno(env, err, "recvmsg fd %d", fd);
  }
  int ifindex = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_PKTINFO) {
      struct in_pktinfo pi;
      memcpy(&pi, CMSG_DATA(c), sizeof(pi));
      ifindex = pi.ipi_ifindex;
    } else if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      // not possible on AF_INET, but never leak an fd
      close_fds((const int *)CMSG_DATA(c), (c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    }
  }
  char addr[INET_ADDRSTRLEN] = "";
  if (from.sin_family == AF_INET) inet_ntop(AF_INET, &from.sin_addr, addr, sizeof(addr));

  napi_value obj, data, v;
  bool ok = napi_create_object(env, &obj) == napi_ok &&
            napi_create_buffer_copy(env, (size_t)n, buf, NULL, &data) == napi_ok &&
            napi_set_named_property(env, obj, "data", data) == napi_ok &&
            napi_create_string_utf8(env, addr, NAPI_AUTO_LENGTH, &v) == napi_ok &&
            napi_set_named_property(env, obj, "address", v) == napi_ok &&
            napi_create_int32(env, ntohs(from.sin_port), &v) == napi_ok &&
            napi_set_named_property(env, obj, "port", v) == napi_ok &&
            napi_create_int32(env, ifindex, &v) == napi_ok &&
            napi_set_named_property(env, obj, "ifindex", v) == napi_ok;
  free(buf);
  if (!ok) return throw_napi(env, "recvFrom: building the result failed");
  return obj;
}

napi_value js_sendTo(napi_env env, napi_callback_info info) {
  napi_value argv[4];
  int fd;
  const uint8_t *data;
  size_t len;
  int64_t port;
  if (!get_args(env, info, 4, argv, "sendTo") || !get_fd(env, argv[0], "sendTo", &fd) ||
      !get_bytes(env, argv[1], "sendTo", "data", &data, &len) ||
      !get_int(env, argv[3], "sendTo", "port", 0, 65535, &port))
    return NULL;
  char *address = get_string(env, argv[2], "sendTo", "address");
  if (!address) return NULL;
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, address, &sa.sin_addr) != 1) {
    throw_type(env, "sendTo: address must be a dotted-quad IPv4 address, got '%s'", address);
    free(address);
    return NULL;
  }
  ssize_t n;
  do n = sendto(fd, data, len, MSG_NOSIGNAL | MSG_DONTWAIT, (struct sockaddr *)&sa, sizeof(sa));
  while (n < 0 && errno == EINTR);
  if (n < 0) {
    throw_errno(env, errno, "sendto fd %d %s:%lld", fd, address, (long long)port);
    free(address);
    return NULL;
  }
  free(address);
  return make_int(env, n);
}
