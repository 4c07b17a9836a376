package tcpstack

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"net/netip"
	"testing"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/bypassd/bypassd/internal/tsomodel"
)

// TestCopySum checks the one-pass copy and sum against gVisor's checksum
// for every length up to 100 and some large ones, at odd source offsets.
func TestCopySum(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	src := make([]byte, 70010)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	// All-ones bytes drive the carries hardest.
	ones := bytes.Repeat([]byte{0xff}, 70010)
	for _, in := range [][]byte{src, ones} {
		for _, n := range append([]int{1000, 1448, 8999, 65535, 69999}, func() []int {
			var l []int
			for i := 0; i <= 100; i++ {
				l = append(l, i)
			}
			return l
		}()...) {
			for _, off := range []int{0, 1, 3} {
				dst := make([]byte, n)
				got := copySum(dst, in[off:off+n])
				if want := checksum.Checksum(in[off:off+n], 0); uint16(got) != want {
					t.Fatalf("len %d off %d: sum %#04x, want %#04x", n, off, got, want)
				}
				if !bytes.Equal(dst, in[off:off+n]) {
					t.Fatalf("len %d off %d: copy differs", n, off)
				}
			}
		}
	}
}

// tcpPacket builds an IP packet as the stack hands it with host GSO: the
// TCP checksum field holds the pseudo-header sum of the whole packet.
func tcpPacket(src, dst netip.Addr, flags header.TCPFlags, payload []byte) []byte {
	opts := []byte{1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2} // NOP NOP timestamps
	tcpLen := header.TCPMinimumSize + len(opts)
	ipLen := header.IPv4MinimumSize
	if src.Is6() {
		ipLen = header.IPv6MinimumSize
	}
	b := make([]byte, ipLen+tcpLen+len(payload))
	total := uint16(tcpLen + len(payload))
	if src.Is4() {
		header.IPv4(b).Encode(&header.IPv4Fields{TotalLength: uint16(len(b)), ID: 0xfffe, Flags: header.IPv4FlagDontFragment,
			TTL: 64, Protocol: 6, SrcAddr: tcpip.AddrFrom4(src.As4()), DstAddr: tcpip.AddrFrom4(dst.As4())})
		header.IPv4(b).SetChecksum(^header.IPv4(b).CalculateChecksum())
	} else {
		header.IPv6(b).Encode(&header.IPv6Fields{PayloadLength: total, TransportProtocol: 6, HopLimit: 64,
			SrcAddr: tcpip.AddrFrom16(src.As16()), DstAddr: tcpip.AddrFrom16(dst.As16())})
	}
	tcp := header.TCP(b[ipLen:])
	tcp.Encode(&header.TCPFields{SrcPort: 40000, DstPort: 5201, SeqNum: 0xfffff000, AckNum: 77,
		DataOffset: uint8(tcpLen), Flags: flags, WindowSize: 512})
	copy(tcp[header.TCPMinimumSize:], opts)
	copy(b[ipLen+tcpLen:], payload)
	tcp.SetChecksum(header.PseudoHeaderChecksum(6, addr(src), addr(dst), total))
	return b
}

func addr(a netip.Addr) tcpip.Address {
	if a.Is4() {
		return tcpip.AddrFrom4(a.As4())
	}
	return tcpip.AddrFrom16(a.As16())
}

// TestSegment cuts large packets (IPv4 and IPv6, payload a multiple of the
// MSS and not) into frames and checks each as a receiver would: lengths,
// IP header checksum and IDs, sequence numbers, flags only where they
// belong, TCP checksums; the payloads put together are the original.
func TestSegment(t *testing.T) {
	const mss = 1448
	for _, fam := range []struct{ src, dst netip.Addr }{
		{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")},
		{netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")},
	} {
		for _, size := range []int{1, mss, mss + 1, 10 * mss, 44*mss - 7} {
			payload := make([]byte, size)
			for i := range payload {
				payload[i] = byte(i*7 + size)
			}
			flags := header.TCPFlagAck | header.TCPFlagPsh | header.TCPFlagFin | header.TCPFlagCwr
			pkt := tcpPacket(fam.src, fam.dst, flags, payload)
			p := newPacket(pkt, mss, true)
			want := (size + mss - 1) / mss
			if p.Frames() != want {
				t.Fatalf("%v size %d: %d frames, want %d", fam.src, size, p.Frames(), want)
			}
			var got []byte
			for i := range p.Frames() {
				buf := make([]byte, 2000)
				n := p.Build(i, buf)
				if n != p.FrameLen(i) {
					t.Fatalf("frame %d: built %d bytes, FrameLen %d", i, n, p.FrameLen(i))
				}
				f := buf[:n]
				var tcp header.TCP
				var src, dst tcpip.Address
				if fam.src.Is4() {
					ip := header.IPv4(f)
					if !ip.IsChecksumValid() || int(ip.TotalLength()) != n || ip.ID() != uint16(0xfffe+i) || ip.Flags() != header.IPv4FlagDontFragment {
						t.Fatalf("frame %d: IPv4 header: len %d id %#x flags %d checksum ok %v", i, ip.TotalLength(), ip.ID(), ip.Flags(), ip.IsChecksumValid())
					}
					tcp, src, dst = ip.Payload(), ip.SourceAddress(), ip.DestinationAddress()
				} else {
					ip := header.IPv6(f)
					if int(ip.PayloadLength()) != n-header.IPv6MinimumSize {
						t.Fatalf("frame %d: IPv6 payload length %d", i, ip.PayloadLength())
					}
					tcp, src, dst = ip.Payload(), ip.SourceAddress(), ip.DestinationAddress()
				}
				data := tcp.Payload()
				if len(data) > mss {
					t.Fatalf("frame %d: %d bytes of payload, MSS %d", i, len(data), mss)
				}
				xsum := header.PseudoHeaderChecksum(6, src, dst, uint16(len(tcp)))
				if !tcp.IsChecksumValid(src, dst, checksum.Checksum(data, 0), uint16(len(data))) || xsum == 0 {
					t.Fatalf("frame %d: TCP checksum invalid", i)
				}
				if seq := tcp.SequenceNumber(); seq != 0xfffff000+uint32(i*mss) {
					t.Fatalf("frame %d: seq %#x", i, seq)
				}
				last := i == p.Frames()-1
				fl := tcp.Flags()
				if fl.Contains(header.TCPFlagFin) != last || fl.Contains(header.TCPFlagPsh) != last ||
					fl.Contains(header.TCPFlagCwr) != (i == 0) || !fl.Contains(header.TCPFlagAck) {
					t.Fatalf("frame %d of %d: flags %v", i, p.Frames(), fl)
				}
				got = append(got, data...)
			}
			if !bytes.Equal(got, payload) {
				t.Fatalf("%v size %d: payloads differ", fam.src, size)
			}
		}
	}
}

// TestLargeForDevice: what a device that segments in hardware is handed
// (the packet as the stack built it, its MSS and header length), cut the
// way such a device cuts it (internal/tsomodel), is byte for byte what
// software segmentation puts on the wire.
func TestLargeForDevice(t *testing.T) {
	const mss = 1448
	for _, fam := range []struct{ src, dst netip.Addr }{
		{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")},
		{netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")},
	} {
		for _, size := range []int{mss + 1, 10 * mss, 44*mss - 7} {
			payload := make([]byte, size)
			for i := range payload {
				payload[i] = byte(i*13 + size)
			}
			flags := header.TCPFlagAck | header.TCPFlagPsh | header.TCPFlagFin | header.TCPFlagCwr
			pkt := tcpPacket(fam.src, fam.dst, flags, payload)
			orig := bytes.Clone(pkt)
			p := newPacket(pkt, mss, true)
			gotMSS, hdr, ok := p.Large()
			if !ok || gotMSS != mss || hdr != len(pkt)-size {
				t.Fatalf("%v size %d: Large() = %d, %d, %v; want %d, %d, true", fam.src, size, gotMSS, hdr, ok, mss, len(pkt)-size)
			}
			if n := tsomodel.Segments(len(pkt), hdr, mss); n != p.Frames() {
				t.Fatalf("%v size %d: the device makes %d segments, software %d", fam.src, size, n, p.Frames())
			}
			for i := range p.Frames() {
				sw, hw := make([]byte, 2000), make([]byte, 2000)
				n, m := p.Build(i, sw), tsomodel.Segment(hw, pkt, hdr, mss, i)
				if !bytes.Equal(sw[:n], hw[:m]) {
					t.Fatalf("%v size %d: segment %d differs:\n software % x\n device   % x", fam.src, size, i, sw[:n], hw[:m])
				}
			}
			if !bytes.Equal(pkt, orig) {
				t.Fatal("building frames changed the packet")
			}
		}
	}
	small := newPacket(tcpPacket(netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), header.TCPFlagAck, make([]byte, mss)), mss, true)
	if _, _, ok := small.Large(); ok {
		t.Fatal("a one-frame packet reported as large")
	}
}

// TestPacketAsIs: a packet without GSO options goes out byte for byte; a
// small one with a partial checksum gets it completed.
func TestPacketAsIs(t *testing.T) {
	a, b := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2")
	pkt := tcpPacket(a, b, header.TCPFlagAck, []byte("hello"))
	p := newPacket(pkt, 0, false)
	buf := make([]byte, 200)
	if n := p.Build(0, buf); p.Frames() != 1 || !bytes.Equal(buf[:n], pkt) {
		t.Fatalf("plain packet changed: % x", buf[:n])
	}
	p = newPacket(pkt, 1448, true)
	n := p.Build(0, buf)
	ip := header.IPv4(buf[:n])
	tcp := header.TCP(ip.Payload())
	if p.Frames() != 1 || !tcp.IsChecksumValid(ip.SourceAddress(), ip.DestinationAddress(), checksum.Checksum(tcp.Payload(), 0), uint16(len(tcp.Payload()))) {
		t.Fatal("partial checksum not completed")
	}
	if binary.BigEndian.Uint16(buf[4:]) != 0xfffe {
		t.Fatal("a single frame's IP ID changed")
	}
	// Headers it cannot read: as is.
	junk := []byte{0x45, 0, 0, 20}
	if p := newPacket(junk, 1448, true); p.Frames() != 1 || p.Build(0, buf) != 4 {
		t.Fatal("unreadable packet not passed as is")
	}
}

func BenchmarkSegment64K(b *testing.B) {
	pkt := tcpPacket(netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("192.0.2.2"), header.TCPFlagAck, make([]byte, 44*1448))
	p := newPacket(pkt, 1448, true)
	buf := make([]byte, 2048)
	b.SetBytes(int64(len(pkt)))
	for b.Loop() {
		for i := range p.Frames() {
			p.Build(i, buf)
		}
	}
}
