package packet

import (
	"encoding/binary"
	"net/netip"
	"strconv"
)

// Kind classifies a parsed frame.
type Kind uint8

const (
	// KindOther is anything the fast path does not handle itself: non-IP
	// (ARP, LLDP, ...) and IP packets of other protocols (ICMP, TCP, ...).
	KindOther Kind = iota
	// KindUDP is a complete, unfragmented UDP datagram.
	KindUDP
	// KindFragment is an IPv4 or IPv6 fragment of any protocol; feed it to
	// package ring/wire/reassembly.
	KindFragment
)

func (k Kind) String() string {
	switch k {
	case KindOther:
		return "other"
	case KindUDP:
		return "udp"
	case KindFragment:
		return "fragment"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Frame is the result of Parse. All byte slices alias the parsed frame.
type Frame struct {
	Kind Kind
	// Src and Dst: for KindUDP addresses and ports; for KindFragment and IP
	// packets of KindOther addresses only (ports 0); zero for non-IP.
	Src, Dst netip.AddrPort
	// Payload: KindUDP: the UDP payload; KindFragment: the fragment's data
	// after the IP (and IPv6 fragment) header; KindOther IP packets: the
	// upper-layer bytes after the IP and extension headers; nil for non-IP.
	Payload []byte
	// Proto is the IP protocol: 17 for UDP; for fragments the protocol of
	// the fragmented payload; for other IP packets the upper-layer protocol.
	Proto uint8
	// FragID is the IPv4 ID or IPv6 fragment identification (KindFragment).
	FragID uint32
	// FragOff is the fragment's byte offset in the original payload.
	FragOff int
	// More is the fragment's MF flag (more fragments follow).
	More bool
	// UDPChecksum is the checksum field as received (KindUDP). 0 means "no
	// checksum" on IPv4 and is invalid on IPv6 (VerifyUDP rejects it).
	UDPChecksum uint16
	// Segment is the UDP header plus payload (KindUDP), for VerifyUDP.
	Segment []byte
	// EtherType is the type after any VLAN tags.
	EtherType uint16
	// VLAN is the VID of the outermost VLAN tag, 0 if untagged; PCP its
	// priority bits and Tagged whether there was a tag at all.
	VLAN   uint16
	PCP    uint8
	Tagged bool
	// TOS is the IPv4 TOS byte / IPv6 traffic class (DSCP and ECN).
	TOS uint8
}

// VerifyUDP checks the UDP checksum of a KindUDP frame; false for any other kind.
func (f *Frame) VerifyUDP() bool {
	return f.Kind == KindUDP && VerifyUDP(f.Src.Addr(), f.Dst.Addr(), f.Segment)
}

// IPv6 extension headers Parse skips (RFC 8200 section 4).
const (
	ipv6HopByHop = 0
	ipv6Routing  = 43
	ipv6DestOpts = 60
)

// Parse parses one Ethernet frame (up to two VLAN tags are skipped) into f,
// overwriting all of it. It checks every length (IP total length against the
// frame, with Ethernet padding trimmed; UDP length against the IP payload) and
// the IPv4 header checksum, and returns an error matching ErrMalformed for
// malformed IP or UDP packets; f is then zeroed (KindOther). It does not
// verify the UDP checksum: call VerifyUDP unless the NIC already did.
//
// IPv6 Hop-by-Hop, Routing and Destination Options headers are skipped; an
// IPv6 "atomic fragment" (fragment header with offset 0 and no MF, RFC 6946)
// is treated as an unfragmented packet. Jumbograms are not supported.
func Parse(frame []byte, f *Frame) error {
	*f = Frame{}
	if len(frame) < EthHdrLen {
		return errShortEthernet
	}
	et := binary.BigEndian.Uint16(frame[12:])
	p := frame[EthHdrLen:]
	for tags := 0; et == EtherTypeVLAN || et == EtherTypeQinQ; tags++ {
		if tags == 2 {
			return fail(f, errTooManyVLANs)
		}
		if len(p) < VLANTagLen {
			return fail(f, errShortVLAN)
		}
		if tags == 0 {
			tci := binary.BigEndian.Uint16(p)
			f.VLAN, f.PCP, f.Tagged = tci&0x0fff, uint8(tci>>13), true
		}
		et = binary.BigEndian.Uint16(p[2:])
		p = p[VLANTagLen:]
	}
	f.EtherType = et
	var err error
	switch et {
	case EtherTypeIPv4:
		err = parseIPv4(p, f)
	case EtherTypeIPv6:
		err = parseIPv6(p, f)
	}
	if err != nil {
		return fail(f, err)
	}
	return nil
}

func fail(f *Frame, err error) error {
	*f = Frame{}
	return err
}

func parseIPv4(p []byte, f *Frame) error {
	if len(p) < IPv4HdrLen {
		return errShortIPv4
	}
	if p[0]>>4 != 4 {
		return errIPv4Version
	}
	ihl := int(p[0]&0x0f) * 4
	if ihl < IPv4HdrLen || ihl > len(p) {
		return errIPv4IHL
	}
	total := int(binary.BigEndian.Uint16(p[2:]))
	if total < ihl || total > len(p) {
		return errIPv4TotalLen
	}
	// A nonzero header always sums to 0xffff when its checksum is right.
	if fold(sum64(p[:ihl], 0)) != 0xffff {
		return errIPv4Checksum
	}
	p = p[:total] // drop Ethernet padding
	f.TOS = p[1]
	f.Src = netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[12:16])), 0)
	f.Dst = netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[16:20])), 0)
	f.Proto = p[9]
	payload := p[ihl:]
	fo := binary.BigEndian.Uint16(p[6:])
	if fo&(ipv4FlagMF|ipv4OffMask) != 0 {
		return fragment(f, payload, uint32(binary.BigEndian.Uint16(p[4:])), int(fo&ipv4OffMask)*8, fo&ipv4FlagMF != 0)
	}
	if f.Proto != ProtoUDP {
		f.Payload = payload
		return nil
	}
	return parseUDP(payload, f)
}

func parseIPv6(p []byte, f *Frame) error {
	if len(p) < IPv6HdrLen {
		return errShortIPv6
	}
	if p[0]>>4 != 6 {
		return errIPv6Version
	}
	pl := int(binary.BigEndian.Uint16(p[4:]))
	if IPv6HdrLen+pl > len(p) {
		return errIPv6PayloadLen
	}
	f.TOS = uint8(binary.BigEndian.Uint16(p) >> 4)
	f.Src = netip.AddrPortFrom(netip.AddrFrom16([16]byte(p[8:24])), 0)
	f.Dst = netip.AddrPortFrom(netip.AddrFrom16([16]byte(p[24:40])), 0)
	nh := p[6]
	p = p[IPv6HdrLen : IPv6HdrLen+pl] // drop Ethernet padding
	seenFrag := false
	// Every extension header consumes at least 8 bytes, so the loop ends.
	for {
		switch nh {
		case ipv6HopByHop, ipv6Routing, ipv6DestOpts:
			if len(p) < 8 {
				return errIPv6ExtHdr
			}
			n := (int(p[1]) + 1) * 8
			if n > len(p) {
				return errIPv6ExtHdr
			}
			nh = p[0]
			p = p[n:]
		case ProtoIPv6Frag:
			if seenFrag {
				return errIPv6TwoFrag
			}
			if len(p) < IPv6FragHdrLen {
				return errIPv6ExtHdr
			}
			seenFrag = true
			next := p[0]
			fo := binary.BigEndian.Uint16(p[2:])
			id := binary.BigEndian.Uint32(p[4:])
			p = p[IPv6FragHdrLen:]
			if fo&(ipv6OffMask|ipv6FragMore) == 0 {
				nh = next // atomic fragment: a whole packet (RFC 6946)
				continue
			}
			f.Proto = next
			return fragment(f, p, id, int(fo&ipv6OffMask), fo&ipv6FragMore != 0)
		case ProtoUDP:
			f.Proto = ProtoUDP
			return parseUDP(p, f)
		default:
			f.Proto = nh
			f.Payload = p
			return nil
		}
	}
}

// fragment fills f for an IP fragment. A non-final fragment must carry a
// multiple of 8 bytes (RFC 791, RFC 8200 section 4.5) and an empty fragment
// carries nothing to reassemble; both are dropped here.
func fragment(f *Frame, data []byte, id uint32, off int, more bool) error {
	if len(data) == 0 {
		return errFragEmpty
	}
	if more && len(data)%8 != 0 {
		return errFragAlign
	}
	f.Kind = KindFragment
	f.FragID = id
	f.FragOff = off
	f.More = more
	f.Payload = data
	return nil
}

func parseUDP(seg []byte, f *Frame) error {
	sp, dp, payload, err := ParseUDPSegment(seg)
	if err != nil {
		return err
	}
	seg = seg[:UDPHdrLen+len(payload)]
	f.Kind = KindUDP
	f.Proto = ProtoUDP
	f.Src = netip.AddrPortFrom(f.Src.Addr(), sp)
	f.Dst = netip.AddrPortFrom(f.Dst.Addr(), dp)
	f.UDPChecksum = binary.BigEndian.Uint16(seg[6:])
	f.Segment = seg
	f.Payload = payload
	return nil
}

// ParseUDPSegment splits a UDP segment (8-byte header + payload, for example
// a reassembled datagram) into ports and payload. The length field must be at
// least 8 and at most len(seg); bytes beyond it are ignored, as Linux trims
// them. The returned payload aliases seg.
func ParseUDPSegment(seg []byte) (srcPort, dstPort uint16, payload []byte, err error) {
	if len(seg) < UDPHdrLen {
		return 0, 0, nil, errShortUDP
	}
	ul := int(binary.BigEndian.Uint16(seg[4:]))
	if ul < UDPHdrLen || ul > len(seg) {
		return 0, 0, nil, errUDPLen
	}
	return binary.BigEndian.Uint16(seg[0:]), binary.BigEndian.Uint16(seg[2:]), seg[UDPHdrLen:ul], nil
}

// VerifyUDP checks the UDP checksum of a complete datagram: src and dst are
// the IP addresses (v4-mapped IPv6 counts as IPv4), udpSegment the UDP header
// plus payload, as in Frame.Segment or a reassembled datagram. The length
// field decides how many bytes are covered; a checksum field of 0 passes on
// IPv4 (no checksum) and fails on IPv6 (mandatory there, RFC 8200).
func VerifyUDP(src, dst netip.Addr, udpSegment []byte) bool {
	src, dst = src.Unmap(), dst.Unmap()
	if !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4() {
		return false
	}
	if len(udpSegment) < UDPHdrLen {
		return false
	}
	ul := int(binary.BigEndian.Uint16(udpSegment[4:]))
	if ul < UDPHdrLen || ul > len(udpSegment) {
		return false
	}
	seg := udpSegment[:ul]
	if binary.BigEndian.Uint16(seg[6:]) == 0 {
		return src.Is4()
	}
	return fold(sum64(seg, pseudoSum(ProtoUDP, src, dst, uint32(ul)))) == 0xffff
}
