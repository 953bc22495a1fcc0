#!/usr/bin/env bash
# Installs everything vmpod-node needs on a fresh Debian 12 machine (as root), then builds it with Node 24
# (scripts/node.sh). Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  containernetworking-plugins   # the node's CNI plugins (/usr/lib/cni)
  iproute2                      # ip, ip netns, bridge
  ebtables util-linux           # undo of DHCP filters recorded by earlier versions (ebtables in the pod netns, by nsenter)
  nftables                      # nft: the tests read the DHCP filter table back as the kernel holds it
  procps                        # sysctl: the tests read sysctls inside pod netns
  qemu-system-x86               # the emulator (TCG where KVM is unusable)
  busybox-static                # the tiny guest's userland, and udhcpc for the DHCP tests
  bzip2                         # test/guest/udhcpc6.sh unpacks busybox's source (Debian's busybox has no udhcpc6)
  isc-dhcp-client               # dhclient -6: a real DHCPv6 client in the IPv6 tests
  dhcpcd-base                   # dhcpcd: a real DHCPv6/RA client (IPv6 tests)
  systemd                       # systemd-networkd: a real RA + DHCPv6 client (IPv6 tests)
  dnsmasq-base                  # the off-the-shelf DHCP server of the baseline benchmark, and the LAN's DHCP server of test/integration/dhcp-ipam.test.ts
  iptables                      # portmap and firewall run it (the meta-plugin chain of test/integration/cni-shapes.test.ts)
  libvirt-daemon libvirt-clients libvirt-daemon-driver-qemu   # libvirt as the real client (e2e)
  cpio gzip kmod xz-utils zstd  # building the guest's initramfs
  iputils-ping curl             # the demo and the e2e tests reach the guest
  python3                       # the stub emulator of the vmwrapper tests; the guest relay's TUNSETOFFLOAD (test/helpers/taprelay.ts)
  gcc libc6-dev make g++        # node-gyp builds the addon; the benchmarks compile their C baselines (bench/c) with cc
  strace                        # bench/pods.mjs --strace: syscalls per get
  ethtool                       # the multiqueue e2e test reads the offloads the guest negotiated on its tap (ethtool -k)
  ca-certificates
  # the images and the podman kube play test of deploy/ (test/deploy/): podman with runc in ONE install (alone, podman
  # pulls crun, which fails on this kernel's cgroup v1/v2 hybrid), debootstrap for the Debian base image where no
  # container registry answers
  podman runc catatonit debootstrap   # catatonit: podman's pause process for the kube play pod (a Recommends, not pulled with --no-install-recommends)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# podman: runc, and limits under the machine's hard limits (podman's default nofile 1048576 is above them, and then
# every container fails "error setting rlimit type 7"). `podman kube play` has no --ulimit flag, so it goes here.
PODMAN_CONF=/etc/containers/containers.conf.d/50-vmpod-node.conf
limit() { local hard; hard="$(ulimit -H "$1")"; if [ "$hard" = unlimited ] || [ "$hard" -gt "$2" ]; then echo "$2"; else echo "$hard"; fi; }
nofile="$(limit -n 1048576)"
nproc="$(limit -u 32768)"
PODMAN_CONF_TEXT="# written by vmpod-node scripts/setup.sh (docs/deploy.md)
[containers]
default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]
[engine]
runtime = \"runc\""
if [ "$(cat "$PODMAN_CONF" 2>/dev/null)" != "$PODMAN_CONF_TEXT" ]; then
  mkdir -p "$(dirname "$PODMAN_CONF")"
  printf '%s\n' "$PODMAN_CONF_TEXT" > "$PODMAN_CONF.tmp"
  mv "$PODMAN_CONF.tmp" "$PODMAN_CONF"
fi

# Node 24 first on PATH, its headers for node-gyp (scripts/node.sh: fetched once from the npm registry)
source scripts/node.sh

# node_modules and the addon (npm ci runs node-gyp against $npm_config_nodedir, Node 24's headers: no download); again
# when the Node it was built with is not this one (the stamp), so the addon and vmwrapper's shebang follow Node
stamp=node_modules/.vmpod-node-version
if [ ! -f build/Release/vmpod_native.node ] || [ ! -d node_modules ] || [ package-lock.json -nt node_modules/.package-lock.json ] \
   || [ "$(cat "$stamp" 2>/dev/null)" != "$NODE_VERSION" ]; then
  npm ci --no-audit --no-fund
  echo "$NODE_VERSION" > "$stamp"
elif [ -n "$(find native binding.gyp -newer build/Release/vmpod_native.node -print -quit)" ]; then
  # the addon's source changed since it was built (a pull): rebuild it alone
  npm run install --silent
fi
npm run build --silent
