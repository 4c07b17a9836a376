package tap

import (
	"encoding/binary"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The u32 selectors of the fallback path. Offsets are from the IP header;
// keys with offMask -1 are relative to the transport header ("nexthdr+" in
// tc's syntax), whose offset the address's link filter computes from the
// IPv4 header length.

const (
	ipProtoTCP      = 6
	ipProtoUDP      = 17
	ipv6NextFrag    = 44
	nextHdr         = -1 // key offset relative to the transport header
	u32Terminal     = nl.TC_U32_TERMINAL
	u32VarOffset    = nl.TC_U32_VAROFFSET
	ipv4HeaderBytes = 20
	ipv6HeaderBytes = 40
)

// sel is a selector over keys; the slice is clipped because the netlink
// encoder sends its whole capacity (spare capacity would become extra
// match-anything keys).
func sel(flags uint8, keys ...nl.TcU32Key) *nl.TcU32Sel {
	return &nl.TcU32Sel{Flags: flags, Keys: slices.Clip(keys)}
}

func key(off int32, mask, val uint32) nl.TcU32Key {
	return nl.TcU32Key{Off: off, Mask: mask, Val: val & mask}
}

func nextKey(off int32, mask, val uint32) nl.TcU32Key {
	k := key(off, mask, val)
	k.OffMask = nextHdr
	return k
}

// addrKeys match the destination (dst) or source address of a packet.
func addrKeys(a netip.Addr, dst bool) []nl.TcU32Key {
	if a.Is4() {
		off := int32(12)
		if dst {
			off = 16
		}
		b := a.As4()
		return []nl.TcU32Key{key(off, 0xffffffff, binary.BigEndian.Uint32(b[:]))}
	}
	off := int32(8)
	if dst {
		off = 24
	}
	b := a.As16()
	keys := make([]nl.TcU32Key, 4)
	for i := range keys {
		keys[i] = key(off+int32(4*i), 0xffffffff, binary.BigEndian.Uint32(b[4*i:]))
	}
	return keys
}

// protoKey matches an IP protocol (IPv4 protocol, or IPv6 next header
// without extension headers); udpKey UDP; fragKey IPv6 fragments (IPv4
// fragments are told by their offset field instead).
func protoKey(v6 bool, proto uint8) nl.TcU32Key {
	if v6 {
		return key(4, 0x0000ff00, uint32(proto)<<8)
	}
	return key(8, 0x00ff0000, uint32(proto)<<16)
}

func udpKey(v6 bool) nl.TcU32Key { return protoKey(v6, ipProtoUDP) }

// keyProto returns the protocol a protoKey matches (ok false: k is not
// one).
func keyProto(v6 bool, k nl.TcU32Key) (uint8, bool) {
	if v6 && k.Off == 4 && k.Mask == 0x0000ff00 && k.OffMask == 0 {
		return uint8(k.Val >> 8), true
	}
	if !v6 && k.Off == 8 && k.Mask == 0x00ff0000 && k.OffMask == 0 {
		return uint8(k.Val >> 16), true
	}
	return 0, false
}

func ipv6FragKey() nl.TcU32Key { return key(4, 0x0000ff00, ipv6NextFrag<<8) }

// unfragmentedKey matches IPv4 packets with MF clear and offset 0.
func unfragmentedKey() nl.TcU32Key { return key(4, 0x00003fff, 0) }

// flowKeys match the protocol, the destination port and, when src is
// valid, the source port and address. UDP and TCP put the ports in the
// same place.
func flowKeys(v6 bool, proto uint8, dport uint16, src netip.AddrPort) []nl.TcU32Key {
	mk := nextKey
	var off int32
	if v6 {
		mk, off = key, ipv6HeaderBytes
	}
	keys := []nl.TcU32Key{protoKey(v6, proto), mk(off, 0x0000ffff, uint32(dport))}
	if src.IsValid() {
		keys = append(keys, mk(off, 0xffff0000, uint32(src.Port())<<16))
		keys = append(keys, addrKeys(src.Addr(), false)...)
	}
	return keys
}

// linkSel is the selector of an address's link filter: it hashes on the
// low byte of the destination port (assuming an IPv4 header without
// options; a packet with options lands in another bucket, misses, and goes
// to the kernel) and, for IPv4, computes the transport offset. It matches
// any protocol (unfragmented IPv4): the flow filters match UDP or TCP, and
// a packet that none takes goes on to the address's next filters.
func linkSel(a netip.Addr) *nl.TcU32Sel {
	keys := addrKeys(a, true)
	if a.Is6() {
		s := sel(0, keys...)
		s.Hoff, s.Hmask = ipv6HeaderBytes, 0x000000ff
		return s
	}
	s := sel(u32VarOffset, append(keys, unfragmentedKey())...)
	s.Hoff, s.Hmask = ipv4HeaderBytes, 0x000000ff
	s.Offmask, s.Offshift = 0x0f00, 6 // IHL × 4
	return s
}

// protoOf is the filter protocol of an address family.
func protoOf(v6 bool) uint16 {
	if v6 {
		return unix.ETH_P_IPV6
	}
	return unix.ETH_P_IP
}
