#!/bin/sh
# build.sh OUTDIR: the bypassd Debian package, reproducibly (make deb).
# Binaries are static Go builds (CGO_ENABLED=0, -trimpath, no build id) and
# libbypassd.so is built with the source path mapped away; every file gets
# its mode set here and its mtime from SOURCE_DATE_EPOCH (the last commit's
# time unless set), which dpkg-deb applies to the archive. Two builds of one
# commit are byte-identical. Man pages are generated from each binary's
# --help (manpage.sh). gzip, not xz: several times faster to build on a
# busy machine, for a package about a third larger.
set -eu
out=${1:?usage: build.sh OUTDIR}
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
: "${SOURCE_DATE_EPOCH:=$(git log -1 --format=%ct)}"
export SOURCE_DATE_EPOCH
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
commit=$(git rev-parse --short=12 HEAD)
: "${VERSION:=0.1.0~git$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y%m%d).$commit}"
go=${GO:-go}

mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$out/root
rm -rf "$root"
umask 022
install -d -m 0755 "$root/DEBIAN" "$root/usr/sbin" "$root/usr/bin" "$root/usr/lib/$multiarch" \
	"$root/lib/systemd/system" "$root/etc/default" "$root/usr/share/doc/bypassd"

CGO_ENABLED=0 $go build -trimpath -ldflags="-buildid= -X github.com/bypassd/bypassd/internal/buildinfo.version=$VERSION" \
	-o "$out/gobin/" ./cmd/bypassd ./cmd/bypassctl ./cmd/bypass-stats ./cmd/bypass-perf
install -m 0755 "$out/gobin/bypassd" "$root/usr/sbin/bypassd"
for b in bypassctl bypass-stats bypass-perf; do
	install -m 0755 "$out/gobin/$b" "$root/usr/bin/$b"
done
# Man pages from the binaries' own --help (deploy/debian/manpage.sh).
install -d -m 0755 "$root/usr/share/man/man1" "$root/usr/share/man/man8"
manpage() { # BINARY SECTION SUMMARY [SUBCOMMAND...]
	b=$1 sec=$2
	deploy/debian/manpage.sh "$@" | gzip -9n >"$root/usr/share/man/man$sec/$(basename "$b").$sec.gz"
}
manpage "$out/gobin/bypassd" 8 "kernel-bypass UDP acceleration daemon (AF_XDP)"
manpage "$out/gobin/bypassctl" 1 "ask or tell a running bypassd"
manpage "$out/gobin/bypass-stats" 1 "show the counters bypassd publishes for a process"
manpage "$out/gobin/bypass-perf" 1 "sockperf-compatible UDP benchmark through bypassd" server ping-pong under-load throughput
chmod 0644 "$root"/usr/share/man/man*/*
make -s -C socket/preload/c OUT="$out/libbypassd.so" CFLAGS="-O2 -g -ffile-prefix-map=$top=."
install -m 0644 "$out/libbypassd.so" "$root/usr/lib/$multiarch/libbypassd.so"
install -m 0644 deploy/systemd/bypassd.service "$root/lib/systemd/system/bypassd.service"
install -m 0644 deploy/debian/default "$root/etc/default/bypassd"
install -m 0644 README.md docs/*.md "$root/usr/share/doc/bypassd/"
for s in postinst prerm postrm; do
	install -m 0755 "deploy/debian/$s" "$root/DEBIAN/$s"
done
echo /etc/default/bypassd >"$root/DEBIAN/conffiles"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CTL
Package: bypassd
Version: $VERSION
Architecture: $arch
Maintainer: bypassd developers <bypassd@localhost>
Depends: libc6, adduser | passwd
Section: net
Priority: optional
Installed-Size: $size
Homepage: https://github.com/bypassd/bypassd
Description: kernel-bypass UDP acceleration daemon (AF_XDP)
 bypassd serves applications' UDP sockets from AF_XDP rings, bypassing the
 kernel's network stack. Applications use it through the Go socket package
 or, unmodified, through libbypassd.so under LD_PRELOAD. Members of the
 bypassd group may connect to the control socket /run/bypassd/bypassd.sock.
CTL
chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/conffiles"
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
deb=$out/bypassd_${VERSION}_$arch.deb
dpkg-deb --root-owner-group -Zgzip --build "$root" "$deb" >/dev/null
echo "$deb"
