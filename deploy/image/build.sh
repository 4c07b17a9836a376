#!/bin/sh
# build.sh OUTDIR: the bypassd OCI image (make image), FROM scratch, with
# buildah or podman; nothing is pulled. Reproducible: static binaries
# (CGO_ENABLED=0, -trimpath, no build id), files with fixed modes and
# mtimes, and --timestamp from SOURCE_DATE_EPOCH (the last commit's time
# unless set). IMAGE_FORMAT=oci (default) is reproducible but has no
# HEALTHCHECK (the OCI image config has no such field; the Containerfile's is
# dropped); IMAGE_FORMAT=docker keeps it, but its config records the random
# id of the build container, so two builds differ in that field.
# Prints the image's digest; the image is tagged localhost/bypassd:VERSION,
# or IMAGE_TAG when set (the container test's own tag) (podman save -o FILE localhost/bypassd:VERSION exports it; the archive's
# own timestamps differ between saves, the image digest does not).
set -eu
out=${1:?usage: build.sh OUTDIR}
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
: "${SOURCE_DATE_EPOCH:=$(git log -1 --format=%ct)}"
export SOURCE_DATE_EPOCH
revision=$(git rev-parse HEAD)
: "${VERSION:=0.1.0-git$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y%m%d).$(git rev-parse --short=12 HEAD)}"
go=${GO:-go}

mkdir -p "$out"
out=$(cd "$out" && pwd)
ctx=$out/context
rm -rf "$ctx"
umask 022
mkdir -p "$ctx/bin" "$ctx/lib" "$ctx/etc"
CGO_ENABLED=0 $go build -trimpath -ldflags="-buildid= -X github.com/bypassd/bypassd/internal/buildinfo.version=$VERSION" \
	-o "$ctx/bin/" ./cmd/bypassd ./cmd/bypassctl ./cmd/bypass-stats ./cmd/bypass-perf
make -s -C socket/preload/c OUT="$ctx/lib/libbypassd.so" CFLAGS="-O2 -g -ffile-prefix-map=$top=."
printf 'root:x:0:0:root:/:/sbin/nologin\nbypassd:x:65532:65532:bypassd client:/:/sbin/nologin\n' >"$ctx/etc/passwd"
printf 'root:x:0:\nbypassd:x:65532:\n' >"$ctx/etc/group"
cp deploy/image/Containerfile "$ctx/Containerfile"
chmod 0755 "$ctx/bin/"* && chmod 0644 "$ctx/lib/libbypassd.so" "$ctx/etc/passwd" "$ctx/etc/group"
find "$ctx" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

tag=${IMAGE_TAG:-localhost/bypassd:$VERSION}
if command -v buildah >/dev/null; then
	build="buildah build"
else
	build="podman build"
fi
$build --quiet --format "${IMAGE_FORMAT:-oci}" --timestamp "$SOURCE_DATE_EPOCH" --network none --pull=never \
	--build-arg VERSION="$VERSION" --build-arg REVISION="$revision" \
	-f "$ctx/Containerfile" -t "$tag" "$ctx" >/dev/null
podman image inspect --format '{{.Digest}}' "$tag"
