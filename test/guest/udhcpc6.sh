#!/bin/bash
# Build busybox's DHCPv6 client udhcpc6: Debian 12's busybox packages (busybox, busybox-static, udhcpc) all leave it
# out, so it is built here from Debian's own busybox source package (upstream's tarball, no Debian patches needed):
# a static busybox with the applets sh and udhcpc6 (DNS, FQDN options on), nothing else.
#   test/guest/udhcpc6.sh [OUTDIR]      default <repo>/.cache/udhcpc6; prints OUTDIR/busybox
# Used by the IPv6 client tests (`busybox udhcpc6` in a netns, test/helpers/guest.ts ensureUdhcpc6).
# Idempotent (OUTDIR/stamp = this script); a flock on OUTDIR/.lock serialises parallel callers. Takes 2 to 7 minutes
# on a busy 2-core machine, once.
# Needs (Debian): apt, gcc, libc6-dev (static libc), make, bzip2, util-linux (flock).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-$repo/.cache/udhcpc6}

die() { echo "udhcpc6.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (apt-get update of a private source list)"

stamp=$(sha256sum "$0" | cut -d' ' -f1)
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9
if [ -x "$out/busybox" ] && [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "$out/busybox"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/vmpod-udhcpc6.XXXXXX")
trap 'rm -rf "$work"' EXIT
chmod 0755 "$work"

# The machine's own Debian sources, as deb-src, in a private list dir (the system's apt state is left alone).
mkdir -p "$work/parts" "$work/lists/partial" "$work/dl"
for f in /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] || continue
  sed -n '/^Types:.*\bdeb\b/,/^$/p' "$f" | sed 's/^Types:.*/Types: deb-src/' >>"$work/parts/src.sources"
  echo >>"$work/parts/src.sources"
done
if [ -f /etc/apt/sources.list ]; then
  sed -n 's/^deb \(.*\)$/deb-src \1/p' /etc/apt/sources.list >"$work/parts/src.list"
fi
grep -q . "$work"/parts/* 2>/dev/null || die "no Debian sources in /etc/apt to take the busybox source package from"
apt_opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/parts" -o "Dir::State::Lists=$work/lists")
apt-get update -qq "${apt_opts[@]}" >&2 || die "apt-get update of the source lists failed"
if id _apt >/dev/null 2>&1; then chown _apt "$work/dl"; fi
(cd "$work/dl" && apt-get source -qq --download-only "${apt_opts[@]}" busybox >&2) || die "apt-get source busybox failed"
tarball=$(ls "$work"/dl/busybox_*.orig.tar.* | head -n 1)
mkdir "$work/src"
tar -xf "$tarball" -C "$work/src" --strip-components=1

cd "$work/src"
make -s allnoconfig >/dev/null
for o in STATIC BUSYBOX FEATURE_IPV6 UDHCPC6 FEATURE_UDHCPC6_RFC3646 FEATURE_UDHCPC6_RFC4704; do
  sed -i "s/^# CONFIG_$o is not set/CONFIG_$o=y/" .config
done
yes '' | make -s oldconfig >/dev/null 2>&1 || true
grep -q '^CONFIG_UDHCPC6=y' .config || die "busybox's config has no udhcpc6 after oldconfig"
make -s -j"$(nproc)" busybox >"$work/make.log" 2>&1 || { tail -n 30 "$work/make.log" >&2; die "building busybox failed"; }
./busybox udhcpc6 --help >/dev/null 2>&1 || [ $? = 1 ] || die "the built busybox has no working udhcpc6"
cp busybox "$out/busybox.tmp"
mv "$out/busybox.tmp" "$out/busybox"
echo "$stamp" >"$out/stamp"
echo "$out/busybox"
