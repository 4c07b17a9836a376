#!/bin/sh
# check-generated.sh: regenerate the bpf2go output into a temporary directory
# and compare it with the committed steer_bpfel.go / steer_bpfel.o.
# Exit 0: identical (or clang absent: skipped). Exit 1: stale or differing.
# Run from anywhere; uses the //go:generate line in gen.go so the flags live
# in one place.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
cd "$here"

if ! command -v clang >/dev/null 2>&1; then
	echo "clang not installed, skipping"
	exit 0
fi
if ! command -v llvm-strip >/dev/null 2>&1; then
	echo "llvm-strip not installed (Debian: apt-get install llvm), skipping"
	exit 0
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM

# The generate command after "//go:generate ", with the output redirected.
cmd=$(sed -n 's|^//go:generate ||p' gen.go)
case "$cmd" in
*"cmd/bpf2go "*) ;;
*)
	echo "check-generated: no bpf2go //go:generate line found in gen.go" >&2
	exit 1
	;;
esac
cmd=$(printf '%s\n' "$cmd" | sed "s|cmd/bpf2go |cmd/bpf2go -go-package bpf -output-dir $tmp |")

if ! eval "$cmd"; then
	echo "check-generated: bpf2go failed (command: $cmd)" >&2
	exit 1
fi

status=0
for f in steer_bpfel.go steer_bpfel.o; do
	if [ ! -f "$f" ]; then
		echo "check-generated: $f is not committed; run 'go generate ./bpf'" >&2
		status=1
	elif ! cmp -s "$f" "$tmp/$f"; then
		echo "check-generated: $f differs from a fresh build; run 'go generate ./bpf' and commit the result" >&2
		status=1
	fi
done
if [ "$status" -ne 0 ]; then
	echo "check-generated: built with $(clang --version | head -n 1); the committed object was built with Debian clang 14.0.6, another clang version may legitimately produce a different object" >&2
	exit 1
fi
echo "check-generated: steer_bpfel.go and steer_bpfel.o are up to date"
