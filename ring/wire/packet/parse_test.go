package packet

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"
	"unsafe"
)

// frameOf builds a single-frame datagram with the template of tmplCases[i].
func frameOf(t testing.TB, i int, payload []byte) []byte {
	t.Helper()
	tm := newTestTemplate(t, tmplCases[i])
	buf := make([]byte, tm.MaxFrameLen())
	n, err := tm.BuildFrame(buf, payload, 0, 0x1234)
	if err != nil {
		t.Fatal(err)
	}
	return buf[:n]
}

// fixIPv4 recomputes the IPv4 header checksum after a test edits the header.
func fixIPv4(fr []byte) []byte {
	ip := fr[EthHdrLen:]
	ihl := int(ip[0]&0xf) * 4
	if ihl < 20 || ihl > len(ip) {
		return fr
	}
	ip[10], ip[11] = 0, 0
	binary.BigEndian.PutUint16(ip[10:], ^refSum(ip[:ihl], 0))
	return fr
}

func clone(b []byte) []byte { return append([]byte(nil), b...) }

// edit4 returns a copy of a plain IPv4 UDP frame (64-byte payload) changed by fn,
// with the header checksum fixed afterwards.
func edit4(t testing.TB, fn func(fr []byte) []byte) []byte {
	return fixIPv4(fn(clone(frameOf(t, 0, testPayload(64, 9)))))
}

// edit6 returns a copy of a plain IPv6 UDP frame (64-byte payload) changed by fn.
func edit6(t testing.TB, fn func(fr []byte) []byte) []byte {
	return fn(clone(frameOf(t, 6, testPayload(64, 9))))
}

// insertV6Ext puts extension headers between the IPv6 header and the UDP
// header; first is the first extension header's type.
func insertV6Ext(fr []byte, first byte, ext []byte) []byte {
	ip := fr[EthHdrLen:]
	out := append(clone(fr[:EthHdrLen+IPv6HdrLen]), ext...)
	out = append(out, ip[IPv6HdrLen:]...)
	oip := out[EthHdrLen:]
	binary.BigEndian.PutUint16(oip[4:], binary.BigEndian.Uint16(ip[4:])+uint16(len(ext)))
	oip[6] = first
	return out
}

func TestParseMalformed(t *testing.T) {
	t.Parallel()
	v4 := frameOf(t, 0, testPayload(64, 9))
	for _, c := range []struct {
		name  string
		frame []byte
	}{
		{"empty", nil},
		{"13 bytes", v4[:13]},
		{"IPv4 EtherType, no IP header", v4[:EthHdrLen]},
		{"VLAN truncated", []byte{1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 0x81, 0x00, 0x00}},
		{"three VLAN tags", []byte{1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 0x88, 0xa8, 0, 1, 0x81, 0, 0, 2, 0x81, 0, 0, 3, 0x08, 0x00}},
		{"IPv4 truncated", v4[:EthHdrLen+19]},
		{"IPv4 version 5", edit4(t, func(f []byte) []byte { f[14] = 0x55; return f })},
		{"IPv4 IHL 4", edit4(t, func(f []byte) []byte { f[14] = 0x44; return f })},
		{"IPv4 IHL beyond frame", edit4(t, func(f []byte) []byte { f[14] = 0x4f; return f[:EthHdrLen+40] })},
		{"IPv4 total length beyond frame", edit4(t, func(f []byte) []byte { binary.BigEndian.PutUint16(f[16:], uint16(len(f)-13)); return f })},
		{"IPv4 total length below IHL", edit4(t, func(f []byte) []byte { binary.BigEndian.PutUint16(f[16:], 19); return f })},
		{"IPv4 bad header checksum", func() []byte { f := clone(v4); f[24] ^= 1; return f }()},
		{"UDP truncated", edit4(t, func(f []byte) []byte { binary.BigEndian.PutUint16(f[16:], 24); return f[:EthHdrLen+24] })},
		{"UDP length beyond IP", edit4(t, func(f []byte) []byte { binary.BigEndian.PutUint16(f[38:], 73); return f })},
		{"UDP length 7", edit4(t, func(f []byte) []byte { binary.BigEndian.PutUint16(f[38:], 7); return f })},
		{"IPv4 fragment unaligned", edit4(t, func(f []byte) []byte { f[20] = 0x20; return f[:len(f)-1] })},
		{"IPv4 fragment empty", edit4(t, func(f []byte) []byte {
			binary.BigEndian.PutUint16(f[16:], 20)
			binary.BigEndian.PutUint16(f[20:], 8)
			return f[:EthHdrLen+20]
		})},
		{"IPv6 truncated", edit6(t, func(f []byte) []byte { return f[:EthHdrLen+39] })},
		{"IPv6 version 4", edit6(t, func(f []byte) []byte { f[14] = 0x45; return f })},
		{"IPv6 payload length beyond frame", edit6(t, func(f []byte) []byte { binary.BigEndian.PutUint16(f[18:], 73); return f })},
		{"IPv6 ext header truncated", edit6(t, func(f []byte) []byte {
			f = insertV6Ext(f, ipv6DestOpts, []byte{17, 0, 1, 4, 0, 0, 0, 0})
			binary.BigEndian.PutUint16(f[18:], 4)
			return f[:EthHdrLen+IPv6HdrLen+4]
		})},
		{"IPv6 ext header length beyond payload", edit6(t, func(f []byte) []byte {
			return insertV6Ext(f, ipv6HopByHop, []byte{17, 200, 1, 4, 0, 0, 0, 0})
		})},
		{"IPv6 two fragment headers", edit6(t, func(f []byte) []byte {
			return insertV6Ext(f, ProtoIPv6Frag, []byte{44, 0, 0, 0, 0, 0, 0, 1, 17, 0, 0, 0, 0, 0, 0, 1})
		})},
		{"IPv6 fragment unaligned", edit6(t, func(f []byte) []byte {
			f = insertV6Ext(f, ProtoIPv6Frag, []byte{17, 0, 0, 1, 0, 0, 0, 1})
			binary.BigEndian.PutUint16(f[18:], binary.BigEndian.Uint16(f[18:])-1)
			return f[:len(f)-1]
		})},
		{"IPv6 UDP truncated", edit6(t, func(f []byte) []byte { binary.BigEndian.PutUint16(f[18:], 7); return f })},
	} {
		var f Frame
		f.Payload = []byte{1} // must be cleared
		err := Parse(c.frame, &f)
		if err == nil {
			t.Errorf("%s: parsed as %+v", c.name, f)
			continue
		}
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: error %v does not match ErrMalformed", c.name, err)
		}
		if f.Kind != KindOther || f.Payload != nil || f.Segment != nil {
			t.Errorf("%s: frame not reset after error: %+v", c.name, f)
		}
	}
}

func TestParseAccepted(t *testing.T) {
	t.Parallel()
	payload := testPayload(64, 9)
	v4 := frameOf(t, 0, payload)
	v6 := frameOf(t, 6, payload)
	udp := func(f *Frame) bool { return f.Kind == KindUDP && bytes.Equal(f.Payload, payload) && f.VerifyUDP() }
	for _, c := range []struct {
		name  string
		frame []byte
		check func(*Frame) bool
	}{
		{"ARP", []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4, 5, 6, 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1},
			func(f *Frame) bool { return f.Kind == KindOther && f.EtherType == EtherTypeARP && f.Payload == nil }},
		{"unknown EtherType, header only", []byte{1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 0x88, 0xcc},
			func(f *Frame) bool { return f.Kind == KindOther && f.EtherType == 0x88cc }},
		{"IPv4 padded", append(clone(v4), make([]byte, 30)...), udp},
		{"IPv4 UDP zero payload padded to 60 bytes", func() []byte {
			fr := frameOf(t, 0, nil)
			return append(clone(fr), bytes.Repeat([]byte{0xaa}, 60-len(fr))...)
		}(), func(f *Frame) bool {
			return f.Kind == KindUDP && len(f.Payload) == 0 && len(f.Segment) == 8 && f.VerifyUDP()
		}},
		{"IPv4 UDP length shorter than IP payload", edit4(t, func(f []byte) []byte {
			binary.BigEndian.PutUint16(f[38:], 8+10)
			return f
		}), func(f *Frame) bool { return f.Kind == KindUDP && bytes.Equal(f.Payload, payload[:10]) }},
		{"IPv4 with options", func() []byte {
			fr := clone(v4)
			out := append(clone(fr[:EthHdrLen+20]), 1, 1, 1, 0) // NOP NOP NOP EOL
			out = append(out, fr[EthHdrLen+20:]...)
			out[14] = 0x46
			binary.BigEndian.PutUint16(out[16:], uint16(len(out)-EthHdrLen))
			return fixIPv4(out)
		}(), udp},
		{"IPv4 zero UDP checksum", edit4(t, func(f []byte) []byte { f[40], f[41] = 0, 0; return f }),
			func(f *Frame) bool { return f.Kind == KindUDP && f.UDPChecksum == 0 && f.VerifyUDP() }},
		{"ICMP", edit4(t, func(f []byte) []byte { f[23] = ProtoICMP; return f }),
			func(f *Frame) bool {
				return f.Kind == KindOther && f.Proto == ProtoICMP && len(f.Payload) == 72 && f.Src.Addr().Is4() && !f.VerifyUDP()
			}},
		{"IPv4 last fragment of odd length", edit4(t, func(f []byte) []byte {
			f[20], f[21] = 0, 185 // offset 1480, no MF
			binary.BigEndian.PutUint16(f[16:], 20+69)
			return f[:len(f)-3]
		}),
			func(f *Frame) bool {
				return f.Kind == KindFragment && f.FragOff == 1480 && !f.More && len(f.Payload) == 69 && f.FragID == 0x1234
			}},
		{"QinQ", func() []byte {
			out := append(clone(v4[:12]), 0x88, 0xa8, 0x20, 0x07, 0x81, 0x00, 0x00, 0x09)
			return append(out, v4[12:]...)
		}(), func(f *Frame) bool { return udp(f) && f.VLAN == 7 }},
		{"IPv6 padded", append(clone(v6), 1, 2, 3), udp},
		{"IPv6 Hop-by-Hop and Destination Options", edit6(t, func(f []byte) []byte {
			return insertV6Ext(f, ipv6HopByHop, []byte{
				ipv6DestOpts, 0, 1, 4, 0, 0, 0, 0, // PadN
				ProtoUDP, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
			})
		}), udp},
		{"IPv6 atomic fragment", edit6(t, func(f []byte) []byte {
			return insertV6Ext(f, ProtoIPv6Frag, []byte{ProtoUDP, 0, 0, 0, 0, 0, 0, 9})
		}), udp},
		{"IPv6 fragment", edit6(t, func(f []byte) []byte {
			return insertV6Ext(f, ProtoIPv6Frag, []byte{ProtoUDP, 0, 0x05, 0xa9, 0xde, 0xad, 0xbe, 0xef})
		}), func(f *Frame) bool {
			return f.Kind == KindFragment && f.FragOff == 0x5a8 && f.More && f.FragID == 0xdeadbeef && f.Proto == ProtoUDP && len(f.Payload) == 72
		}},
		{"ICMPv6", edit6(t, func(f []byte) []byte { f[20] = ProtoICMPv6; return f }),
			func(f *Frame) bool { return f.Kind == KindOther && f.Proto == ProtoICMPv6 && len(f.Payload) == 72 }},
		{"IPv6 zero UDP checksum", edit6(t, func(f []byte) []byte { f[60], f[61] = 0, 0; return f }),
			func(f *Frame) bool { return f.Kind == KindUDP && f.UDPChecksum == 0 && !f.VerifyUDP() }},
	} {
		var f Frame
		if err := Parse(c.frame, &f); err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if !c.check(&f) {
			t.Errorf("%s: unexpected result %+v", c.name, f)
		}
	}
}

func TestVerifyUDPRejects(t *testing.T) {
	t.Parallel()
	var f Frame
	if err := Parse(frameOf(t, 0, testPayload(100, 1)), &f); err != nil {
		t.Fatal(err)
	}
	src, dst, seg := f.Src.Addr(), f.Dst.Addr(), f.Segment
	if !VerifyUDP(src, dst, seg) || !VerifyUDP(netip.AddrFrom16(src.As16()), dst, seg) {
		t.Fatal("valid datagram (or v4-mapped source) rejected")
	}
	for i := range seg {
		bad := clone(seg)
		bad[i] ^= 0x10
		if i == 4 || i == 5 {
			continue // a changed length is caught below
		}
		if VerifyUDP(src, dst, bad) {
			t.Fatalf("corruption at byte %d not detected", i)
		}
	}
	other := netip.MustParseAddr("10.1.0.3")
	for name, ok := range map[string]bool{
		"wrong dst":          VerifyUDP(src, other, seg),
		"mixed families":     VerifyUDP(src, netip.MustParseAddr("2001:db8::2"), seg),
		"no address":         VerifyUDP(netip.Addr{}, dst, seg),
		"short":              VerifyUDP(src, dst, seg[:7]),
		"length beyond data": VerifyUDP(src, dst, seg[:len(seg)-1]),
	} {
		if ok {
			t.Errorf("%s: verified", name)
		}
	}
	if _, _, _, err := ParseUDPSegment(seg[:7]); !errors.Is(err, ErrMalformed) {
		t.Errorf("ParseUDPSegment(7 bytes) = %v", err)
	}
	if _, _, _, err := ParseUDPSegment(seg[:len(seg)-1]); !errors.Is(err, ErrMalformed) {
		t.Errorf("ParseUDPSegment(truncated) = %v", err)
	}
	if _, _, p, err := ParseUDPSegment(append(clone(seg), 0, 0)); err != nil || len(p) != 100 {
		t.Errorf("ParseUDPSegment(trailing bytes) = %d bytes, %v", len(p), err)
	}
}

func TestKindString(t *testing.T) {
	t.Parallel()
	for k, want := range map[Kind]string{KindOther: "other", KindUDP: "udp", KindFragment: "fragment", 9: "kind(9)"} {
		if k.String() != want {
			t.Errorf("Kind(%d).String() = %q", k, k.String())
		}
	}
}

// within reports whether s (if non-empty) lies inside b's memory.
func within(b, s []byte) bool {
	if len(s) == 0 {
		return true
	}
	if len(b) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	p := uintptr(unsafe.Pointer(unsafe.SliceData(s)))
	return p >= lo && p+uintptr(len(s)) <= lo+uintptr(len(b))
}

// FuzzParse feeds arbitrary frames to Parse: it must not panic, must report
// malformed input as ErrMalformed, and what it accepts must be consistent.
// The seed corpus in testdata/fuzz/FuzzParse holds frames from the templates
// (IPv4/IPv6, VLAN, fragments) and hand-made edge cases.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, frame []byte) {
		var fr Frame
		err := Parse(frame, &fr)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not match ErrMalformed", err)
			}
			if fr.Kind != KindOther || fr.Payload != nil {
				t.Fatalf("frame not reset after error")
			}
			return
		}
		if !within(frame, fr.Payload) || !within(frame, fr.Segment) {
			t.Fatalf("result slices outside the frame")
		}
		switch fr.Kind {
		case KindUDP:
			if fr.Proto != ProtoUDP || !fr.Src.Addr().IsValid() || fr.Src.Addr().Is4() != fr.Dst.Addr().Is4() {
				t.Fatalf("bad UDP result %+v", fr)
			}
			sp, dp, p, err := ParseUDPSegment(fr.Segment)
			if err != nil || sp != fr.Src.Port() || dp != fr.Dst.Port() || len(p) != len(fr.Payload) ||
				len(fr.Segment) != UDPHdrLen+len(fr.Payload) || int(binary.BigEndian.Uint16(fr.Segment[4:])) != len(fr.Segment) {
				t.Fatalf("UDP segment inconsistent: %v", err)
			}
			fr.VerifyUDP()
		case KindFragment:
			if !fr.Src.Addr().IsValid() || fr.Src.Port() != 0 || len(fr.Payload) == 0 || fr.FragOff%8 != 0 ||
				fr.FragOff > 0xfff8 || (fr.More && len(fr.Payload)%8 != 0) || fr.Segment != nil {
				t.Fatalf("bad fragment result %+v", fr)
			}
		case KindOther:
			if fr.Segment != nil {
				t.Fatalf("segment set for %+v", fr)
			}
		default:
			t.Fatalf("unknown kind %d", fr.Kind)
		}
	})
}

// FuzzTemplateRoundTrip builds datagrams for fuzzed sizes, MTUs and tags and
// parses them back.
func FuzzTemplateRoundTrip(f *testing.F) {
	f.Add(uint16(0), uint16(1500), false, uint16(0), uint32(1))
	f.Add(uint16(1473), uint16(1500), false, uint16(5), uint32(1))
	f.Add(uint16(65527), uint16(1280), true, uint16(4094), uint32(0xffffffff))
	f.Add(uint16(9000), uint16(68), false, uint16(0), uint32(7))
	f.Fuzz(func(t *testing.T, size, mtu uint16, v6 bool, vlan uint16, id uint32) {
		c := tmplCase{name: "fuzz", src: netip.MustParseAddrPort("10.0.0.1:1"), dst: netip.MustParseAddrPort("10.0.0.2:2"),
			mtu: int(mtu), opts: TemplateOptions{VLAN: vlan % 4095}}
		if v6 {
			c.src, c.dst = netip.MustParseAddrPort("[fd00::1]:1"), netip.MustParseAddrPort("[fd00::2]:2")
		}
		tm, err := NewTemplate(macA, macB, c.src, c.dst, c.mtu, c.opts)
		if err != nil {
			return // out-of-range MTUs are covered by TestTemplateErrors
		}
		payload := testPayload(int(size), uint64(id))
		n, err := tm.Frames(len(payload))
		if err != nil {
			if !errors.Is(err, ErrTooBig) || int(size) <= c.maxPayload() {
				t.Fatalf("Frames(%d): %v", size, err)
			}
			return
		}
		frames := buildAll(t, tm, payload, id)
		if len(frames) != n {
			t.Fatalf("built %d frames, Frames said %d", len(frames), n)
		}
		checkFrames(t, c, frames, payload, id)
		checkParse(t, c, frames, payload, id)
	})
}
