#!/usr/bin/env bash
# Installs vmpod-node on a host, for tapmanager under systemd (docs/operations.md, "Install on a host"), as root:
#   /usr/local/lib/vmpod-node/node/                 Node 24 (bin/node and its headers), the project's Node
#   /usr/local/lib/node_modules/vmpod-node/         the package (`npm pack` of this checkout, or --tarball), its
#                                                   addon built from source at install against that Node
#   /usr/local/bin/{tapmanager,tapctl,vmwrapper}    its bins (and /usr/local/bin/node -> Node 24, if no node is there)
#   /etc/systemd/system/vmpod-tapmanager.service    the unit; its ExecStart is that Node and tapmanager's bundle
#   /etc/default/vmpod-tapmanager                   the unit's settings (README's env vars), if not there already
# Then: systemctl daemon-reload && systemctl enable --now vmpod-tapmanager
#
# usage: scripts/install-host.sh [--root DIR] [--tarball FILE]
#   --root     install under DIR instead of / (a scratch root, or a package's staging dir): every path above is made
#              under DIR, and what the files name (the unit's ExecStart, vmwrapper's shebang) is the path on the host
#   --tarball  the package to install (default: `npm pack` of this checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/node.sh   # Node 24 (NODE_DIR), fetched once if this machine has none

ROOT=""
TARBALL=""
while [ $# -gt 0 ]; do
  case "$1" in
    --root) ROOT="${2%/}"; shift 2 ;;
    --tarball) TARBALL="$(readlink -f "$2")"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install-host.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
log() { echo "install-host.sh: $*" >&2; }

PREFIX=/usr/local
NODE_HOME=$PREFIX/lib/vmpod-node/node
PKG=$PREFIX/lib/node_modules/vmpod-node
UNIT=/etc/systemd/system/vmpod-tapmanager.service
DEFAULTS=/etc/default/vmpod-tapmanager

work="$(mktemp -d /tmp/vmpod-install.XXXXXX)"
trap 'rm -rf "$work"' EXIT
if [ -z "$TARBALL" ]; then
  log "packing this checkout (npm pack: builds dist/ first)"
  (npm pack --silent --pack-destination "$work" >/dev/null)
  TARBALL="$(ls "$work"/vmpod-node-*.tgz)"
fi
[ -f "$TARBALL" ] || { log "no package at $TARBALL"; exit 1; }

log "Node $NODE_VERSION into $ROOT$NODE_HOME"
rm -rf "$ROOT$NODE_HOME.new"
mkdir -p "$ROOT$NODE_HOME.new"
cp -a "$NODE_DIR/bin" "$NODE_DIR/include" "$ROOT$NODE_HOME.new/"
[ -f "$NODE_DIR/LICENSE" ] && cp "$NODE_DIR/LICENSE" "$ROOT$NODE_HOME.new/"
rm -rf "$ROOT$NODE_HOME"
mv "$ROOT$NODE_HOME.new" "$ROOT$NODE_HOME"

log "the package into $ROOT$PKG (its addon built against that Node)"
# that Node runs npm's install step, so the addon is built against its headers (scripts/install-addon.mjs)
PATH="$ROOT$NODE_HOME/bin:$PATH" npm install --global --prefix "$ROOT$PREFIX" --no-audit --no-fund --omit=dev "$TARBALL" >&2
# vmwrapper's interpreter, as the host will see it (under --root the install step saw it under DIR)
sed -i "1s|^#!.*|#!$NODE_HOME/bin/node|" "$ROOT$PKG/dist/bundle/vmwrapper.cjs"
# tapctl and tapmanager by hand find Node 24 on PATH through this link, unless the host has a node there already
if [ ! -e "$ROOT$PREFIX/bin/node" ]; then ln -s ../lib/vmpod-node/node/bin/node "$ROOT$PREFIX/bin/node"; fi

log "the systemd unit $ROOT$UNIT"
mkdir -p "$ROOT$(dirname "$UNIT")" "$ROOT$(dirname "$DEFAULTS")"
cp "$ROOT$PKG/deploy/systemd/vmpod-tapmanager.service" "$ROOT$UNIT"
if [ ! -e "$ROOT$DEFAULTS" ]; then
  cat > "$ROOT$DEFAULTS" <<'EOF'
# vmpod-tapmanager's settings: the env vars of README's tapmanager table, one K=V a line (docs/operations.md)
#VIRTLET_CNI_PLUGIN_DIR=/opt/cni/bin:/usr/lib/cni
#VMPOD_HTTP_LISTEN=127.0.0.1:9731
EOF
fi
for f in "$NODE_HOME/bin/node" "$PKG/dist/bundle/tapmanager.js"; do
  [ -e "$ROOT$f" ] || { log "missing after the install: $ROOT$f"; exit 1; }
done
log "installed $("$ROOT$NODE_HOME/bin/node" "$ROOT$PKG/dist/bundle/tapmanager.js" --version); next: systemctl daemon-reload && systemctl enable --now vmpod-tapmanager"
