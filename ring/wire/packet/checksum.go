package packet

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// Checksum returns the 16-bit ones' complement sum (RFC 1071) of b, added to
// initial, folded to 16 bits but not inverted. A checksum field takes the
// inverse (^Checksum(...)) of the sum over everything it covers; a received
// header is intact when the sum over it, checksum field included, is 0xffff.
//
// The sum is computed over 8-byte big-endian words with a 64-bit accumulator
// and end-around carries; the ones' complement sum is the same for any
// grouping of whole 16-bit words, so this equals the 16-bit definition.
func Checksum(b []byte, initial uint32) uint16 {
	return fold(sum64(b, uint64(initial)))
}

// Combine adds two folded ones' complement sums, for example the pseudo-header
// sum and the sum over a segment.
func Combine(a, b uint16) uint16 {
	s := uint32(a) + uint32(b)
	return uint16(s + s>>16)
}

// PseudoHeaderChecksum returns the folded, uninverted sum of the IPv4 or IPv6
// pseudo-header for an upper-layer segment of the given length (RFC 768,
// RFC 8200 section 8.1). src and dst must be the same family (v4-mapped IPv6
// addresses count as IPv4); for mixed or invalid addresses the result is
// meaningless but the call is safe.
func PseudoHeaderChecksum(proto uint8, src, dst netip.Addr, length uint32) uint16 {
	return fold(pseudoSum(proto, src.Unmap(), dst.Unmap(), length))
}

// pseudoSum returns the unfolded pseudo-header sum. IPv4 and IPv6 differ only
// in address width and in the width of the length field, which does not
// change a ones' complement sum.
func pseudoSum(proto uint8, src, dst netip.Addr, length uint32) uint64 {
	s := uint64(proto) + uint64(length>>16) + uint64(length&0xffff)
	if src.Is4() && dst.Is4() {
		a, b := src.As4(), dst.As4()
		s += uint64(binary.BigEndian.Uint32(a[:])) + uint64(binary.BigEndian.Uint32(b[:]))
		return s
	}
	a, b := src.As16(), dst.As16()
	return sum64(b[:], sum64(a[:], s))
}

// sum64 adds the big-endian 16-bit words of b to acc with end-around carry.
// The result is congruent to the ones' complement sum modulo 0xffff; fold
// reduces it to 16 bits.
func sum64(b []byte, acc uint64) uint64 {
	var c uint64
	// Four independent loads per iteration let the CPU overlap the loads
	// with the carry chain.
	for len(b) >= 32 {
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b), c)
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b[8:]), c)
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b[16:]), c)
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b[24:]), c)
		b = b[32:]
	}
	for len(b) >= 8 {
		acc, c = bits.Add64(acc, binary.BigEndian.Uint64(b), c)
		b = b[8:]
	}
	if len(b) >= 4 {
		acc, c = bits.Add64(acc, uint64(binary.BigEndian.Uint32(b)), c)
		b = b[4:]
	}
	if len(b) >= 2 {
		acc, c = bits.Add64(acc, uint64(binary.BigEndian.Uint16(b)), c)
		b = b[2:]
	}
	if len(b) == 1 {
		// An odd trailing byte is the high byte of a zero-padded word.
		acc, c = bits.Add64(acc, uint64(b[0])<<8, c)
	}
	// End-around carry; adding the carry can overflow only when acc was all
	// ones, and then the result is 0, so a second addition cannot overflow.
	acc, c = bits.Add64(acc, c, 0)
	return acc + c
}

// fold reduces a 64-bit end-around-carry sum to 16 bits.
func fold(s uint64) uint16 {
	s = (s >> 32) + (s & 0xffffffff) // < 2^33
	s = (s >> 16) + (s & 0xffff)     // < 2^17 + 2^16
	s = (s >> 16) + (s & 0xffff)     // <= 0xffff + 2
	s = (s >> 16) + (s & 0xffff)
	return uint16(s)
}
