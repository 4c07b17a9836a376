package tcpstack

// Software TSO. The stack hands the link TCP segments of up to 64 KiB with
// the checksum left to the link, as Linux hands them to a NIC with TCP
// segmentation offload (gVisor's "host GSO": the TCP checksum field holds
// the pseudo-header sum of the whole packet). The engine cuts each into
// frames of one MSS of payload, copying the headers with their per-frame
// fields (IP length, IPv4 ID and header checksum, TCP sequence number and
// flags) and the payload while summing it, so every byte is read once.

import (
	"encoding/binary"
	"math/bits"
)

// maxTSOFrames bounds the frames one large packet becomes, so that the
// engine can take send buffers for all of them at once (its batch holds
// more); GSOMaxSize follows from it and the MTU.
const maxTSOFrames = 44

// Packet is one outbound IP packet of the stack: a single frame, or a
// large TCP segment for the engine to cut into frames (Frames > 1).
type Packet struct {
	// IP is the packet, from the IP header on.
	IP []byte
	// mss is the payload of each frame but the last of a large packet (0:
	// the packet is one frame). csum: the TCP checksum field holds only
	// the pseudo-header sum; the frames get it complete.
	mss  int
	csum bool
	// ipLen and tcpLen are the header lengths (set when csum or mss is).
	ipLen, tcpLen int
}

// newPacket describes b (the stack's serialized packet) for the engine;
// mss > 0 and csum come from the packet's GSO options. A packet whose
// headers cannot be read goes out as it is.
func newPacket(b []byte, mss int, csum bool) Packet {
	p := Packet{IP: b}
	if mss <= 0 && !csum {
		return p
	}
	ipLen := 0
	switch {
	case len(b) >= 20 && b[0]>>4 == 4 && b[9] == 6:
		ipLen = int(b[0]&0xf) * 4
	case len(b) >= 40 && b[0]>>4 == 6 && b[6] == 6:
		ipLen = 40
	default:
		return p
	}
	if len(b) < ipLen+20 {
		return p
	}
	tcpLen := int(b[ipLen+12]>>4) * 4
	if tcpLen < 20 || len(b) < ipLen+tcpLen {
		return p
	}
	p.ipLen, p.tcpLen, p.csum = ipLen, tcpLen, csum
	if mss > 0 && len(b)-ipLen-tcpLen > mss {
		p.mss = mss
	}
	return p
}

// Frames returns how many frames the packet becomes.
func (p *Packet) Frames() int {
	if p.mss == 0 {
		return 1
	}
	payload := len(p.IP) - p.ipLen - p.tcpLen
	return (payload + p.mss - 1) / p.mss
}

// Large reports whether the packet is a large TCP segment (more than one
// frame) and returns its MSS and the length of its IP and TCP headers, for
// a device that segments in hardware. Such a device takes IP as it is: the
// IPv4 total length and header checksum of the whole packet, and in the
// TCP checksum field the pseudo-header sum over the whole segment (with
// NeedsCsum, what Linux hands a NIC with TSO); it writes each segment's.
func (p *Packet) Large() (mss, hdr int, ok bool) {
	if p.mss == 0 {
		return 0, 0, false
	}
	return p.mss, p.ipLen + p.tcpLen, true
}

// FrameLen returns the IP length of frame i.
func (p *Packet) FrameLen(i int) int {
	if p.mss == 0 {
		return len(p.IP)
	}
	hdr := p.ipLen + p.tcpLen
	return hdr + min(p.mss, len(p.IP)-hdr-i*p.mss)
}

// Build writes frame i (from the IP header on) into dst, which holds at
// least FrameLen(i) bytes, and returns its length.
func (p *Packet) Build(i int, dst []byte) int {
	if p.mss == 0 && !p.csum {
		return copy(dst, p.IP)
	}
	hdr := p.ipLen + p.tcpLen
	n := p.FrameLen(i)
	off := hdr
	if p.mss > 0 {
		off += i * p.mss
	}
	payload := n - hdr
	copy(dst[:hdr], p.IP[:hdr])
	ip, tcp := dst[:p.ipLen], dst[p.ipLen:hdr]
	var pseudo uint32
	tcpTotal := uint32(n - p.ipLen)
	if ip[0]>>4 == 4 {
		binary.BigEndian.PutUint16(ip[2:], uint16(n))
		binary.BigEndian.PutUint16(ip[4:], binary.BigEndian.Uint16(p.IP[4:])+uint16(i))
		ip[10], ip[11] = 0, 0
		binary.BigEndian.PutUint16(ip[10:], ^fold(sum16(ip)))
		pseudo = sum16(ip[12:20])
	} else {
		binary.BigEndian.PutUint16(ip[4:], uint16(tcpTotal))
		pseudo = sum16(ip[8:40])
	}
	pseudo += 6 + tcpTotal
	if p.mss > 0 {
		seq := binary.BigEndian.Uint32(p.IP[p.ipLen+4:])
		binary.BigEndian.PutUint32(tcp[4:], seq+uint32(i*p.mss))
		const fin, psh, cwr = 0x01, 0x08, 0x80
		if i < p.Frames()-1 {
			tcp[13] &^= fin | psh
		}
		if i > 0 {
			tcp[13] &^= cwr
		}
	}
	tcp[16], tcp[17] = 0, 0
	s := pseudo + sum16(tcp) + copySum(dst[hdr:n], p.IP[off:off+payload])
	binary.BigEndian.PutUint16(tcp[16:], ^fold(s))
	return n
}

// sum16 is the ones' complement sum of b as big-endian 16-bit words (an
// odd last byte is the high half of a word), not folded.
func sum16(b []byte) uint32 {
	var s uint32
	for len(b) >= 2 {
		s += uint32(binary.BigEndian.Uint16(b))
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	return s
}

// fold folds a 32-bit ones' complement sum to 16 bits.
func fold(s uint32) uint16 {
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// copySum copies src into dst (len(dst) >= len(src)) and returns the ones'
// complement sum of src like sum16, folded to 16 bits: one pass, eight
// bytes at a time. Words are loaded little-endian, which sums byte-swapped
// 16-bit words (RFC 1071: the sum is byte-order independent), and swapped
// back at the end.
func copySum(dst, src []byte) uint32 {
	var acc, carries, c uint64
	i := 0
	for ; i+32 <= len(src); i += 32 {
		a := binary.LittleEndian.Uint64(src[i:])
		b := binary.LittleEndian.Uint64(src[i+8:])
		d := binary.LittleEndian.Uint64(src[i+16:])
		e := binary.LittleEndian.Uint64(src[i+24:])
		binary.LittleEndian.PutUint64(dst[i:], a)
		binary.LittleEndian.PutUint64(dst[i+8:], b)
		binary.LittleEndian.PutUint64(dst[i+16:], d)
		binary.LittleEndian.PutUint64(dst[i+24:], e)
		acc, c = bits.Add64(acc, a, 0)
		carries += c
		acc, c = bits.Add64(acc, b, 0)
		carries += c
		acc, c = bits.Add64(acc, d, 0)
		carries += c
		acc, c = bits.Add64(acc, e, 0)
		carries += c
	}
	for ; i+8 <= len(src); i += 8 {
		a := binary.LittleEndian.Uint64(src[i:])
		binary.LittleEndian.PutUint64(dst[i:], a)
		acc, c = bits.Add64(acc, a, 0)
		carries += c
	}
	if i < len(src) {
		var tail [8]byte
		copy(tail[:], src[i:])
		copy(dst[i:len(src)], src[i:])
		acc, c = bits.Add64(acc, binary.LittleEndian.Uint64(tail[:]), 0)
		carries += c
	}
	// 2^64 is 1 modulo 2^16-1: the carries out of acc add in at the bottom.
	s := acc&0xffffffff + acc>>32 + carries
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint32(bits.ReverseBytes16(uint16(s)))
}
