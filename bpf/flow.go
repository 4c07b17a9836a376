package bpf

import (
	"encoding/binary"
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// Sizes fixed by c/steer.c.
const (
	// DefaultMaxFlows is the capacity of the flows map when Options.MaxFlows is 0.
	DefaultMaxFlows = 65536
	// MaxSockets is the default number of slots in the xsks map (valid
	// slots 0..MaxSockets-1); Options.Queues raises it for NICs with more
	// queues.
	MaxSockets = 64
)

// Flow identifies offloaded traffic. A zero Src makes it a 3-tuple flow that
// matches any source; a 5-tuple flow for the same destination takes
// precedence over it.
type Flow struct {
	Proto uint8          // unix.IPPROTO_UDP or unix.IPPROTO_TCP
	Dst   netip.AddrPort // required: local address and port
	Src   netip.AddrPort // zero value = 3-tuple (any source)
}

// String renders the flow for errors and logs, e.g. "udp 10.0.0.1:53 from any".
func (f Flow) String() string {
	proto := fmt.Sprintf("proto %d", f.Proto)
	switch f.Proto {
	case unix.IPPROTO_UDP:
		proto = "udp"
	case unix.IPPROTO_TCP:
		proto = "tcp"
	}
	src := "any"
	if f.Src.IsValid() {
		src = f.Src.String()
	}
	return fmt.Sprintf("%s %s from %s", proto, f.Dst, src)
}

// flowKey mirrors struct flow_key in c/steer.c byte for byte. Only byte
// fields, so the in-memory layout is identical on every host: ports are kept
// as network-order bytes and addresses as 16 bytes (IPv4 as ::ffff:a.b.c.d).
type flowKey struct {
	Proto uint8
	Pad   [3]uint8
	Dport [2]byte
	Sport [2]byte
	Daddr [16]byte
	Saddr [16]byte
}

// flowVal mirrors struct flow_val.
type flowVal struct {
	Slot  uint32
	Flags uint32
}

// Indexes of the counters map, mirroring enum counter_idx.
const (
	counterRedirected uint32 = iota
	counterPassed
	counterNoSocket
	counterFragments
	counterMalformed
	counterOtherQueue
	counterNoQueueSocket
	counterMax
)

// key validates f and encodes it as the program's map key.
func (f Flow) key() (flowKey, error) {
	var k flowKey
	if f.Proto != unix.IPPROTO_UDP && f.Proto != unix.IPPROTO_TCP {
		return k, fmt.Errorf("bpf: flow %s: protocol %d is not steered by this program, use unix.IPPROTO_UDP (%d) or unix.IPPROTO_TCP (%d)",
			f, f.Proto, unix.IPPROTO_UDP, unix.IPPROTO_TCP)
	}
	if !f.Dst.IsValid() || f.Dst.Port() == 0 {
		return k, fmt.Errorf("bpf: flow %s: destination address and port are required", f)
	}
	dst := f.Dst.Addr().Unmap().WithZone("")
	if dst.IsUnspecified() {
		return k, fmt.Errorf("bpf: flow %s: destination must be a concrete local address, not %s", f, dst)
	}
	k.Proto = f.Proto
	binary.BigEndian.PutUint16(k.Dport[:], f.Dst.Port())
	k.Daddr = dst.As16()
	if !f.Src.IsValid() {
		return k, nil // 3-tuple: saddr and sport stay zero
	}
	src := f.Src.Addr().Unmap().WithZone("")
	if src.IsUnspecified() {
		return k, fmt.Errorf("bpf: flow %s: source %s is unspecified; use the zero netip.AddrPort to match any source", f, src)
	}
	if src.Is4() != dst.Is4() {
		return k, fmt.Errorf("bpf: flow %s: source and destination must both be IPv4 or both IPv6", f)
	}
	binary.BigEndian.PutUint16(k.Sport[:], f.Src.Port())
	k.Saddr = src.As16()
	return k, nil
}

// flow decodes a map key. IPv4-mapped addresses come back as IPv4, so
// Flows returns the normalised form of what AddFlow was given.
func (k flowKey) flow() Flow {
	f := Flow{
		Proto: k.Proto,
		Dst:   netip.AddrPortFrom(netip.AddrFrom16(k.Daddr).Unmap(), binary.BigEndian.Uint16(k.Dport[:])),
	}
	if k.Saddr != ([16]byte{}) || k.Sport != ([2]byte{}) {
		f.Src = netip.AddrPortFrom(netip.AddrFrom16(k.Saddr).Unmap(), binary.BigEndian.Uint16(k.Sport[:]))
	}
	return f
}
