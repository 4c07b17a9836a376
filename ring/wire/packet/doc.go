// Package packet builds and parses the Ethernet/IPv4/IPv6/UDP headers of the
// ring engine's UDP fast path.
//
// It owns:
//   - header templates (Template) that turn a UDP payload into one or more
//     ready-to-send Ethernet frames, including IPv4/IPv6 fragmentation the way
//     Linux performs it, VLAN tagging and all checksums;
//   - parsing of received Ethernet frames (Parse) into complete UDP datagrams,
//     IP fragments or "something else" for the kernel path;
//   - the Internet checksum (Checksum, PseudoHeaderChecksum, VerifyUDP).
//
// It does not own route or neighbour resolution (the caller supplies MAC
// addresses and the MTU), IP ID allocation (the caller passes a per-destination
// counter), fragment reassembly (package ring/wire/reassembly), ICMP, or anything
// other than UDP as an upper layer.
//
// Everything on the per-packet path (Template.Frames, Template.BuildFrame,
// Parse, VerifyUDP, ParseUDPSegment, Checksum) performs no heap allocation on
// success and never panics on malformed input. Templates are immutable after
// NewTemplate and may be shared between goroutines.
package packet
