package vxlan

import (
	"bytes"
	"encoding/hex"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/bypassd/bypassd/ring/wire/packet"
)

var (
	macA = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x0a}
	macB = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x0b}
	vmA  = net.HardwareAddr{0x02, 0, 0, 0, 0x17, 0x0a}
	vmB  = net.HardwareAddr{0x02, 0, 0, 0, 0x17, 0x0b}
)

func testTemplate(t *testing.T, csum bool, innerMTU int) *Template {
	t.Helper()
	src := netip.MustParseAddrPort("192.168.17.1:5000")
	dst := netip.MustParseAddrPort("192.168.17.2:6000")
	in, err := packet.NewTemplate(vmA, vmB, src, dst, innerMTU, packet.TemplateOptions{TTL: 64})
	if err != nil {
		t.Fatal(err)
	}
	x, err := NewEncap(Outer{SrcMAC: macA, DstMAC: macB, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"),
		SrcPort: 40000, DstPort: DefaultPort, VNI: 0x123456, TTL: 0, TOS: 0xb8, Checksum: csum})
	if err != nil {
		t.Fatal(err)
	}
	return &Template{Inner: in, Encap: x}
}

// The golden frame: a 4-byte datagram in VNI 0x123456, every field of the
// outer headers at the offset RFC 7348 section 5 draws it.
func TestGoldenFrame(t *testing.T) {
	tm := testTemplate(t, false, 1450)
	buf := make([]byte, 256)
	n, err := tm.BuildFrame(buf, []byte("ping"), 0, 7)
	if err != nil {
		t.Fatal(err)
	}
	golden := "02000000000b" + "02000000000a" + "0800" + // outer Ethernet
		"45b8" + "0052" + "0000" + "0000" + "4011" + "65e1" + "0a000001" + "0a000002" + // outer IPv4, ID 0, no DF
		"9c40" + "12b5" + "003e" + "0000" + // outer UDP 40000 -> 4789, length 62, no checksum
		"08000000" + "12345600" + // VXLAN: I flag, VNI 0x123456
		"02000000170b" + "02000000170a" + "0800" + // inner Ethernet
		"4500" + "0020" + "0007" + "0000" + "4011" // inner IPv4 up to the checksum
	got := hex.EncodeToString(buf[:n])
	if !strings.HasPrefix(got, golden) {
		t.Fatalf("frame\n got %s\nwant %s...", got, golden)
	}
	if n != EncapLen4+14+20+8+4 {
		t.Errorf("frame is %d bytes", n)
	}
	// The outer IPv4 checksum is right: Parse checks it.
	var f packet.Frame
	if err := packet.Parse(buf[:n], &f); err != nil || f.Kind != packet.KindUDP || f.Dst.Port() != DefaultPort || f.TOS != 0xb8 {
		t.Fatalf("outer parse: %v %+v", err, f)
	}
}

// Encapsulated frames decapsulate to the inner frames the inner template
// builds, with checksums that verify, fragmented or not.
func TestRoundTrip(t *testing.T) {
	for _, csum := range []bool{false, true} {
		tm := testTemplate(t, csum, 1450)
		for _, size := range []int{0, 1, 1422, 1423, 4000, 65507} {
			payload := bytes.Repeat([]byte{byte(size)}, size)
			frames, err := tm.Frames(size)
			if err != nil {
				t.Fatal(err)
			}
			var inner []byte
			for i := range frames {
				buf := make([]byte, 1600)
				n, err := tm.BuildFrame(buf, payload, i, 99)
				if err != nil {
					t.Fatal(err)
				}
				if n > 1450+Overhead4+packet.EthHdrLen {
					t.Fatalf("size %d frame %d: %d bytes exceed the underlay MTU 1500", size, i, n)
				}
				var outer packet.Frame
				if err := packet.Parse(buf[:n], &outer); err != nil || outer.Kind != packet.KindUDP {
					t.Fatalf("size %d frame %d: outer %v %v", size, i, err, outer.Kind)
				}
				if csum != (outer.UDPChecksum != 0) || csum && !outer.VerifyUDP() {
					t.Fatalf("size %d frame %d: outer checksum %#x (wanted: %v)", size, i, outer.UDPChecksum, csum)
				}
				vni, in, err := Decap(outer.Payload)
				if err != nil || vni != 0x123456 {
					t.Fatalf("decap: %v %#x", err, vni)
				}
				want := make([]byte, 1600)
				m, _ := tm.Inner.BuildFrame(want, payload, i, 99)
				if !bytes.Equal(in, want[:m]) {
					t.Fatalf("size %d frame %d: inner frame differs", size, i)
				}
				inner = in
			}
			if frames == 1 {
				var f packet.Frame
				if err := packet.Parse(inner, &f); err != nil || !f.VerifyUDP() || !bytes.Equal(f.Payload, payload) {
					t.Fatalf("size %d: inner %v", size, err)
				}
			}
		}
	}
}

func TestOuterIDAdvances(t *testing.T) {
	tm := testTemplate(t, false, 1450)
	buf := make([]byte, 200)
	for want := range uint16(3) {
		n, _ := tm.BuildFrame(buf, []byte("x"), 0, 0)
		var f packet.Frame
		if err := packet.Parse(buf[:n], &f); err != nil {
			t.Fatal(err)
		}
		if id := uint16(buf[18])<<8 | uint16(buf[19]); id != want {
			t.Errorf("outer ID %d, want %d", id, want)
		}
	}
}

func TestDecapErrors(t *testing.T) {
	if _, _, err := Decap(make([]byte, 21)); !errors.Is(err, ErrMalformed) {
		t.Errorf("short: %v", err)
	}
	b := make([]byte, 22)
	if _, _, err := Decap(b); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "I flag") {
		t.Errorf("no I flag: %v", err)
	}
	PutHeader(b, MaxVNI)
	b[1], b[7] = 0xff, 0xff // reserved bits are ignored
	if vni, in, err := Decap(b); err != nil || vni != MaxVNI || len(in) != 14 {
		t.Errorf("reserved bits: %v %d %d", err, vni, len(in))
	}
}

func TestNewEncapErrors(t *testing.T) {
	ok := Outer{SrcMAC: macA, DstMAC: macB, Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), DstPort: 4789, VNI: 1}
	for _, c := range []struct {
		change func(*Outer)
		want   string
	}{
		{func(o *Outer) { o.DstMAC = nil }, "resolve the remote VTEP"},
		{func(o *Outer) { o.Dst = netip.MustParseAddr("fd00::2") }, "only an IPv4 underlay"},
		{func(o *Outer) { o.VNI = 0 }, "VNI 0 out of range"},
		{func(o *Outer) { o.VNI = MaxVNI + 1 }, "out of range"},
		{func(o *Outer) { o.DstPort = 0 }, "dstport"},
	} {
		o := ok
		c.change(&o)
		if _, err := NewEncap(o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", o, err, c.want)
		}
	}
	x, _ := NewEncap(ok)
	if err := x.Put(make([]byte, EncapLen4)); err == nil {
		t.Error("Put into a frame without an inner frame succeeded")
	}
}

func TestSourcePort(t *testing.T) {
	a := netip.MustParseAddrPort("192.168.17.1:5000")
	seen := map[uint16]bool{}
	for p := range uint16(200) {
		sp := SourcePort(a, netip.AddrPortFrom(a.Addr(), 1000+p), 0, 0)
		if sp < 32768 || sp > 60999 {
			t.Fatalf("port %d outside the default range", sp)
		}
		seen[sp] = true
	}
	if len(seen) < 150 {
		t.Errorf("200 flows got only %d source ports", len(seen))
	}
	if sp := SourcePort(a, a, 5000, 5000); sp != 5000 {
		t.Errorf("range of one: %d", sp)
	}
	if SourcePort(a, a, 0, 0) != SourcePort(a, a, 0, 0) {
		t.Error("not stable")
	}
}

func FuzzDecap(f *testing.F) {
	f.Add([]byte{0x08, 0, 0, 0, 0, 0, 42, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		vni, in, err := Decap(b)
		if err != nil {
			return
		}
		if vni > MaxVNI || len(in) != len(b)-HeaderLen {
			t.Fatalf("vni %d, inner %d of %d", vni, len(in), len(b))
		}
		var pf packet.Frame
		_ = packet.Parse(in, &pf)
	})
}
