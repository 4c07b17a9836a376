package bpf

// The object is built for little-endian BPF only (amd64 and arm64 hosts).
// -nostdinc keeps machine headers out so the result depends on clang alone;
// bpf2go already maps the source directory out of the debug info and strips
// DWARF while keeping BTF. Regenerate with `go generate ./bpf` and verify with
// bpf/check-generated.sh.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -cc clang -cflags "-O2 -g -Wall -Werror -nostdinc" -target bpfel steer c/steer.c -- -Ic
