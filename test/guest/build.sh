#!/bin/bash
# Build the tiny e2e test guest: OUTDIR/vmlinuz + OUTDIR/initrd.gz (cpio newc, gzip), from Debian packages only.
#   test/guest/build.sh [OUTDIR]        default <repo>/.cache/guest; prints the two paths, one a line
# Idempotent: skips when both outputs exist and OUTDIR/stamp matches the inputs (this script, init, the hooks, the
# CGIs, the kernel package and version, busybox's version, the udhcpc6 busybox). A flock on OUTDIR/.lock serialises parallel callers; the kernel drops it
# when a builder dies, so a crash never leaves a stale lock.
# Env: VMPOD_GUEST_KERNEL_PKG  exact Debian package to use (default: newest linux-image-6.1.0-*-cloud-amd64-unsigned,
#      else the newest linux-image-*-cloud-amd64-unsigned)
#      VMPOD_UDHCPC6_DIR  where test/guest/udhcpc6.sh builds (or finds) the busybox with udhcpc6 (default
#      <repo>/.cache/udhcpc6): Debian's busybox has no DHCPv6 client; the guest runs that one as /sbin/udhcpc6.
# Needs (Debian): apt, dpkg, busybox-static, cpio, gzip, util-linux (flock); xz-utils or zstd only
# when the chosen kernel compresses its modules (6.1 does not; 6.12 uses .ko.xz); what udhcpc6.sh needs (gcc,
# libc6-dev, make, bzip2) the first time it builds.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-$repo/.cache/guest}

# Order from each .ko's `modinfo -F depends` (docs/operations.md); insmod does not resolve dependencies.
modules=(virtio_ring virtio_pci_modern_dev virtio_pci_legacy_dev virtio virtio_pci failover net_failover virtio_net)

die() { echo "build.sh: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root (apt-get download, device-free cpio owned by 0:0)"
[ -x /bin/busybox ] || die "/bin/busybox missing: apt-get install busybox-static"
file_is_static() { ! LC_ALL=C ldd "$1" >/dev/null 2>&1; }
file_is_static /bin/busybox || die "/bin/busybox is dynamically linked: install busybox-static (not busybox)"

# Newest cloud kernel of the 6.1 series (bookworm's own), else the newest of any series. Measured under TCG here:
# 6.1 (LZ4 image, plain .ko) reaches its DHCP lease in 2.1 to 2.7 s; 6.12 from bookworm-security (ZSTD image,
# .ko.xz, virtio core built in) in 3.4 to 4.0 s. `sort -V` orders 6.1.0-56 below 6.12.117+deb12.
kernel_re='^linux-image-[0-9][^ ]*-cloud-amd64-unsigned$'
pick_kernel() {
  local all
  all=$(apt-cache pkgnames linux-image- 2>/dev/null | grep -E "$kernel_re" | sort -V || true)
  { echo "$all" | grep -E '^linux-image-6\.1\.0-' || echo "$all"; } | tail -n 1
}
kpkg=${VMPOD_GUEST_KERNEL_PKG:-}
if [ -z "$kpkg" ]; then
  kpkg=$(pick_kernel)
  if [ -z "$kpkg" ]; then
    # A fresh machine has no package lists yet.
    apt-get update -qq >&2 || die "apt-get update failed"
    kpkg=$(pick_kernel)
  fi
fi
[ -n "$kpkg" ] || die "no linux-image-*-cloud-amd64-unsigned package in apt's lists"
kver=$(apt-cache show --no-all-versions "$kpkg" 2>/dev/null | sed -n 's/^Version: //p' | head -n 1)
[ -n "$kver" ] || die "apt-cache knows no version of $kpkg"
bbver=$(dpkg-query -W -f '${Version}' busybox-static 2>/dev/null || /bin/busybox | head -n 1)

# The DHCPv6 client: built once per machine (minutes) under its own flock, before ours is taken.
busybox6=$(bash "$here/udhcpc6.sh" "${VMPOD_UDHCPC6_DIR:-$repo/.cache/udhcpc6}" | tail -n 1) || die "test/guest/udhcpc6.sh failed"
[ -x "$busybox6" ] || die "test/guest/udhcpc6.sh printed no busybox: $busybox6"

stamp=$( { echo "kernel=$kpkg=$kver busybox=$bbver modules=${modules[*]}"; \
  cat "$0" "$here/init" "$here/udhcpc.script" "$here/status.cgi" "$here/udhcpc6.script" "$here/net6.cgi" "$busybox6"; } \
  | sha256sum | cut -d' ' -f1)

mkdir -p "$out"
exec 9>"$out/.lock"
flock 9

if [ -s "$out/vmlinuz" ] && [ -s "$out/initrd.gz" ] && [ "$(cat "$out/stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "$out/vmlinuz"
  echo "$out/initrd.gz"
  exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/vmpod-guest.XXXXXX")
trap 'rm -rf "$work"' EXIT

# apt-get download fetches as user _apt when it can write the directory (else it warns and fetches as root).
chmod 0755 "$work"
mkdir "$work/deb"
if id _apt >/dev/null 2>&1; then chown _apt "$work/deb"; fi
if ! (cd "$work/deb" && apt-get download -q "$kpkg=$kver" >&2); then
  # Stale package lists name a version the archive no longer has (the security archive keeps only the newest):
  # refresh them once and start over, which picks the kernel and computes the stamp again.
  [ -z "${VMPOD_GUEST_APT_UPDATED:-}" ] || die "apt-get download $kpkg=$kver failed"
  apt-get update -qq >&2 || die "apt-get download $kpkg=$kver failed, and so did apt-get update"
  rm -rf "$work"
  exec 9>&- # release the flock: the new process takes it again
  VMPOD_GUEST_APT_UPDATED=1 exec bash "$0" "$out"
fi
deb=$(ls "$work"/deb/*.deb)
dpkg-deb -x "$deb" "$work/pkg"

vmlinuz=$(ls "$work"/pkg/boot/vmlinuz-* 2>/dev/null | head -n 1)
[ -n "$vmlinuz" ] || die "$kpkg has no boot/vmlinuz-*"
krel=${vmlinuz##*/vmlinuz-}
moddir=$work/pkg/lib/modules/$krel
[ -d "$moddir/kernel" ] || die "$kpkg has no lib/modules/$krel/kernel"

root=$work/root
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc/udhcpc,etc/udhcpc6,proc,sys,dev,tmp,www/cgi-bin,lib/modules,root}
cp /bin/busybox "$root/bin/busybox"
# One symlink per applet at the path busybox itself lists (bin/sh, sbin/ip, usr/bin/wget, ...).
while read -r applet; do
  [ "$applet" = bin/busybox ] && continue
  [ -e "$root/$applet" ] || ln -s /bin/busybox "$root/$applet"
done < <(/bin/busybox --list-full)

: > "$root/etc/vmpod-modules"
for m in "${modules[@]}"; do
  if grep -qE "/$m\.ko$" "$moddir/modules.builtin" 2>/dev/null; then
    continue # built into this kernel (6.12 has the virtio core built in)
  fi
  src=$(find "$moddir/kernel" -name "$m.ko" -o -name "$m.ko.xz" -o -name "$m.ko.zst" -o -name "$m.ko.gz" | head -n 1)
  [ -n "$src" ] || die "module $m is neither built in nor under $moddir/kernel"
  dst=$root/lib/modules/$m.ko
  # busybox insmod reads plain ELF only: decompress here.
  case $src in
    *.ko) cp "$src" "$dst" ;;
    *.ko.xz) command -v xz >/dev/null || die "$src is xz-compressed: apt-get install xz-utils"; xz -dc "$src" > "$dst" ;;
    *.ko.zst) command -v zstd >/dev/null || die "$src is zstd-compressed: apt-get install zstd"; zstd -qdc "$src" > "$dst" ;;
    *.ko.gz) gzip -dc "$src" > "$dst" ;;
  esac
  echo "$m" >> "$root/etc/vmpod-modules"
done

install -m 0755 "$here/init" "$root/init"
install -m 0755 "$here/udhcpc.script" "$root/etc/udhcpc/default.script"
install -m 0755 "$here/status.cgi" "$root/www/cgi-bin/status"
install -m 0755 "$here/net6.cgi" "$root/www/cgi-bin/net6"
# busybox picks the applet from argv[0]: /sbin/udhcpc6 runs that busybox's udhcpc6 (and `pidof udhcpc6` finds it).
install -m 0755 "$busybox6" "$root/bin/busybox6"
ln -s /bin/busybox6 "$root/sbin/udhcpc6"
install -m 0755 "$here/udhcpc6.script" "$root/etc/udhcpc6/default.script"
echo "vmpod-guest" > "$root/etc/hostname"

# Sorted names, owner 0:0, mtime 0 and cpio --reproducible (inode and device numbers renumbered) make the archive
# depend on its inputs only; gzip -n leaves out name and mtime.
find "$root" -exec touch -h -d @0 {} +
(cd "$root" && find . -mindepth 1 -print0 | LC_ALL=C sort -z \
  | cpio --null -o -H newc -R 0:0 --reproducible --quiet) | gzip -9n > "$work/initrd.gz"

# The stamp goes first and comes back last, so an interrupted copy is never taken as a finished build; each output
# is renamed into place from the same directory (rename(2) is atomic there, a cross-filesystem mv is not).
rm -f "$out/stamp"
cp "$vmlinuz" "$out/.vmlinuz.tmp" && mv -f "$out/.vmlinuz.tmp" "$out/vmlinuz"
cp "$work/initrd.gz" "$out/.initrd.gz.tmp" && mv -f "$out/.initrd.gz.tmp" "$out/initrd.gz"
echo "$kpkg=$kver $krel" > "$out/kernel-version"
echo "$stamp" > "$out/stamp"

echo "$out/vmlinuz"
echo "$out/initrd.gz"
