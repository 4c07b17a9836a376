// Package tsomodel is a model, for tests, of how a NIC with TCP
// segmentation offload (TSO; LSO on RDMA devices such as ConnectX) cuts a
// large TCP packet: the IP and TCP headers are copied in front of each MSS
// of payload, and each segment gets its own IP length, IPv4 ID (counting up
// from the packet's) and header checksum, TCP sequence number, flags (FIN
// and PSH on the last segment only, CWR on the first only) and a TCP
// checksum computed from scratch, whatever the packet's checksum field held.
//
// It lets tests check what the engine hands a segmenting device without
// one: ring/tcpstack compares it with its software segmentation byte for
// byte, and the ring's tests put it in front of the AF_XDP provider to run
// the hardware TSO path end to end against a kernel peer. It owns no
// production code path.
package tsomodel

import (
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"
)

// Segments returns how many segments Segment makes of an IP packet of
// size bytes with hdr bytes of IP and TCP headers.
func Segments(size, hdr, mss int) int { return (size - hdr + mss - 1) / mss }

// Segment writes segment i of the large TCP packet pkt (from the IP header
// on; IPv4 or IPv6 without extension headers; hdr bytes of IP and TCP
// headers) into dst and returns its length; dst holds at least hdr+mss
// bytes.
func Segment(dst, pkt []byte, hdr, mss, i int) int {
	v4 := pkt[0]>>4 == 4
	ipLen := header.IPv6MinimumSize
	if v4 {
		ipLen = int(pkt[0]&0xf) * 4
	}
	n := Segments(len(pkt), hdr, mss)
	data := pkt[hdr+i*mss : hdr+min((i+1)*mss, len(pkt)-hdr)]
	seg := dst[:hdr+len(data)]
	copy(seg, pkt[:hdr])
	copy(seg[hdr:], data)
	var src, dstAddr tcpip.Address
	if v4 {
		ip := header.IPv4(seg)
		ip.SetTotalLength(uint16(len(seg)))
		ip.SetID(header.IPv4(pkt).ID() + uint16(i))
		ip.SetChecksum(0)
		ip.SetChecksum(^ip.CalculateChecksum())
		src, dstAddr = ip.SourceAddress(), ip.DestinationAddress()
	} else {
		ip := header.IPv6(seg)
		ip.SetPayloadLength(uint16(len(seg) - ipLen))
		src, dstAddr = ip.SourceAddress(), ip.DestinationAddress()
	}
	tcp := header.TCP(seg[ipLen:])
	tcp.SetSequenceNumber(header.TCP(pkt[ipLen:]).SequenceNumber() + uint32(i*mss))
	fl := header.TCP(pkt[ipLen:]).Flags()
	if i < n-1 {
		fl &^= header.TCPFlagFin | header.TCPFlagPsh
	}
	if i > 0 {
		fl &^= header.TCPFlagCwr
	}
	tcp.SetFlags(uint8(fl))
	tcp.SetChecksum(0)
	xsum := header.PseudoHeaderChecksum(header.TCPProtocolNumber, src, dstAddr, uint16(len(tcp)))
	tcp.SetChecksum(^checksum.Checksum(tcp, xsum))
	return len(seg)
}
