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
	// VNI, when not 0, makes this a flow inside a VXLAN overlay: Dst and
	// Src are then the inner datagram's, carried in UDP to VXLANPort of
	// the interface (UDP only; VNI 1..2^24-1).
	VNI       uint32
	VXLANPort uint16
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
	if f.VNI != 0 {
		return fmt.Sprintf("%s %s from %s in vxlan %d port %d", proto, f.Dst, src, f.VNI, f.VXLANPort)
	}
	return fmt.Sprintf("%s %s from %s", proto, f.Dst, src)
}

// MaxVNI is the largest VXLAN network identifier.
const MaxVNI = 1<<24 - 1

// MaxVXLANPorts is how many distinct VXLAN ports the program looks into
// at once.
const MaxVXLANPorts = 4

// flowKey mirrors struct flow_key in c/steer.c byte for byte. Only byte
// fields, so the in-memory layout is identical on every host: ports are kept
// as network-order bytes and addresses as 16 bytes (IPv4 as ::ffff:a.b.c.d).
type flowKey struct {
	Proto uint8
	VNI   [3]byte // network order
	Dport [2]byte
	Sport [2]byte
	Daddr [16]byte
	Saddr [16]byte
}

// flowVal mirrors struct flow_val.
type flowVal struct {
	Slot      uint32
	VXLANPort [2]byte // network order
	Pad       uint16
}

// vxlanPorts mirrors struct vxlan_ports.
type vxlanPorts struct {
	Port [MaxVXLANPorts][2]byte // network order; zero: empty
	Refs [MaxVXLANPorts]uint32
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
	if f.VNI != 0 || f.VXLANPort != 0 {
		if f.Proto != unix.IPPROTO_UDP {
			return k, fmt.Errorf("bpf: flow %s: only UDP is steered inside a VXLAN overlay", f)
		}
		if f.VNI == 0 || f.VNI > MaxVNI {
			return k, fmt.Errorf("bpf: flow %s: VNI %d out of range 1..%d", f, f.VNI, MaxVNI)
		}
		if f.VXLANPort == 0 {
			return k, fmt.Errorf("bpf: flow %s: an overlay flow needs its VXLAN port (the device's dstport)", f)
		}
		k.VNI = [3]byte{byte(f.VNI >> 16), byte(f.VNI >> 8), byte(f.VNI)}
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

// flow decodes a map entry. IPv4-mapped addresses come back as IPv4, so
// Flows returns the normalised form of what AddFlow was given.
func (k flowKey) flow(v flowVal) Flow {
	f := Flow{
		Proto: k.Proto,
		Dst:   netip.AddrPortFrom(netip.AddrFrom16(k.Daddr).Unmap(), binary.BigEndian.Uint16(k.Dport[:])),
		VNI:   uint32(k.VNI[0])<<16 | uint32(k.VNI[1])<<8 | uint32(k.VNI[2]),
	}
	if f.VNI != 0 {
		f.VXLANPort = binary.BigEndian.Uint16(v.VXLANPort[:])
	}
	if k.Saddr != ([16]byte{}) || k.Sport != ([2]byte{}) {
		f.Src = netip.AddrPortFrom(netip.AddrFrom16(k.Saddr).Unmap(), binary.BigEndian.Uint16(k.Sport[:]))
	}
	return f
}
