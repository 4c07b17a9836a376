// Package vxlan encodes and decodes the VXLAN encapsulation (RFC 7348) of
// the ring engine's overlay sockets: Ethernet frames of a virtual network
// carried in UDP (by default to port 4789) over the served NIC.
//
// It owns:
//   - the 8-byte VXLAN header (Decap, PutHeader): the I flag and the 24-bit
//     VXLAN network identifier (VNI);
//   - the outer Ethernet/IPv4/UDP/VXLAN headers of transmitted frames
//     (Encap), filled per frame with the lengths and checksums the inner
//     frame needs, and Template, which puts them in front of the frames a
//     ring/wire/packet.Template builds for the inner datagram;
//   - the outer UDP source port the Linux vxlan driver picks from a hash of
//     the inner flow (SourcePort), so one flow keeps one outer path.
//
// It does not own reading the VXLAN device's configuration or its
// forwarding database (package ring asks the kernel over netlink), the
// steering of encapsulated frames (package bpf), the inner headers
// (ring/wire/packet) or an IPv6 underlay (refused by NewEncap).
//
// The per-frame calls (Decap, Encap.Put, Template.BuildFrame) do not
// allocate and never panic on malformed input.
package vxlan
