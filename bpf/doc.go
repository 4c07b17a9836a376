// Package bpf owns bypassd's XDP steering program: its C source (c/steer.c),
// the bpf2go-generated Go bindings and object (steer_bpfel.go/.o, committed),
// and the loader that attaches it to an interface and edits its maps.
//
// The program looks up each received UDP datagram in the flows map — the
// 5-tuple (proto, dst ip, dst port, src ip, src port) first, then the 3-tuple
// (proto, dst ip, dst port) — and redirects hits into the AF_XDP socket
// stored at the flow's slot of the xsks map. Everything else, and every hit
// whose slot has no socket, goes to the kernel with XDP_PASS; the program
// never drops. IPv4 and IPv6 are parsed behind up to two VLAN tags; IPv6
// hop-by-hop, routing and destination-options headers are skipped. IP
// fragments follow their first fragment: a first fragment that matches a
// flow records the datagram's identity in an LRU map, and later fragments
// with that identity go to the same slot. A later fragment that overtakes
// its first fragment goes to the kernel (fragments of one datagram arrive in
// order on one link, so this is the rare case), and the two halves of that
// datagram are then lost to both receivers.
//
// VXLAN overlays: a flow with a VNI (Flow.VNI, Flow.VXLANPort) lives inside
// a tunnel. While such flows exist, the program looks into unfragmented
// UDP datagrams to their VXLAN ports (at most MaxVXLANPorts, counted in the
// vxlan_ports map): the inner Ethernet frame is parsed like an outer one
// and looked up with the VNI in the key, so only the overlay socket's
// datagrams are redirected (whole, outer headers included; the engine
// decapsulates). Other VNIs, ARP and everything else in the tunnel reach the
// kernel's vxlan device unchanged.
//
// The package does not own AF_XDP sockets, UMEM or rings (package ring creates
// them and hands their fds to Program.SetSocket), nor the policy of which
// flows are offloaded (package daemon).
//
// Attachment uses a bpf_link, so the program disappears when the process that
// attached it dies: a crashed daemon never leaves a stale steering program
// behind. The flip side is that `ip link set dev X xdp off` cannot remove it
// (the kernel answers "Can't replace active BPF XDP link"); operators detach
// it with `bpftool link detach id N` (see Program.LinkID), which
// Program.Attached then reports.
//
// Headers: c/bpfdefs.h declares the few UAPI constants, helper numbers and
// wire-format structs the program needs, instead of a vmlinux.h dumped from
// one kernel or libbpf's installed headers. Those definitions are fixed
// kernel ABI, and with -nostdinc the object depends only on the clang
// version, so `go generate` is reproducible on any machine (bpf2go removes
// the source path from debug info and strips DWARF, keeping BTF).
// check-generated.sh verifies that the committed object matches the source.
package bpf
