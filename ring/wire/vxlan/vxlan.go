package vxlan

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"net/netip"

	"github.com/bypassd/bypassd/ring/wire/packet"
)

const (
	// HeaderLen is the size of the VXLAN header.
	HeaderLen = 8
	// DefaultPort is the IANA port of VXLAN (RFC 7348); Linux's vxlan
	// devices use 8472 unless created with `dstport 4789`.
	DefaultPort = 4789
	// MaxVNI is the largest VXLAN network identifier (24 bits).
	MaxVNI = 1<<24 - 1
	// EncapLen4 is what the encapsulation adds in front of an inner frame
	// over an IPv4 underlay: Ethernet, IPv4, UDP and VXLAN headers.
	EncapLen4 = packet.EthHdrLen + packet.IPv4HdrLen + packet.UDPHdrLen + HeaderLen
	// Overhead4 is what the encapsulation costs an inner frame's MTU
	// budget on the underlay (Linux's VXLAN_HEADROOM): the outer IPv4,
	// UDP and VXLAN headers plus the inner Ethernet header.
	Overhead4 = packet.IPv4HdrLen + packet.UDPHdrLen + HeaderLen + packet.EthHdrLen

	flagI = 0x08 // the VNI is valid (RFC 7348 section 5)
)

// ErrMalformed matches every error Decap returns.
var ErrMalformed = errors.New("vxlan: malformed header")

var (
	errShort = fmt.Errorf("%w: shorter than the 8-byte VXLAN header plus an Ethernet header", ErrMalformed)
	errFlag  = fmt.Errorf("%w: the I flag is clear (no valid VNI)", ErrMalformed)
)

// Decap parses the VXLAN header at the start of a UDP payload and returns
// the VNI and the inner Ethernet frame (aliasing b). Reserved bits are
// ignored, as receivers must (RFC 7348 section 5).
func Decap(b []byte) (vni uint32, inner []byte, err error) {
	if len(b) < HeaderLen+packet.EthHdrLen {
		return 0, nil, errShort
	}
	if b[0]&flagI == 0 {
		return 0, nil, errFlag
	}
	return binary.BigEndian.Uint32(b[4:]) >> 8, b[HeaderLen:], nil
}

// PutHeader writes a VXLAN header for vni into b[:HeaderLen].
func PutHeader(b []byte, vni uint32) {
	b[0], b[1], b[2], b[3] = flagI, 0, 0, 0
	binary.BigEndian.PutUint32(b[4:], vni<<8)
}

// Outer describes the outer headers of one encapsulated flow.
type Outer struct {
	// SrcMAC is the underlay interface's address, DstMAC the next hop's
	// toward the remote VTEP.
	SrcMAC, DstMAC net.HardwareAddr
	// Src is the local VTEP address, Dst the remote VTEP's (IPv4).
	Src, Dst netip.Addr
	// SrcPort is the outer UDP source port (see SourcePort), DstPort the
	// VXLAN port.
	SrcPort, DstPort uint16
	// VNI is the virtual network (1..MaxVNI).
	VNI uint32
	// TTL of the outer header (0: 64); TOS its ToS byte.
	TTL, TOS uint8
	// Checksum fills the outer UDP checksum (the device's udpcsum);
	// without it the field is 0, which IPv4 allows and Linux sends by
	// default.
	Checksum bool
}

// Encap holds the prebuilt outer headers of one flow. Put fills the
// per-frame fields; it keeps the outer IPv4 identification counter, so an
// Encap is used by one goroutine at a time.
type Encap struct {
	hdr      [EncapLen4]byte
	ipSum    uint64 // sum of the IPv4 header words that never change
	pseudo   uint32 // pseudo-header sum without the length (for Checksum)
	checksum bool
	id       uint16
}

// NewEncap checks o and prebuilds its headers.
func NewEncap(o Outer) (*Encap, error) {
	if len(o.SrcMAC) != 6 || len(o.DstMAC) != 6 {
		return nil, fmt.Errorf("vxlan: outer MACs %q and %q must be 6-byte Ethernet addresses (resolve the remote VTEP's next hop first)", o.SrcMAC, o.DstMAC)
	}
	src, dst := o.Src.Unmap(), o.Dst.Unmap()
	if !src.Is4() || !dst.Is4() {
		return nil, fmt.Errorf("vxlan: outer addresses %v -> %v: only an IPv4 underlay is supported; give the VXLAN device IPv4 local and remote addresses", o.Src, o.Dst)
	}
	if o.VNI == 0 || o.VNI > MaxVNI {
		return nil, fmt.Errorf("vxlan: VNI %d out of range 1..%d", o.VNI, MaxVNI)
	}
	if o.DstPort == 0 {
		return nil, errors.New("vxlan: the VXLAN destination port is 0; give the device a dstport (4789)")
	}
	ttl := o.TTL
	if ttl == 0 {
		ttl = 64
	}
	x := &Encap{checksum: o.Checksum}
	h := x.hdr[:]
	copy(h[0:], o.DstMAC)
	copy(h[6:], o.SrcMAC)
	binary.BigEndian.PutUint16(h[12:], packet.EtherTypeIPv4)
	ip := h[packet.EthHdrLen:]
	ip[0], ip[1] = 0x45, o.TOS
	ip[8], ip[9] = ttl, packet.ProtoUDP
	s4, d4 := src.As4(), dst.As4()
	copy(ip[12:], s4[:])
	copy(ip[16:], d4[:])
	for i := 0; i < packet.IPv4HdrLen; i += 2 {
		x.ipSum += uint64(binary.BigEndian.Uint16(ip[i:]))
	}
	udp := ip[packet.IPv4HdrLen:]
	binary.BigEndian.PutUint16(udp[0:], o.SrcPort)
	binary.BigEndian.PutUint16(udp[2:], o.DstPort)
	PutHeader(udp[packet.UDPHdrLen:], o.VNI)
	x.pseudo = uint32(packet.PseudoHeaderChecksum(packet.ProtoUDP, src, dst, 0))
	return x, nil
}

// Len is how many bytes the encapsulation puts in front of an inner frame.
func (x *Encap) Len() int { return EncapLen4 }

// Put writes the outer headers into frame[:Len()] for the inner Ethernet
// frame in frame[Len():] (all of the rest of frame).
func (x *Encap) Put(frame []byte) error {
	if len(frame) < EncapLen4+packet.EthHdrLen {
		return fmt.Errorf("vxlan: frame of %d bytes has no room for the outer headers and an inner frame", len(frame))
	}
	total := len(frame) - packet.EthHdrLen
	if total > 0xffff {
		return fmt.Errorf("vxlan: inner frame of %d bytes does not fit one outer IPv4 packet", len(frame)-EncapLen4)
	}
	copy(frame, x.hdr[:])
	ip := frame[packet.EthHdrLen:]
	binary.BigEndian.PutUint16(ip[2:], uint16(total))
	binary.BigEndian.PutUint16(ip[4:], x.id)
	s := x.ipSum + uint64(total) + uint64(x.id)
	x.id++
	s = (s & 0xffff) + (s >> 16)
	s = (s & 0xffff) + (s >> 16)
	s = (s & 0xffff) + (s >> 16)
	binary.BigEndian.PutUint16(ip[10:], ^uint16(s))
	udp := ip[packet.IPv4HdrLen:]
	udpLen := total - packet.IPv4HdrLen
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen))
	if x.checksum {
		c := ^packet.Checksum(udp, x.pseudo+uint32(udpLen))
		if c == 0 {
			c = 0xffff
		}
		binary.BigEndian.PutUint16(udp[6:], c)
	}
	return nil
}

// DefaultPortRange is the outer source port range of a device created
// without `srcport`: Linux's default ip_local_port_range.
var DefaultPortRange = [2]uint16{32768, 60999}

// SourcePort picks the outer UDP source port of an inner flow in
// [low, high] (both 0: DefaultPortRange): a hash of the flow, as the Linux
// driver does, so that ECMP on the underlay keeps a flow on one path while
// different flows spread.
func SourcePort(src, dst netip.AddrPort, low, high uint16) uint16 {
	if low == 0 && high == 0 {
		low, high = DefaultPortRange[0], DefaultPortRange[1]
	}
	if high < low {
		low, high = high, low
	}
	h := fnv.New32a()
	b, _ := src.MarshalBinary()
	_, _ = h.Write(b)
	b, _ = dst.MarshalBinary()
	_, _ = h.Write(b)
	return low + uint16(h.Sum32()%(uint32(high-low)+1))
}

// Template builds encapsulated frames: the inner datagram's frames from a
// packet.Template, each behind the outer headers of an Encap. It has the
// methods of packet.Template that the ring's transmit path uses.
type Template struct {
	Inner *packet.Template
	Encap *Encap
}

// HeaderLen is the bytes of headers in front of a single-frame datagram's
// payload.
func (t *Template) HeaderLen() int { return t.Encap.Len() + t.Inner.HeaderLen() }

// Frames is how many frames a payload of n bytes takes (inner
// fragmentation at the overlay's MTU).
func (t *Template) Frames(n int) (int, error) { return t.Inner.Frames(n) }

// Src is the inner source address.
func (t *Template) Src() netip.AddrPort { return t.Inner.Src() }

// BuildFrame builds frame i of a datagram into buf (see
// packet.Template.BuildFrame) and returns its length.
func (t *Template) BuildFrame(buf, payload []byte, i int, ipID uint32) (int, error) {
	off := t.Encap.Len()
	if len(buf) < off {
		return 0, fmt.Errorf("vxlan: buffer of %d bytes has no room for the outer headers", len(buf))
	}
	n, err := t.Inner.BuildFrame(buf[off:], payload, i, ipID)
	if err != nil {
		return 0, err
	}
	if err := t.Encap.Put(buf[:off+n]); err != nil {
		return 0, err
	}
	return off + n, nil
}
