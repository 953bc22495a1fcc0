#!/usr/bin/env bash
# Builds vmpod-node's images from the one multi-stage Dockerfile (docs/deploy.md):
#   $REPO/tapmanager:$TAG      (--target tapmanager)
#   $REPO/libvirt:$TAG         (--target libvirt)
#   $REPO/device-plugin:$TAG   (--target device-plugin)
# The base images are the build args NODE_IMAGE and DEBIAN_IMAGE (official node:24-bookworm-slim and
# debian:bookworm-slim by default). A base that is neither present nor pullable (no registry answers) is made
# locally: Debian's by debootstrap from the apt mirror this machine uses, Node's from the project's Node 24
# (scripts/node.sh) and this machine's npm.
#
# usage: scripts/images.sh [--engine podman|docker] [--repo REPO] [--tag TAG] [--target T]... [--local-bases] [--no-cache]
#   --repo         image repository prefix (default localhost/vmpod-node; env VMPOD_IMAGE_REPO)
#   --target       build only this image (repeatable; default: all three)
#   --tag          image tag (default: package.json's version; env VMPOD_IMAGE_TAG)
#   --local-bases  make the base images locally without trying a registry
#   --no-cache     rebuild every layer
# env NODE_IMAGE / DEBIAN_IMAGE: use these base images as given (pulled by the engine if needed).
# Prints the image names, one a line, on stdout; progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/node.sh   # Node 24 (NODE_DIR): the local node base image is made from it

ENGINE=""
REPO="${VMPOD_IMAGE_REPO:-localhost/vmpod-node}"
TAG="${VMPOD_IMAGE_TAG:-}"
LOCAL_BASES=0
NO_CACHE=()
TARGETS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) ENGINE="$2"; shift 2 ;;
    --repo) REPO="$2"; shift 2 ;;
    --tag) TAG="$2"; shift 2 ;;
    --local-bases) LOCAL_BASES=1; shift ;;
    --no-cache) NO_CACHE=(--no-cache); shift ;;
    --target)
      case "$2" in tapmanager|libvirt|device-plugin) TARGETS+=("$2") ;; *) echo "images.sh: unknown target $2 (tapmanager, libvirt, device-plugin)" >&2; exit 2 ;; esac
      shift 2 ;;
    -h|--help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "images.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$ENGINE" ]; then
  if command -v podman >/dev/null; then ENGINE=podman; elif command -v docker >/dev/null; then ENGINE=docker; else
    echo "images.sh: neither podman nor docker found: install podman (scripts/setup.sh does)" >&2; exit 1
  fi
fi
[ -n "$TAG" ] || TAG="$(node -p 'require("./package.json").version')"
log() { echo "images.sh: $*" >&2; }

OFFICIAL_NODE=node:24-bookworm-slim
OFFICIAL_DEBIAN=debian:bookworm-slim
# Where locally made bases go: own names, so they never pass for the official images in the engine's store.
LOCAL_NODE=localhost/vmpod-node-base/node:24-bookworm-slim
LOCAL_DEBIAN=localhost/vmpod-node-base/debian:bookworm-slim
CACHE=.cache/images
# podman: host network for builds (no CNI bridge or iptables rules of podman's own on the node)
NET=()
[ "$ENGINE" = podman ] && NET=(--network host)

image_exists() {
  if [ "$ENGINE" = podman ]; then podman image exists "$1"; else docker image inspect "$1" >/dev/null 2>&1; fi
}

# Present, or pulled within 5 minutes. Where no registry answers the pull fails at once (no such host).
have_or_pull() {
  [ "$LOCAL_BASES" = 1 ] && return 1
  log "pulling $1"
  timeout 300 "$ENGINE" pull "$1" >/dev/null 2>&1
}

# The bookworm main URI of this machine's apt sources (one-line .list and deb822 .sources formats).
apt_mirror() {
  local files=()
  [ -f /etc/apt/sources.list ] && files+=(/etc/apt/sources.list)
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do [ -f "$f" ] && files+=("$f"); done
  [ "${#files[@]}" -gt 0 ] || return 1
  awk '
    /^[[:space:]]*deb[[:space:]]/ {
      sub(/\[[^]]*\][[:space:]]*/, "")
      if ($3 == "bookworm") { for (i = 4; i <= NF; i++) if ($i == "main") { print $2; exit } }
      next
    }
    /^[[:space:]]*$/ { if (types ~ /(^| )deb( |$)/ && suites ~ /(^| )bookworm( |$)/ && comps ~ /(^| )main( |$)/) { split(uris, u, " "); print u[1]; exit }
                       types = suites = comps = uris = ""; next }
    /^Types:/      { $1 = ""; types = $0 " " }
    /^URIs:/       { $1 = ""; uris = $0 }
    /^Suites:/     { $1 = ""; suites = $0 " " }
    /^Components:/ { $1 = ""; comps = $0 " " }
    END { if (types ~ /(^| )deb( |$)/ && suites ~ /(^| )bookworm( |$)/ && comps ~ /(^| )main( |$)/) { split(uris, u, " "); print u[1] } }
  ' "${files[@]}" | head -n1 | tr -d ' '
}

# debian:bookworm-slim made with debootstrap, slimmed like the official image, imported with a PATH (podman kube
# play gives containers no default PATH). The rootfs tar is kept in .cache/images for a quick re-import.
make_debian() {
  local tar="$CACHE/debian-bookworm-minbase.tar"
  if [ ! -s "$tar" ]; then
    command -v debootstrap >/dev/null || { log "debootstrap is missing: apt-get install debootstrap"; exit 1; }
    local mirror; mirror="$(apt_mirror)" || true
    [ -n "$mirror" ] || { log "no 'bookworm main' source in /etc/apt/sources.list(.d): cannot debootstrap"; exit 1; }
    local root; root="$(mktemp -d /tmp/vmpod-debootstrap.XXXXXX)"
    log "debootstrap bookworm from $mirror (about 35 s)"
    debootstrap --variant=minbase bookworm "$root" "$mirror" >&2
    cat > "$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
    echo 'Acquire::Languages "none";' > "$root/etc/apt/apt.conf.d/docker-no-languages"
    echo 'Acquire::GzipIndexes "true";' > "$root/etc/apt/apt.conf.d/docker-gzip-indexes"
    cat > "$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
    # what the exclusions would have kept out, and what a container must not inherit from the build machine
    find "$root/usr/share/doc" -mindepth 2 -not -name copyright -not -type d -delete 2>/dev/null || true
    find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
    rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/*
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb "$root"/var/log/*.log
    : > "$root/etc/resolv.conf"
    : > "$root/etc/hostname"
    mkdir -p "$CACHE"
    tar -C "$root" --numeric-owner -cf "$tar.tmp" .
    mv "$tar.tmp" "$tar"
    rm -rf "$root"
  fi
  log "importing $tar as $LOCAL_DEBIAN"
  "$ENGINE" import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' "$tar" "$LOCAL_DEBIAN" >/dev/null
}

# node:24-bookworm-slim laid out as the official image (node in /usr/local/bin, headers in /usr/local/include/node,
# npm and corepack in /usr/local/lib/node_modules, user node uid 1000), from the project's Node 24 (NODE_DIR, from
# scripts/node.sh) and this machine's npm.
make_node() {
  local nodebin="$NODE_DIR/bin/node"
  local prefix="$NODE_DIR"
  # the npm on PATH (npm root -g would name Node 24's own prefix, which has none): .../node_modules/npm/bin/npm-cli.js
  local modules; modules="$(dirname "$(dirname "$(dirname "$(readlink -f "$(command -v npm)")")")")"
  [ -d "$prefix/include/node" ] || { log "no Node headers in $prefix/include/node"; exit 1; }
  [ -d "$modules/npm" ] || { log "no npm in $modules"; exit 1; }
  local ctx; ctx="$(mktemp -d /tmp/vmpod-nodebase.XXXXXX)"
  mkdir -p "$ctx/usr/local/bin" "$ctx/usr/local/include" "$ctx/usr/local/lib/node_modules"
  cp "$nodebin" "$ctx/usr/local/bin/node"
  cp -r "$prefix/include/node" "$ctx/usr/local/include/node"
  cp -r "$modules/npm" "$ctx/usr/local/lib/node_modules/npm"
  [ -d "$modules/corepack" ] && cp -r "$modules/corepack" "$ctx/usr/local/lib/node_modules/corepack"
  ln -s ../lib/node_modules/npm/bin/npm-cli.js "$ctx/usr/local/bin/npm"
  ln -s ../lib/node_modules/npm/bin/npx-cli.js "$ctx/usr/local/bin/npx"
  [ -d "$modules/corepack" ] && ln -s ../lib/node_modules/corepack/dist/corepack.js "$ctx/usr/local/bin/corepack"
  cat > "$ctx/Dockerfile" <<EOF
FROM $LOCAL_DEBIAN
RUN groupadd --gid 1000 node && useradd --uid 1000 --gid node --shell /bin/bash --create-home node
COPY usr /usr
ENV NODE_VERSION=$("$nodebin" -p 'process.versions.node')
CMD ["node"]
EOF
  log "building $LOCAL_NODE from $nodebin ($("$nodebin" --version))"
  "$ENGINE" build "${NET[@]}" -q -t "$LOCAL_NODE" "$ctx" >/dev/null
  rm -rf "$ctx"
}

# ---- the base images ----
# official present > made here before (no registry answered then) > pulled > made here now
choose_base() { # official local maker
  if image_exists "$1"; then echo "$1"
  elif image_exists "$2"; then echo "$2"
  elif have_or_pull "$1"; then echo "$1"
  else
    log "no registry answered for $1: making $2 locally"
    "$3" && echo "$2"
  fi
}
make_node_base() {
  image_exists "$LOCAL_DEBIAN" || make_debian   # the local node base builds FROM the local Debian base
  make_node
}
debian_image="${DEBIAN_IMAGE:-}"
[ -n "$debian_image" ] || debian_image="$(choose_base "$OFFICIAL_DEBIAN" "$LOCAL_DEBIAN" make_debian)"
node_image="${NODE_IMAGE:-}"
[ -n "$node_image" ] || node_image="$(choose_base "$OFFICIAL_NODE" "$LOCAL_NODE" make_node_base)"
log "bases: NODE_IMAGE=$node_image DEBIAN_IMAGE=$debian_image"

# ---- the images ----
# npm's CA: a TLS-intercepting proxy's CA is in the machine's bundle; it rides in as a build secret, not a layer.
SECRET=()
[ -s /etc/ssl/certs/ca-certificates.crt ] && SECRET=(--secret id=npmca,src=/etc/ssl/certs/ca-certificates.crt)
[ "${#TARGETS[@]}" -gt 0 ] || TARGETS=(tapmanager libvirt device-plugin)
for target in "${TARGETS[@]}"; do
  image="$REPO/$target:$TAG"
  log "building $image (--target $target)"
  start=$(date +%s)
  "$ENGINE" build "${NET[@]}" "${NO_CACHE[@]}" "${SECRET[@]}" \
    --build-arg "NODE_IMAGE=$node_image" --build-arg "DEBIAN_IMAGE=$debian_image" \
    --target "$target" -t "$image" -f Dockerfile . >&2
  log "built $image in $(( $(date +%s) - start )) s"
  echo "$image"
done
