package packet

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
)

// Header sizes and UDP limits.
const (
	EthHdrLen      = 14
	VLANTagLen     = 4
	IPv4HdrLen     = 20
	IPv6HdrLen     = 40
	IPv6FragHdrLen = 8
	UDPHdrLen      = 8

	// MaxUDPPayload4 is the largest UDP payload over IPv4: 65535 minus the
	// IPv4 and UDP headers.
	MaxUDPPayload4 = 65507
	// MaxUDPPayload6 is the largest UDP payload over IPv6 without
	// jumbograms: the 16-bit payload length minus the UDP header.
	MaxUDPPayload6 = 65527

	// MinMTU4 and MinMTU6 are the smallest link MTUs IPv4 (RFC 791) and
	// IPv6 (RFC 8200) allow.
	MinMTU4 = 68
	MinMTU6 = 1280
	// MaxMTU is the largest L3 MTU a template accepts; an IP packet cannot
	// be longer anyway.
	MaxMTU = 65535
)

// EtherType values used by the fast path.
const (
	EtherTypeIPv4 = 0x0800
	EtherTypeARP  = 0x0806
	EtherTypeVLAN = 0x8100 // 802.1Q C-tag
	EtherTypeQinQ = 0x88a8 // 802.1ad S-tag
	EtherTypeIPv6 = 0x86dd
)

// IP protocol numbers used by the fast path.
const (
	ProtoICMP     = 1
	ProtoUDP      = 17
	ProtoTCP      = 6
	ProtoIPv6Frag = 44
	ProtoICMPv6   = 58
)

const (
	ipv4FlagDF   = 0x4000
	ipv4FlagMF   = 0x2000
	ipv4OffMask  = 0x1fff
	ipv6FragMore = 0x0001
	ipv6OffMask  = 0xfff8
)

// TemplateOptions are the per-destination header settings.
type TemplateOptions struct {
	TTL      uint8  // IPv4 TTL / IPv6 hop limit; 0 means the default 64
	TOS      uint8  // IPv4 TOS / IPv6 traffic class (DSCP and ECN bits)
	VLAN     uint16 // 0 = untagged; else an 802.1Q tag with this VID (1..4094)
	Priority uint8  // PCP 0..7 of the 802.1Q tag; ignored when VLAN is 0
	// DontFragment sets the IPv4 DF bit; datagrams larger than the MTU are
	// then refused with ErrTooBig instead of being fragmented. IPv6 has no
	// DF bit and ignores it.
	DontFragment bool
	// FlowLabel is the 20-bit IPv6 flow label; ignored for IPv4.
	FlowLabel uint32
}

// Template holds prebuilt Ethernet + IPv4/IPv6 + UDP headers for one (src,
// dst) pair and link MTU. It is immutable after NewTemplate, so one template
// may be used by several goroutines at once.
//
// The UDP checksum of a datagram covers its whole payload but appears only in
// frame 0 (the frame carrying the UDP header), so BuildFrame computes the
// payload checksum only when building frame 0: building frames 0..n-1 of a
// datagram sums its payload exactly once, with no state kept between calls.
type Template struct {
	hdr    [EthHdrLen + VLANTagLen + IPv6HdrLen + UDPHdrLen]byte
	ethLen int // 14, or 18 with a VLAN tag
	ipLen  int // 20 or 40
	v6     bool
	df     bool
	mtu    int

	src, dst netip.AddrPort

	fitPayload int // largest UDP payload sent in a single frame
	maxPayload int // largest UDP payload accepted at all
	fragData   int // data bytes per fragment (multiple of 8, largest that fits)

	ipSum  uint64 // IPv4: sum of the header words that never change
	udpSum uint64 // pseudo-header without length, plus both ports
}

// NewTemplate prebuilds the headers for datagrams from src to dst. srcMAC and
// dstMAC must be 6-byte Ethernet addresses; src and dst must be the same
// family (v4-mapped IPv6 addresses are unmapped to IPv4; IPv6 zones are
// dropped, the wire does not carry them); mtu is the L3 MTU of the link
// (68..65535 for IPv4, 1280..65535 for IPv6).
func NewTemplate(srcMAC, dstMAC net.HardwareAddr, src, dst netip.AddrPort, mtu int, opts TemplateOptions) (*Template, error) {
	if len(srcMAC) != 6 {
		return nil, fmt.Errorf("packet: new template: source MAC %q is %d bytes, need a 6-byte Ethernet address", srcMAC, len(srcMAC))
	}
	if len(dstMAC) != 6 {
		return nil, fmt.Errorf("packet: new template: destination MAC %q is %d bytes, need a 6-byte Ethernet address (resolve the neighbour first)", dstMAC, len(dstMAC))
	}
	sa, da := src.Addr().Unmap().WithZone(""), dst.Addr().Unmap().WithZone("")
	if !sa.IsValid() || !da.IsValid() {
		return nil, fmt.Errorf("packet: new template: source %v or destination %v has no IP address", src, dst)
	}
	if sa.Is4() != da.Is4() {
		return nil, fmt.Errorf("packet: new template: source %v and destination %v are different address families; use IPv4 or IPv6 on both sides", src, dst)
	}
	if dst.Port() == 0 {
		return nil, fmt.Errorf("packet: new template: destination %v has port 0, which cannot be sent to", dst)
	}
	v6 := sa.Is6()
	minMTU := MinMTU4
	if v6 {
		minMTU = MinMTU6
	}
	if mtu < minMTU || mtu > MaxMTU {
		return nil, fmt.Errorf("packet: new template: MTU %d out of range %d..%d for %s; check the interface MTU", mtu, minMTU, MaxMTU, family(v6))
	}
	if opts.VLAN > 4094 {
		return nil, fmt.Errorf("packet: new template: VLAN ID %d out of range 1..4094 (0 = untagged)", opts.VLAN)
	}
	if opts.Priority > 7 {
		return nil, fmt.Errorf("packet: new template: VLAN priority %d out of range 0..7", opts.Priority)
	}
	if opts.FlowLabel > 0xfffff {
		return nil, fmt.Errorf("packet: new template: IPv6 flow label %#x exceeds 20 bits", opts.FlowLabel)
	}
	ttl := opts.TTL
	if ttl == 0 {
		ttl = 64
	}

	t := &Template{
		v6:  v6,
		df:  opts.DontFragment && !v6,
		mtu: mtu,
		src: netip.AddrPortFrom(sa, src.Port()),
		dst: netip.AddrPortFrom(da, dst.Port()),
	}

	// Ethernet header, optionally 802.1Q tagged.
	h := t.hdr[:]
	copy(h[0:6], dstMAC)
	copy(h[6:12], srcMAC)
	etherType := uint16(EtherTypeIPv4)
	if v6 {
		etherType = EtherTypeIPv6
	}
	if opts.VLAN != 0 {
		binary.BigEndian.PutUint16(h[12:], EtherTypeVLAN)
		binary.BigEndian.PutUint16(h[14:], uint16(opts.Priority)<<13|opts.VLAN)
		binary.BigEndian.PutUint16(h[16:], etherType)
		t.ethLen = EthHdrLen + VLANTagLen
	} else {
		binary.BigEndian.PutUint16(h[12:], etherType)
		t.ethLen = EthHdrLen
	}

	ip := h[t.ethLen:]
	if v6 {
		t.ipLen = IPv6HdrLen
		binary.BigEndian.PutUint32(ip[0:], 6<<28|uint32(opts.TOS)<<20|opts.FlowLabel)
		// ip[4:6] payload length is per frame.
		ip[6] = ProtoUDP
		ip[7] = ttl
		s, d := sa.As16(), da.As16()
		copy(ip[8:24], s[:])
		copy(ip[24:40], d[:])
		t.fitPayload = mtu - IPv6HdrLen - UDPHdrLen
		t.maxPayload = MaxUDPPayload6
		t.fragData = (mtu - IPv6HdrLen - IPv6FragHdrLen) &^ 7
	} else {
		t.ipLen = IPv4HdrLen
		ip[0] = 0x45
		ip[1] = opts.TOS
		// ip[2:8] total length, ID, flags/offset and ip[10:12] checksum are per frame.
		ip[8] = ttl
		ip[9] = ProtoUDP
		s, d := sa.As4(), da.As4()
		copy(ip[12:16], s[:])
		copy(ip[16:20], d[:])
		t.ipSum = sum64(ip[:IPv4HdrLen], 0)
		t.fitPayload = mtu - IPv4HdrLen - UDPHdrLen
		t.maxPayload = MaxUDPPayload4
		if t.df {
			t.maxPayload = t.fitPayload
		}
		t.fragData = (mtu - IPv4HdrLen) &^ 7
	}
	if t.fitPayload > t.maxPayload {
		t.fitPayload = t.maxPayload
	}

	udp := ip[t.ipLen:]
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	t.udpSum = pseudoSum(ProtoUDP, sa, da, 0) + uint64(src.Port()) + uint64(dst.Port())
	return t, nil
}

func family(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

// Src returns the source address and port (unmapped, without zone).
func (t *Template) Src() netip.AddrPort { return t.src }

// Dst returns the destination address and port (unmapped, without zone).
func (t *Template) Dst() netip.AddrPort { return t.dst }

// MTU returns the L3 MTU the template fragments for.
func (t *Template) MTU() int { return t.mtu }

// MaxFrameLen returns the largest frame this template produces: the Ethernet
// header (with VLAN tag, if any) plus the MTU. Buffers of this size fit every
// frame.
func (t *Template) MaxFrameLen() int { return t.ethLen + t.mtu }

// MaxPayload returns the largest UDP payload Frames and BuildFrame accept:
// the family limit, or the single-frame limit with DontFragment.
func (t *Template) MaxPayload() int { return t.maxPayload }

// HeaderLen returns the header bytes in front of the UDP payload of an
// unfragmented datagram (Ethernet, VLAN tag, IP and UDP headers).
func (t *Template) HeaderLen() int { return t.ethLen + t.ipLen + UDPHdrLen }

// Frames returns how many Ethernet frames carry a UDP payload of payloadLen
// bytes: 1 if it fits the MTU, else the number of IP fragments. It returns an
// error matching ErrTooBig beyond the family limit (MaxUDPPayload4,
// MaxUDPPayload6) or beyond the MTU with DontFragment.
func (t *Template) Frames(payloadLen int) (int, error) {
	if payloadLen < 0 {
		return 0, errBadPayloadLen
	}
	if payloadLen <= t.fitPayload {
		return 1, nil
	}
	if payloadLen > t.maxPayload {
		return 0, t.tooBig(payloadLen)
	}
	return (UDPHdrLen + payloadLen + t.fragData - 1) / t.fragData, nil
}

func (t *Template) tooBig(n int) error {
	why := "largest UDP datagram over " + family(t.v6)
	if t.df {
		why = fmt.Sprintf("IPv4 MTU %d with DontFragment set", t.mtu)
	}
	return &TooBigError{Size: n, Limit: t.maxPayload, Why: why}
}

// BuildFrame writes frame i (0 <= i < Frames(len(payload))) of the datagram
// carrying payload into buf and returns the frame's length. buf must hold
// MaxFrameLen bytes (or at least the frame).
//
// Frame 0 carries the UDP header with the checksum over the whole datagram
// (a computed 0 is sent as 0xffff, RFC 768 / RFC 8200). A datagram larger than
// the MTU is split the way Linux does it (RFC 791 / RFC 8200): every fragment
// but the last carries the largest multiple of 8 data bytes that fits the
// MTU, all fragments share the IP ID (IPv4: the low 16 bits of ipID; IPv6:
// the 32-bit fragment identification), and all but the last have MF set.
// Frames are not padded to the 60-byte Ethernet minimum; the NIC does that.
//
// Only frame 0 reads the whole payload; frames i > 0 copy just their slice of
// it, so building all frames sums the payload once in total.
//
// For a datagram that fits in one frame, payload may alias
// buf[HeaderLen():], so a caller can place the payload in the frame buffer
// first and build the headers in front of it without a second copy. For
// fragmented datagrams payload must not overlap buf.
func (t *Template) BuildFrame(buf []byte, payload []byte, i int, ipID uint32) (int, error) {
	n, err := t.Frames(len(payload))
	if err != nil {
		return 0, err
	}
	if i < 0 || i >= n {
		return 0, errFrameIndex
	}
	udpLen := UDPHdrLen + len(payload)

	if n == 1 {
		hl := t.ethLen + t.ipLen
		flen := hl + udpLen
		if len(buf) < flen {
			return 0, errShortBuffer
		}
		copy(buf, t.hdr[:hl+UDPHdrLen])
		if t.v6 {
			binary.BigEndian.PutUint16(buf[t.ethLen+4:], uint16(udpLen))
		} else {
			var flags uint16
			if t.df {
				flags = ipv4FlagDF
			}
			t.finishIPv4(buf[t.ethLen:], IPv4HdrLen+udpLen, uint16(ipID), flags)
		}
		udp := buf[hl:flen]
		copy(udp[UDPHdrLen:], payload)
		t.finishUDP(udp, udpLen, payload)
		return flen, nil
	}

	// Fragment i carries bytes [off, end) of the UDP segment (header + payload).
	off := i * t.fragData
	end := min(off+t.fragData, udpLen)
	more := end < udpLen
	hl := t.ethLen + t.ipLen
	if t.v6 {
		hl += IPv6FragHdrLen
	}
	flen := hl + end - off
	if len(buf) < flen {
		return 0, errShortBuffer
	}
	copy(buf, t.hdr[:t.ethLen+t.ipLen])
	ip := buf[t.ethLen:]
	if t.v6 {
		binary.BigEndian.PutUint16(ip[4:], uint16(IPv6FragHdrLen+end-off))
		ip[6] = ProtoIPv6Frag
		fh := ip[IPv6HdrLen : IPv6HdrLen+IPv6FragHdrLen]
		fh[0] = ProtoUDP
		fh[1] = 0
		fo := uint16(off)
		if more {
			fo |= ipv6FragMore
		}
		binary.BigEndian.PutUint16(fh[2:], fo)
		binary.BigEndian.PutUint32(fh[4:], ipID)
	} else {
		fo := uint16(off / 8)
		if more {
			fo |= ipv4FlagMF
		}
		t.finishIPv4(ip, IPv4HdrLen+end-off, uint16(ipID), fo)
	}
	data := buf[hl:flen]
	if i == 0 {
		copy(data, t.hdr[t.ethLen+t.ipLen:t.ethLen+t.ipLen+UDPHdrLen])
		copy(data[UDPHdrLen:], payload[:end-UDPHdrLen])
		t.finishUDP(data, udpLen, payload)
	} else {
		copy(data, payload[off-UDPHdrLen:end-UDPHdrLen])
	}
	return flen, nil
}

// finishIPv4 fills the per-frame IPv4 fields and the header checksum, adding
// only the changed words to the precomputed sum.
func (t *Template) finishIPv4(ip []byte, totalLen int, id, flagsOff uint16) {
	binary.BigEndian.PutUint16(ip[2:], uint16(totalLen))
	binary.BigEndian.PutUint16(ip[4:], id)
	binary.BigEndian.PutUint16(ip[6:], flagsOff)
	s := t.ipSum + uint64(totalLen) + uint64(id) + uint64(flagsOff)
	binary.BigEndian.PutUint16(ip[10:], ^fold(s))
}

// finishUDP fills length and checksum of the UDP header at udp[:8] for a
// datagram carrying payload; udp may hold only the first fragment's data.
func (t *Template) finishUDP(udp []byte, udpLen int, payload []byte) {
	binary.BigEndian.PutUint16(udp[4:], uint16(udpLen))
	// The length counts twice: once in the pseudo-header, once in the header.
	s := t.udpSum + 2*uint64(udpLen) + uint64(payloadSum(payload))
	c := ^fold(s)
	if c == 0 {
		c = 0xffff // 0 means "no checksum" on IPv4 and is illegal on IPv6
	}
	binary.BigEndian.PutUint16(udp[6:], c)
}

// payloadSum is a variable only so tests can count how often BuildFrame sums
// a payload; nothing else may change it.
var payloadSum = func(b []byte) uint16 { return fold(sum64(b, 0)) }
