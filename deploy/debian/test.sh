#!/bin/sh
# test.sh WORKDIR: make test-deb. Builds the package twice and compares the
# sha256 sums, checks the file list, modes and control fields, then unpacks
# it into a scratch root (dpkg --root would run postinst against the host's
# group database, so the files are extracted) and runs bypassd --version
# from there.
set -eu
work=${1:?usage: test.sh WORKDIR}
top=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)
fail() { echo "test-deb: FAIL: $*" >&2; exit 1; }

a=$("$top/deploy/debian/build.sh" "$work/a")
b=$("$top/deploy/debian/build.sh" "$work/b")
sa=$(sha256sum <"$a" | cut -d' ' -f1)
sb=$(sha256sum <"$b" | cut -d' ' -f1)
[ "$sa" = "$sb" ] || fail "two builds differ: $sa $sb"
echo "test-deb: two builds, one sha256 $sa"

multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
dpkg-deb -c "$a" >"$work/list"
for f in "-rwxr-xr-x root/root .* ./usr/sbin/bypassd" \
	"-rwxr-xr-x root/root .* ./usr/bin/bypassctl" \
	"-rwxr-xr-x root/root .* ./usr/bin/bypass-stats" \
	"-rwxr-xr-x root/root .* ./usr/bin/bypass-perf" \
	"-rw-r--r-- root/root .* ./usr/lib/$multiarch/libbypassd.so" \
	"-rw-r--r-- root/root .* ./lib/systemd/system/bypassd.service" \
	"-rw-r--r-- root/root .* ./etc/default/bypassd" \
	"-rw-r--r-- root/root .* ./usr/share/doc/bypassd/operations.md" \
	"-rw-r--r-- root/root .* ./usr/share/man/man8/bypassd.8.gz" \
	"-rw-r--r-- root/root .* ./usr/share/man/man1/bypassctl.1.gz" \
	"-rw-r--r-- root/root .* ./usr/share/man/man1/bypass-stats.1.gz" \
	"-rw-r--r-- root/root .* ./usr/share/man/man1/bypass-perf.1.gz"; do
	grep -q -- "^$f\$" "$work/list" || fail "no line like '$f' in dpkg-deb -c"
done
for field in Package:bypassd "Architecture:$(dpkg --print-architecture)" Section:net; do
	v=$(dpkg-deb -f "$a" "${field%%:*}")
	[ "$v" = "${field#*:}" ] || fail "control ${field%%:*} is '$v', want '${field#*:}'"
done
case $(dpkg-deb -f "$a" Version) in 0.1.0~git*) ;; *) fail "version $(dpkg-deb -f "$a" Version)" ;; esac
dpkg-deb -I "$a" postinst | grep -q 'addgroup --system bypassd' || fail "postinst does not create the bypassd group"
[ "$(dpkg-deb -I "$a" conffiles)" = /etc/default/bypassd ] || fail "conffiles"

dpkg-deb -x "$a" "$work/root"
v=$("$work/root/usr/sbin/bypassd" --version)
case $v in "bypassd 0.1.0~git"*) ;; *) fail "bypassd --version: $v" ;; esac
"$work/root/usr/bin/bypassctl" --help >/dev/null 2>&1 || "$work/root/usr/bin/bypassctl" -h >/dev/null 2>&1 || true
file "$work/root/usr/sbin/bypassd" 2>/dev/null | grep -q 'statically linked' || ! command -v file >/dev/null || fail "bypassd is not static"
# The daemon's page lists its options (from --help) and renders cleanly.
page=$work/root/usr/share/man/man8/bypassd.8.gz
zcat "$page" | grep -q 'socket\\-group' || fail "bypassd.8 lacks --socket-group"
if command -v man >/dev/null; then
	w=$(man --warnings -l "$page" 2>&1 >/dev/null) || fail "man -l bypassd.8 failed: $w"
	[ -z "$w" ] || fail "man -l bypassd.8 warns: $w"
fi
echo "test-deb: ok: $v"
rm -rf "$work"
