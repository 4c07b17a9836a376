package packet

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

var (
	macA = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x0a}
	macB = net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x0b}
)

type tmplCase struct {
	name     string
	src, dst netip.AddrPort
	mtu      int
	opts     TemplateOptions
}

func (c tmplCase) v6() bool { return c.src.Addr().Unmap().Is6() }

func (c tmplCase) maxPayload() int {
	if c.v6() {
		return MaxUDPPayload6
	}
	if c.opts.DontFragment {
		return c.mtu - IPv4HdrLen - UDPHdrLen
	}
	return MaxUDPPayload4
}

var tmplCases = []tmplCase{
	{"v4", netip.MustParseAddrPort("10.1.0.1:4000"), netip.MustParseAddrPort("10.1.0.2:11111"), 1500, TemplateOptions{}},
	{"v4-vlan", netip.MustParseAddrPort("10.1.0.1:4000"), netip.MustParseAddrPort("10.1.0.2:11111"), 1500,
		TemplateOptions{VLAN: 100, Priority: 5, TTL: 7, TOS: 0xb8}},
	{"v4-mapped", netip.MustParseAddrPort("[::ffff:10.1.0.1]:1"), netip.MustParseAddrPort("10.1.0.2:2"), 1500, TemplateOptions{}},
	{"v4-mtu68", netip.MustParseAddrPort("192.0.2.1:53"), netip.MustParseAddrPort("192.0.2.200:5353"), 68, TemplateOptions{}},
	{"v4-mtu9000", netip.MustParseAddrPort("192.0.2.1:53"), netip.MustParseAddrPort("192.0.2.200:5353"), 9000, TemplateOptions{}},
	{"v4-df", netip.MustParseAddrPort("10.1.0.1:4000"), netip.MustParseAddrPort("10.1.0.2:11111"), 1500, TemplateOptions{DontFragment: true}},
	{"v6", netip.MustParseAddrPort("[2001:db8::1]:4000"), netip.MustParseAddrPort("[2001:db8::2]:11111"), 1500, TemplateOptions{}},
	{"v6-vlan", netip.MustParseAddrPort("[fd00::1%eth0]:4000"), netip.MustParseAddrPort("[fd00::2]:11111"), 1500,
		TemplateOptions{VLAN: 4094, Priority: 7, TTL: 1, TOS: 0x2e, FlowLabel: 0xabcde}},
	{"v6-mtu1280", netip.MustParseAddrPort("[2001:db8::1]:4000"), netip.MustParseAddrPort("[2001:db8::2]:11111"), 1280, TemplateOptions{}},
}

func (c tmplCase) sizes() []int {
	s := []int{0, 1, 18, 1400, 8000, c.maxPayload()}
	// Exact fit in one frame and the first size that fragments.
	fit := c.mtu - IPv4HdrLen - UDPHdrLen
	if c.v6() {
		fit = c.mtu - IPv6HdrLen - UDPHdrLen
	}
	s = append(s, fit, fit+1)
	if !c.v6() && c.mtu == 1500 {
		s = append(s, 1472, 1473) // spelled out: the classic IPv4/Ethernet limits
	}
	var out []int
	for _, n := range s {
		if n <= c.maxPayload() {
			out = append(out, n)
		}
	}
	return out
}

func newTestTemplate(t testing.TB, c tmplCase) *Template {
	t.Helper()
	tm, err := NewTemplate(macA, macB, c.src, c.dst, c.mtu, c.opts)
	if err != nil {
		t.Fatalf("NewTemplate(%s): %v", c.name, err)
	}
	return tm
}

func testPayload(n int, seed uint64) []byte {
	rng := rand.New(rand.NewPCG(seed, uint64(n)))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// buildAll builds every frame of a datagram into fresh buffers.
func buildAll(t testing.TB, tm *Template, payload []byte, ipID uint32) [][]byte {
	t.Helper()
	n, err := tm.Frames(len(payload))
	if err != nil {
		t.Fatalf("Frames(%d): %v", len(payload), err)
	}
	frames := make([][]byte, n)
	for i := range frames {
		buf := make([]byte, tm.MaxFrameLen())
		for j := range buf {
			buf[j] = 0xee // stale bytes must all be overwritten
		}
		fl, err := tm.BuildFrame(buf, payload, i, ipID)
		if err != nil {
			t.Fatalf("BuildFrame(len %d, i %d): %v", len(payload), i, err)
		}
		frames[i] = buf[:fl]
	}
	return frames
}

// checkFrames verifies a datagram's frames field by field against the RFCs,
// independently of Parse and with the naive reference checksum.
func checkFrames(t *testing.T, c tmplCase, frames [][]byte, payload []byte, ipID uint32) {
	t.Helper()
	v6 := c.v6()
	src, dst := c.src.Addr().Unmap().WithZone(""), c.dst.Addr().Unmap().WithZone("")
	ttl := c.opts.TTL
	if ttl == 0 {
		ttl = 64
	}
	ipHdr := IPv4HdrLen
	if v6 {
		ipHdr = IPv6HdrLen
	}
	wantSingle := ipHdr+UDPHdrLen+len(payload) <= c.mtu
	if wantSingle != (len(frames) == 1) {
		t.Fatalf("payload %d at MTU %d: %d frames", len(payload), c.mtu, len(frames))
	}
	var seg []byte
	for i, fr := range frames {
		last := i == len(frames)-1
		// Ethernet.
		if !bytes.Equal(fr[0:6], macB) || !bytes.Equal(fr[6:12], macA) {
			t.Fatalf("frame %d: MACs % x", i, fr[:12])
		}
		p := fr[12:]
		if c.opts.VLAN != 0 {
			if binary.BigEndian.Uint16(p) != 0x8100 {
				t.Fatalf("frame %d: no 802.1Q TPID: % x", i, p[:4])
			}
			tci := binary.BigEndian.Uint16(p[2:])
			if tci>>13 != uint16(c.opts.Priority) || tci&0x1000 != 0 || tci&0xfff != c.opts.VLAN {
				t.Fatalf("frame %d: TCI %#04x, want PCP %d VID %d", i, tci, c.opts.Priority, c.opts.VLAN)
			}
			p = p[4:]
		}
		et := binary.BigEndian.Uint16(p)
		ip := p[2:]
		if len(ip) > c.mtu {
			t.Fatalf("frame %d: IP packet %d bytes exceeds MTU %d", i, len(ip), c.mtu)
		}
		var data []byte
		var off int
		var more bool
		if !v6 {
			if et != 0x0800 || ip[0] != 0x45 || ip[1] != c.opts.TOS || ip[8] != ttl || ip[9] != 17 {
				t.Fatalf("frame %d: IPv4 header % x", i, ip[:20])
			}
			if int(binary.BigEndian.Uint16(ip[2:])) != len(ip) {
				t.Fatalf("frame %d: total length %d, packet %d", i, binary.BigEndian.Uint16(ip[2:]), len(ip))
			}
			if binary.BigEndian.Uint16(ip[4:]) != uint16(ipID) {
				t.Fatalf("frame %d: ID %#x, want %#x", i, binary.BigEndian.Uint16(ip[4:]), uint16(ipID))
			}
			fo := binary.BigEndian.Uint16(ip[6:])
			if fo&0x8000 != 0 {
				t.Fatalf("frame %d: reserved flag set", i)
			}
			if df := fo&0x4000 != 0; df != c.opts.DontFragment {
				t.Fatalf("frame %d: DF=%v, want %v", i, df, c.opts.DontFragment)
			}
			more = fo&0x2000 != 0
			off = int(fo&0x1fff) * 8
			if s := refSum(ip[:20], 0); s != 0xffff {
				t.Fatalf("frame %d: IPv4 header checksum wrong (sum %#x)", i, s)
			}
			if !bytes.Equal(ip[12:16], src.AsSlice()) || !bytes.Equal(ip[16:20], dst.AsSlice()) {
				t.Fatalf("frame %d: addresses % x", i, ip[12:20])
			}
			data = ip[20:]
		} else {
			w := binary.BigEndian.Uint32(ip)
			if et != 0x86dd || w>>28 != 6 || uint8(w>>20) != c.opts.TOS || w&0xfffff != c.opts.FlowLabel || ip[7] != ttl {
				t.Fatalf("frame %d: IPv6 header % x", i, ip[:8])
			}
			if int(binary.BigEndian.Uint16(ip[4:])) != len(ip)-40 {
				t.Fatalf("frame %d: payload length %d, packet %d", i, binary.BigEndian.Uint16(ip[4:]), len(ip))
			}
			if !bytes.Equal(ip[8:24], src.AsSlice()) || !bytes.Equal(ip[24:40], dst.AsSlice()) {
				t.Fatalf("frame %d: addresses % x", i, ip[8:40])
			}
			data = ip[40:]
			if len(frames) == 1 {
				if ip[6] != 17 {
					t.Fatalf("next header %d, want 17", ip[6])
				}
			} else {
				fh := ip[40:48]
				if ip[6] != 44 || fh[0] != 17 || fh[1] != 0 || fh[3]&6 != 0 {
					t.Fatalf("frame %d: fragment header % x after next header %d", i, fh, ip[6])
				}
				if binary.BigEndian.Uint32(fh[4:]) != ipID {
					t.Fatalf("frame %d: fragment id %#x, want %#x", i, binary.BigEndian.Uint32(fh[4:]), ipID)
				}
				fo := binary.BigEndian.Uint16(fh[2:])
				off, more = int(fo&0xfff8), fo&1 != 0
				data = ip[48:]
			}
		}
		if off != len(seg) {
			t.Fatalf("frame %d: offset %d, want %d", i, off, len(seg))
		}
		if more == last {
			t.Fatalf("frame %d of %d: MF=%v", i, len(frames), more)
		}
		if !last {
			hdrs := len(ip) - len(data)
			if len(data)%8 != 0 || hdrs+len(data) > c.mtu || hdrs+len(data)+8 <= c.mtu {
				t.Fatalf("frame %d: %d data bytes is not the largest multiple of 8 fitting MTU %d with %d header bytes", i, len(data), c.mtu, hdrs)
			}
		}
		seg = append(seg, data...)
	}
	if len(seg) != UDPHdrLen+len(payload) || !bytes.Equal(seg[UDPHdrLen:], payload) {
		t.Fatalf("UDP segment of %d bytes does not carry the %d-byte payload", len(seg), len(payload))
	}
	if binary.BigEndian.Uint16(seg[0:]) != c.src.Port() || binary.BigEndian.Uint16(seg[2:]) != c.dst.Port() ||
		int(binary.BigEndian.Uint16(seg[4:])) != len(seg) {
		t.Fatalf("UDP header % x", seg[:8])
	}
	if binary.BigEndian.Uint16(seg[6:]) == 0 {
		t.Fatalf("UDP checksum 0 sent")
	}
	pseudo := refPseudo(src, dst, 17, len(seg))
	if s := refSum(append(pseudo, seg...), 0); s != 0xffff {
		t.Fatalf("UDP checksum wrong (reference sum %#x)", s)
	}
}

// checkParse parses the frames and reassembles fragments naively by offset.
func checkParse(t *testing.T, c tmplCase, frames [][]byte, payload []byte, ipID uint32) {
	t.Helper()
	src, dst := c.src.Addr().Unmap().WithZone(""), c.dst.Addr().Unmap().WithZone("")
	var f Frame
	if len(frames) == 1 {
		if err := Parse(frames[0], &f); err != nil {
			t.Fatalf("Parse: %v", err)
		}
		if f.Kind != KindUDP || f.Proto != 17 || f.Src != netip.AddrPortFrom(src, c.src.Port()) ||
			f.Dst != netip.AddrPortFrom(dst, c.dst.Port()) || !bytes.Equal(f.Payload, payload) || f.VLAN != c.opts.VLAN {
			t.Fatalf("Parse = %+v", f)
		}
		if f.UDPChecksum == 0 || !f.VerifyUDP() || !VerifyUDP(src, dst, f.Segment) {
			t.Fatalf("checksum %#x does not verify", f.UDPChecksum)
		}
		return
	}
	wantID := ipID
	if !c.v6() {
		wantID = uint32(uint16(ipID))
	}
	seg := make([]byte, UDPHdrLen+len(payload))
	for i, fr := range frames {
		if err := Parse(fr, &f); err != nil {
			t.Fatalf("Parse frame %d: %v", i, err)
		}
		if f.Kind != KindFragment || f.Proto != 17 || f.FragID != wantID || f.Src.Addr() != src || f.Dst.Addr() != dst ||
			f.Src.Port() != 0 || f.More != (i < len(frames)-1) {
			t.Fatalf("Parse frame %d = %+v", i, f)
		}
		if f.FragOff+len(f.Payload) > len(seg) {
			t.Fatalf("frame %d: fragment [%d,%d) beyond the datagram", i, f.FragOff, f.FragOff+len(f.Payload))
		}
		copy(seg[f.FragOff:], f.Payload)
	}
	sp, dp, pl, err := ParseUDPSegment(seg)
	if err != nil || sp != c.src.Port() || dp != c.dst.Port() || !bytes.Equal(pl, payload) {
		t.Fatalf("ParseUDPSegment = %d, %d, %d bytes, %v", sp, dp, len(pl), err)
	}
	if !VerifyUDP(src, dst, seg) {
		t.Fatalf("reassembled datagram does not verify")
	}
}

func TestBuildParseRoundTrip(t *testing.T) {
	t.Parallel()
	for _, c := range tmplCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			tm := newTestTemplate(t, c)
			if tm.MaxFrameLen() != tm.HeaderLen()-UDPHdrLen-tm.ipLen+c.mtu {
				t.Fatalf("MaxFrameLen %d", tm.MaxFrameLen())
			}
			for _, n := range c.sizes() {
				t.Run(fmt.Sprint(n), func(t *testing.T) {
					payload := testPayload(n, 7)
					ipID := uint32(0x89abcdef) + uint32(n)
					frames := buildAll(t, tm, payload, ipID)
					for _, fr := range frames {
						if len(fr) > tm.MaxFrameLen() {
							t.Fatalf("frame of %d bytes beyond MaxFrameLen %d", len(fr), tm.MaxFrameLen())
						}
					}
					checkFrames(t, c, frames, payload, ipID)
					checkParse(t, c, frames, payload, ipID)
				})
			}
		})
	}
}

func TestFrameCounts(t *testing.T) {
	t.Parallel()
	v4 := newTestTemplate(t, tmplCases[0])
	v6 := newTestTemplate(t, tmplCases[6])
	for _, c := range []struct {
		tm   *Template
		n    int
		want int
	}{
		{v4, 0, 1}, {v4, 1472, 1}, {v4, 1473, 2}, {v4, 2952, 2}, {v4, 2953, 3}, {v4, 65507, 45},
		{v6, 0, 1}, {v6, 1452, 1}, {v6, 1453, 2}, {v6, 2888, 2}, {v6, 2889, 3}, {v6, 65527, 46},
	} {
		got, err := c.tm.Frames(c.n)
		if err != nil || got != c.want {
			t.Errorf("%v Frames(%d) = %d, %v; want %d", c.tm.Dst(), c.n, got, err, c.want)
		}
	}
}

func TestZeroChecksumSentAsFFFF(t *testing.T) {
	t.Parallel()
	for _, c := range []tmplCase{tmplCases[0], tmplCases[6]} {
		tm := newTestTemplate(t, c)
		// Pick the 2-byte payload that makes the computed checksum 0.
		frames := buildAll(t, tm, []byte{0, 0}, 1)
		var f Frame
		if err := Parse(frames[0], &f); err != nil {
			t.Fatal(err)
		}
		s := refSum(append(refPseudo(f.Src.Addr(), f.Dst.Addr(), 17, 10), f.Segment[:6]...), 0)
		w := 0xffff - s
		payload := []byte{byte(w >> 8), byte(w)}
		frames = buildAll(t, tm, payload, 1)
		if err := Parse(frames[0], &f); err != nil {
			t.Fatal(err)
		}
		if f.UDPChecksum != 0xffff || !f.VerifyUDP() {
			t.Fatalf("%s: checksum field %#x for a zero checksum (verify %v)", c.name, f.UDPChecksum, f.VerifyUDP())
		}
		checkFrames(t, c, frames, payload, 1)
	}
}

func TestPayloadSummedOncePerDatagram(t *testing.T) {
	// Not parallel: swaps a package variable. Parallel tests of this package
	// start only after all sequential ones have finished.
	calls := 0
	orig := payloadSum
	payloadSum = func(b []byte) uint16 { calls++; return orig(b) }
	defer func() { payloadSum = orig }()
	for _, c := range []tmplCase{tmplCases[0], tmplCases[6]} {
		tm := newTestTemplate(t, c)
		for _, n := range []int{100, 8000, c.maxPayload()} {
			calls = 0
			buildAll(t, tm, testPayload(n, 1), 5)
			if calls != 1 {
				t.Fatalf("%s: payload of %d bytes summed %d times while building all its frames", c.name, n, calls)
			}
		}
	}
}

func TestInPlaceBuild(t *testing.T) {
	t.Parallel()
	for _, c := range []tmplCase{tmplCases[1], tmplCases[7]} {
		tm := newTestTemplate(t, c)
		payload := testPayload(1000, 3)
		buf := make([]byte, tm.MaxFrameLen())
		copy(buf[tm.HeaderLen():], payload)
		n, err := tm.BuildFrame(buf, buf[tm.HeaderLen():tm.HeaderLen()+len(payload)], 0, 9)
		if err != nil {
			t.Fatal(err)
		}
		checkFrames(t, c, [][]byte{buf[:n]}, payload, 9)
	}
}

func TestTemplateErrors(t *testing.T) {
	t.Parallel()
	a4 := netip.MustParseAddrPort("10.0.0.1:1")
	b4 := netip.MustParseAddrPort("10.0.0.2:2")
	a6 := netip.MustParseAddrPort("[2001:db8::1]:1")
	b6 := netip.MustParseAddrPort("[2001:db8::2]:2")
	for _, c := range []struct {
		name     string
		sm, dm   net.HardwareAddr
		src, dst netip.AddrPort
		mtu      int
		opts     TemplateOptions
	}{
		{"short src MAC", macA[:5], macB, a4, b4, 1500, TemplateOptions{}},
		{"long dst MAC", macA, append(append(net.HardwareAddr{}, macB...), 0, 0), a4, b4, 1500, TemplateOptions{}},
		{"nil dst MAC", macA, nil, a4, b4, 1500, TemplateOptions{}},
		{"mixed v4 v6", macA, macB, a4, b6, 1500, TemplateOptions{}},
		{"mixed v6 v4", macA, macB, a6, b4, 1500, TemplateOptions{}},
		{"no src addr", macA, macB, netip.AddrPort{}, b4, 1500, TemplateOptions{}},
		{"dst port 0", macA, macB, a4, netip.AddrPortFrom(b4.Addr(), 0), 1500, TemplateOptions{}},
		{"v4 MTU 67", macA, macB, a4, b4, 67, TemplateOptions{}},
		{"v6 MTU 1279", macA, macB, a6, b6, 1279, TemplateOptions{}},
		{"MTU 65536", macA, macB, a4, b4, 65536, TemplateOptions{}},
		{"VLAN 4095", macA, macB, a4, b4, 1500, TemplateOptions{VLAN: 4095}},
		{"priority 8", macA, macB, a4, b4, 1500, TemplateOptions{VLAN: 1, Priority: 8}},
		{"flow label", macA, macB, a6, b6, 1500, TemplateOptions{FlowLabel: 1 << 20}},
	} {
		if tm, err := NewTemplate(c.sm, c.dm, c.src, c.dst, c.mtu, c.opts); err == nil {
			t.Errorf("%s: NewTemplate succeeded: %+v", c.name, tm)
		} else if len(err.Error()) < 20 {
			t.Errorf("%s: unhelpful error %q", c.name, err)
		}
	}
	// Boundary MTUs are accepted.
	if _, err := NewTemplate(macA, macB, a4, b4, 68, TemplateOptions{}); err != nil {
		t.Errorf("MTU 68: %v", err)
	}
	if _, err := NewTemplate(macA, macB, a6, b6, 1280, TemplateOptions{}); err != nil {
		t.Errorf("MTU 1280: %v", err)
	}
	if _, err := NewTemplate(macA, macB, a6, b6, 65535, TemplateOptions{}); err != nil {
		t.Errorf("MTU 65535: %v", err)
	}
}

func TestTooBig(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		tc    tmplCase
		n     int
		limit int
	}{
		{tmplCases[0], 65508, 65507},
		{tmplCases[0], 1 << 20, 65507},
		{tmplCases[6], 65528, 65527},
		{tmplCases[5], 1473, 1472}, // DontFragment at MTU 1500
	} {
		tm := newTestTemplate(t, c.tc)
		_, err := tm.Frames(c.n)
		_, err2 := tm.BuildFrame(make([]byte, 70000), make([]byte, c.n), 0, 0)
		for _, e := range []error{err, err2} {
			var tb *TooBigError
			if !errors.Is(e, ErrTooBig) || !errors.Is(e, unix.EMSGSIZE) || !errors.As(e, &tb) || tb.Limit != c.limit || tb.Size != c.n {
				t.Fatalf("%s payload %d: error %v, want ErrTooBig/EMSGSIZE with limit %d", c.tc.name, c.n, e, c.limit)
			}
			if !bytes.Contains([]byte(e.Error()), []byte(fmt.Sprint(c.limit))) {
				t.Fatalf("error %q does not state the limit %d", e, c.limit)
			}
		}
		if got := tm.MaxPayload(); got != c.limit {
			t.Fatalf("%s: MaxPayload = %d, want %d", c.tc.name, got, c.limit)
		}
	}
	if !errors.Is(ErrTooBig, unix.EMSGSIZE) {
		t.Fatal("ErrTooBig does not wrap EMSGSIZE")
	}
}

func TestBuildFrameArgumentErrors(t *testing.T) {
	t.Parallel()
	tm := newTestTemplate(t, tmplCases[0])
	buf := make([]byte, tm.MaxFrameLen())
	if _, err := tm.BuildFrame(buf, make([]byte, 100), 1, 0); err == nil {
		t.Error("frame index 1 of a single-frame datagram accepted")
	}
	if _, err := tm.BuildFrame(buf, make([]byte, 3000), 3, 0); err == nil {
		t.Error("frame index 3 of a 3-frame datagram accepted")
	}
	if _, err := tm.BuildFrame(buf, make([]byte, 3000), -1, 0); err == nil {
		t.Error("negative frame index accepted")
	}
	if _, err := tm.BuildFrame(buf[:100], make([]byte, 100), 0, 0); err == nil {
		t.Error("short buffer accepted (single frame)")
	}
	if _, err := tm.BuildFrame(buf[:1000], make([]byte, 3000), 1, 0); err == nil {
		t.Error("short buffer accepted (fragment)")
	}
	if _, err := tm.Frames(-1); err == nil {
		t.Error("negative payload length accepted")
	}
}

func TestNoAllocations(t *testing.T) {
	// Not parallel: AllocsPerRun measures the whole process.
	tm4 := newTestTemplate(t, tmplCases[1])
	tm6 := newTestTemplate(t, tmplCases[6])
	buf := make([]byte, max(tm4.MaxFrameLen(), tm6.MaxFrameLen()))
	small := testPayload(64, 1)
	big := testPayload(8000, 2)
	var f Frame
	for _, tm := range []*Template{tm4, tm6} {
		n, _ := tm.BuildFrame(buf, small, 0, 1)
		frame := append([]byte(nil), buf[:n]...)
		if err := Parse(frame, &f); err != nil {
			t.Fatal(err)
		}
		seg := f.Segment
		n, _ = tm.BuildFrame(buf, big, 1, 1)
		frag := append([]byte(nil), buf[:n]...)
		allocs := testing.AllocsPerRun(200, func() {
			if _, err := tm.BuildFrame(buf, small, 0, 1); err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				if _, err := tm.BuildFrame(buf, big, i, 1); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := tm.Frames(len(big)); err != nil {
				t.Fatal(err)
			}
			if err := Parse(frame, &f); err != nil || !f.VerifyUDP() {
				t.Fatal(err)
			}
			if err := Parse(frag, &f); err != nil {
				t.Fatal(err)
			}
			if err := Parse(frame[:20], &f); err == nil { // error path
				t.Fatal("truncated frame parsed")
			}
			if _, _, _, err := ParseUDPSegment(seg); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Fatalf("%v: %v allocations per BuildFrame/Parse round", tm.Dst(), allocs)
		}
	}
}

func BenchmarkBuildFrame64(b *testing.B) {
	tm := newTestTemplate(b, tmplCases[0])
	buf := make([]byte, tm.MaxFrameLen())
	payload := testPayload(64, 1)
	b.SetBytes(64)
	id := uint32(0)
	for b.Loop() {
		id++
		if _, err := tm.BuildFrame(buf, payload, 0, id); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBuildFrame64v6(b *testing.B) {
	tm := newTestTemplate(b, tmplCases[6])
	buf := make([]byte, tm.MaxFrameLen())
	payload := testPayload(64, 1)
	b.SetBytes(64)
	for b.Loop() {
		if _, err := tm.BuildFrame(buf, payload, 0, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBuildDatagram8000 builds all six frames of an 8000-byte datagram.
func BenchmarkBuildDatagram8000(b *testing.B) {
	tm := newTestTemplate(b, tmplCases[0])
	buf := make([]byte, tm.MaxFrameLen())
	payload := testPayload(8000, 1)
	n, _ := tm.Frames(len(payload))
	b.SetBytes(int64(len(payload)))
	for b.Loop() {
		for i := 0; i < n; i++ {
			if _, err := tm.BuildFrame(buf, payload, i, 1); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func BenchmarkParse64(b *testing.B) {
	tm := newTestTemplate(b, tmplCases[0])
	buf := make([]byte, tm.MaxFrameLen())
	n, _ := tm.BuildFrame(buf, testPayload(64, 1), 0, 1)
	frame := buf[:n]
	var f Frame
	b.SetBytes(64)
	for b.Loop() {
		if err := Parse(frame, &f); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseVerify64(b *testing.B) {
	tm := newTestTemplate(b, tmplCases[0])
	buf := make([]byte, tm.MaxFrameLen())
	n, _ := tm.BuildFrame(buf, testPayload(64, 1), 0, 1)
	frame := buf[:n]
	var f Frame
	b.SetBytes(64)
	for b.Loop() {
		if err := Parse(frame, &f); err != nil || !f.VerifyUDP() {
			b.Fatal(err)
		}
	}
}
