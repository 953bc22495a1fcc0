#!/usr/bin/env bash
# The demo: one VM pod end to end, on a built-in CNI config, with nothing but this machine.
#   tapmanager (bridge + host-local on a free private /24)  ->  tapctl add  ->  vmwrapper  ->  qemu (the tiny guest)
# It prints the pod's IP and MAC, the guest's DHCP lease and a ping, then tears everything down (also on Ctrl-C).
# Run as root:  bash scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)

if [ "$(id -u)" -ne 0 ]; then
  echo "demo: run as root (it creates a netns, a bridge and a tap)" >&2
  exit 1
fi

say() { printf '\033[1m==> %s\033[0m\n' "$*"; }

say "installing and building what the demo needs (first run only)"
bash scripts/setup.sh
source scripts/node.sh   # Node 24 first on PATH, as setup.sh built with it
say "building (or reusing) the tiny guest"
GUEST=$(bash test/guest/build.sh "$REPO/.cache/guest" | tail -n 2)
KERNEL="$REPO/.cache/guest/vmlinuz"
INITRD="$REPO/.cache/guest/initrd.gz"
[ -f "$KERNEL" ] && [ -f "$INITRD" ] || { echo "demo: guest build failed: $GUEST" >&2; exit 1; }

WORK=$(mktemp -d /tmp/vmpod-demo.XXXXXX)
ID=$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
KEY="vmpod-demo-$ID"
BRIDGE="vmdemo$ID"
SOCKET="$WORK/tapmanager.sock"
TM_PID=""
QEMU_PID=""
ADDED=""

cleanup() {
  trap - EXIT INT TERM
  set +e
  say "tearing down"
  if [ -n "$QEMU_PID" ] && kill -0 "$QEMU_PID" 2>/dev/null; then
    kill "$QEMU_PID"
    for _ in $(seq 50); do kill -0 "$QEMU_PID" 2>/dev/null || break; sleep 0.1; done
  fi
  if [ -n "$ADDED" ]; then node dist/bundle/tapctl.js --socket "$SOCKET" release "$KEY" && echo "released pod network $KEY"; fi
  if [ -n "$TM_PID" ] && kill -0 "$TM_PID" 2>/dev/null; then
    kill -TERM "$TM_PID"
    wait "$TM_PID" 2>/dev/null
  fi
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link del "$BRIDGE"
  rm -rf "$WORK"
  ip netns list | grep -q "^$KEY\b" && echo "demo: netns $KEY is still there" >&2
  echo "done: nothing of the demo is left"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# a private /24 that no address or route on this machine uses
SUBNET=""
for _ in $(seq 50); do
  b=$(( $(od -An -N1 -tu1 /dev/urandom) ))
  c=$(( 16 + $(od -An -N1 -tu1 /dev/urandom) % 16 ))
  cand="172.$c.$b"
  if ! ip -4 route show table all | grep -q "$cand\." && ! ip -4 addr | grep -q "$cand\."; then SUBNET=$cand; break; fi
done
[ -n "$SUBNET" ] || { echo "demo: no free private /24 found" >&2; exit 1; }

mkdir -p "$WORK/net.d" "$WORK/ipam" "$WORK/state" "$WORK/cache"
cat > "$WORK/net.d/10-demo.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "vmpod-demo",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "mtu": 1450,
      "ipam": { "type": "host-local", "dataDir": "$WORK/ipam",
                "ranges": [[{ "subnet": "$SUBNET.0/24", "gateway": "$SUBNET.1" }]],
                "routes": [{ "dst": "0.0.0.0/0" }] }
    }
  ]
}
EOF

say "starting tapmanager on $SOCKET (CNI: bridge $BRIDGE + host-local $SUBNET.0/24)"
# setsid: a Ctrl-C in the terminal reaches the script, not tapmanager, which must stay up to release the pod
setsid node dist/bundle/tapmanager.js --socket "$SOCKET" --cni-conf-dir "$WORK/net.d" --cni-bin-dir /usr/lib/cni \
  --cni-cache-dir "$WORK/cache" --state-dir "$WORK/state" --log-level warn &
TM_PID=$!
for _ in $(seq 100); do [ -S "$SOCKET" ] && break; sleep 0.1; done
[ -S "$SOCKET" ] || { echo "demo: tapmanager did not start" >&2; exit 1; }

say "tapctl add $KEY"
CSN=$(node dist/bundle/tapctl.js --socket "$SOCKET" add "$KEY" --pod-name vmpod-demo --pod-namespace default)
ADDED=1
POD_IP=$(node -e 'const c=JSON.parse(process.argv[1]); console.log(c.Result.ips[0].address)' "$CSN")
POD_MAC=$(node -e 'const c=JSON.parse(process.argv[1]); console.log(c.Interfaces[0].mac)' "$CSN")
echo "pod network: netns /var/run/netns/$KEY, IP $POD_IP, MAC $POD_MAC, gateway $SUBNET.1"

ACCEL=(-accel tcg)
if [ -e /dev/kvm ] && [ ! -e /sys/module/kvm_pvm ] && [ -z "${VMPOD_DEMO_TCG:-}" ]; then ACCEL=(-accel kvm -cpu host); fi
say "booting the guest through vmwrapper (${ACCEL[*]})"
SERIAL="$WORK/serial.log"
VIRTLET_EMULATOR=/usr/bin/qemu-system-x86_64 VIRTLET_NET_KEY="$KEY" VIRTLET_FD_SERVER_SOCKET_PATH="$SOCKET" VMPOD_LOG_LEVEL=silent \
  setsid node dist/bundle/vmwrapper.cjs "${ACCEL[@]}" -m 256 -nodefaults -display none -serial "file:$SERIAL" \
  -kernel "$KERNEL" -initrd "$INITRD" -append 'console=ttyS0 quiet' &
QEMU_PID=$!   # setsid and vmwrapper both exec: this is qemu's PID
LEASE=""
for _ in $(seq 600); do
  LEASE=$(grep -m1 '^VMPOD-LEASE' "$SERIAL" 2>/dev/null || true)
  [ -n "$LEASE" ] && break
  kill -0 "$QEMU_PID" 2>/dev/null || { echo "demo: qemu exited" >&2; exit 1; }
  sleep 0.1
done
[ -n "$LEASE" ] || { echo "demo: no lease within 60 s; serial log:" >&2; cat "$SERIAL" >&2; exit 1; }
echo "qemu pid $QEMU_PID: $(tr '\0' ' ' < /proc/$QEMU_PID/cmdline | cut -c1-160)..."
echo "guest lease: ${LEASE#VMPOD-LEASE }"

say "ping ${POD_IP%/*} from the host"
ping -c 3 -W 2 "${POD_IP%/*}"
say "the guest's web page"
curl -s --max-time 5 "http://${POD_IP%/*}/" || true
