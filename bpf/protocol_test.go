package bpf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/netlab"
	"golang.org/x/sys/unix"
)

// inject sends raw Ethernet frames from B to A with a packet socket.
func inject(t *testing.T, lab *netlab.Pair, frames ...[]byte) {
	t.Helper()
	err := lab.B.NS.Do(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		sa := &unix.SockaddrLinklayer{Ifindex: lab.B.Index, Halen: 6}
		copy(sa.Addr[:], lab.A.MAC)
		for i, f := range frames {
			if err := unix.Sendto(fd, f, 0, sa); err != nil {
				return fmt.Errorf("frame %d: %w", i, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("inject frames from %s: %v", lab.B.Name, err)
	}
}

// frameBuilder writes Ethernet frames from B to A.
type frameBuilder struct{ lab *netlab.Pair }

// eth returns an Ethernet header with the given TPIDs (VLAN tags, outermost
// first) and final EtherType, followed by rest.
func (b frameBuilder) eth(tpids []uint16, etherType uint16, rest ...byte) []byte {
	f := append([]byte{}, b.lab.A.MAC...)
	f = append(f, b.lab.B.MAC...)
	for i, tpid := range tpids {
		f = binary.BigEndian.AppendUint16(f, tpid)
		f = binary.BigEndian.AppendUint16(f, uint16(100+i)) // VLAN id
	}
	f = binary.BigEndian.AppendUint16(f, etherType)
	return append(f, rest...)
}

// ipv4 returns an IPv4 header from B to A, padded with NOP options up to
// the length its IHL claims.
func (b frameBuilder) ipv4(verIHL byte, proto byte, totalLen int) []byte {
	a4, b4 := b.lab.A.Addr4().As4(), b.lab.B.Addr4().As4()
	h := []byte{verIHL, 0, byte(totalLen >> 8), byte(totalLen), 0, 1, 0, 0, 64, proto, 0, 0}
	h = append(h, b4[:]...)
	h = append(h, a4[:]...)
	for len(h) < int(verIHL&0x0f)*4 {
		h = append(h, 1)
	}
	return h
}

// ipv6 returns an IPv6 header from B to A.
func (b frameBuilder) ipv6(next byte, payloadLen int) []byte {
	a6, b6 := b.lab.A.Addr6().As16(), b.lab.B.Addr6().As16()
	h := []byte{0x60, 0, 0, 0, byte(payloadLen >> 8), byte(payloadLen), next, 64}
	h = append(h, b6[:]...)
	return append(h, a6[:]...)
}

// udpDatagram returns a UDP header and payload (checksum 0: the program
// does not verify it).
func udpDatagram(sport, dport uint16, payload []byte) []byte {
	u := binary.BigEndian.AppendUint16(nil, sport)
	u = binary.BigEndian.AppendUint16(u, dport)
	u = binary.BigEndian.AppendUint16(u, uint16(8+len(payload)))
	u = append(u, 0, 0)
	return append(u, payload...)
}

// TestVLAN injects tagged frames (802.1Q, 802.1ad+802.1Q, double 802.1Q)
// and checks that the program finds the UDP header behind the tags. This
// kernel has no VLAN devices, so the frames are built by hand.
func TestVLAN(t *testing.T) {
	t.Parallel()
	lab := netlab.NewPair(t, netlab.Options{})
	p := attachIn(t, lab.A, Options{Mode: ModeNative})
	x := newTestXSK(t, lab.A.NS, lab.A.Index)
	if err := p.SetSocket(0, x.fd); err != nil {
		t.Fatal(err)
	}
	const port = 7777
	for _, a := range []netip.Addr{lab.A.Addr4(), lab.A.Addr6()} {
		if err := p.AddFlow(Flow{Proto: unix.IPPROTO_UDP, Dst: netip.AddrPortFrom(a, port)}, 0); err != nil {
			t.Fatal(err)
		}
	}
	b := frameBuilder{lab}
	build := func(tags []uint16, v6 bool, payload string) []byte {
		u := udpDatagram(4242, port, []byte(payload))
		if v6 {
			return b.eth(tags, 0x86dd, append(b.ipv6(unix.IPPROTO_UDP, len(u)), u...)...)
		}
		return b.eth(tags, 0x0800, append(b.ipv4(0x45, unix.IPPROTO_UDP, 20+len(u)), u...)...)
	}
	tagSets := []struct {
		name string
		tags []uint16
	}{
		{"802.1Q", []uint16{0x8100}},
		{"802.1ad+802.1Q", []uint16{0x88a8, 0x8100}},
		{"802.1Q+802.1Q", []uint16{0x8100, 0x8100}},
	}
	for _, ts := range tagSets {
		for _, v6 := range []bool{false, true} {
			payload := fmt.Sprintf("%s/v6=%v", ts.name, v6)
			before := counters(t, p)
			inject(t, lab, build(ts.tags, v6, payload))
			frame := x.waitFrames(t, 1)[0]
			if !bytes.HasSuffix(frame, []byte(payload)) {
				t.Fatalf("%s: AF_XDP frame does not carry the datagram: %x", payload, frame)
			}
			if d := counters(t, p).sub(before); d.Redirected != 1 || d.Malformed != 0 {
				t.Fatalf("%s: counter delta %+v, want Redirected 1", payload, d)
			}
		}
	}

	// Three tags are more than the program walks: passed, not parsed. The
	// single-tag frame after it proves it was processed (native veth XDP
	// keeps order).
	before := counters(t, p)
	inject(t, lab, build([]uint16{0x88a8, 0x8100, 0x8100}, false, "three tags"), build([]uint16{0x8100}, false, "after"))
	frames := x.waitFrames(t, 1)
	if len(frames) != 1 || !bytes.HasSuffix(frames[0], []byte("after")) {
		t.Fatalf("AF_XDP socket got %d frames, want only the single-tag one", len(frames))
	}
	if d := counters(t, p).sub(before); d.Passed < 1 || d.Redirected != 1 {
		t.Fatalf("counter delta %+v, want the triple-tagged frame passed", d)
	}
}

// TestIPv6ExtensionHeaders sends UDP behind hop-by-hop and destination
// options headers from a kernel socket, whole and fragmented (hop-by-hop
// before the Fragment header, destination options after it).
func TestIPv6ExtensionHeaders(t *testing.T) {
	t.Parallel()
	lab := netlab.NewPair(t, netlab.Options{})
	p := attachIn(t, lab.A, Options{})
	x := newTestXSK(t, lab.A.NS, lab.A.Index)
	if err := p.SetSocket(0, x.fd); err != nil {
		t.Fatal(err)
	}
	kernel := lab.A.NS.ListenUDP(t, netip.AddrPortFrom(lab.A.Addr6(), 0))
	dst := netip.AddrPortFrom(lab.A.Addr6(), localPort(kernel))
	if err := p.AddFlow(Flow{Proto: unix.IPPROTO_UDP, Dst: dst}, 0); err != nil {
		t.Fatal(err)
	}
	sender := lab.B.NS.ListenUDP(t, netip.AddrPortFrom(lab.B.Addr6(), 0))
	raw, err := sender.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	// One 8-byte options header holding a PadN option.
	padN := string([]byte{0, 0, 1, 4, 0, 0, 0, 0})
	var serr error
	err = raw.Control(func(fd uintptr) {
		if serr = unix.SetsockoptString(int(fd), unix.IPPROTO_IPV6, unix.IPV6_HOPOPTS, padN); serr == nil {
			serr = unix.SetsockoptString(int(fd), unix.IPPROTO_IPV6, unix.IPV6_DSTOPTS, padN)
		}
	})
	if err != nil || serr != nil {
		t.Fatalf("set IPv6 options on sender: %v %v", err, serr)
	}

	before := counters(t, p)
	send(t, sender, dst, []byte("ext-headers"))
	frame := x.waitFrames(t, 1)[0]
	if frame[14+6] != 0 || !bytes.HasSuffix(frame, []byte("ext-headers")) { // IPv6 next header: hop-by-hop
		t.Fatalf("frame lacks the hop-by-hop header or payload: %x", frame)
	}
	if d := counters(t, p).sub(before); d.Redirected != 1 || d.Malformed != 0 {
		t.Fatalf("counter delta %+v, want Redirected 1", d)
	}

	const size = 4000
	perFrag := (lab.A.MTU - 40 - 8 - 8) &^ 7 // IPv6, hop-by-hop, Fragment
	n := (8 + 8 + size + perFrag - 1) / perFrag
	big := payloads("ext", 1, size)[0]
	before = counters(t, p)
	send(t, sender, dst, big)
	x.waitFrames(t, n)
	if d := counters(t, p).sub(before); d.Redirected != uint64(n) || d.Fragments != uint64(n) || d.NoSocket != 0 {
		t.Fatalf("fragmented: counter delta %+v, want Redirected = Fragments = %d", d, n)
	}
	assertNoFragState(t, p)

	if err := p.ClearSocket(0); err != nil {
		t.Fatal(err)
	}
	send(t, sender, dst, big)
	if got := recvUDP(t, kernel, 1)[0]; !bytes.Equal(got, big) {
		t.Fatal("kernel did not get the fragmented datagram intact")
	}
}

// TestMalformed injects truncated or inconsistent frames: they are counted
// and passed, never redirected.
func TestMalformed(t *testing.T) {
	t.Parallel()
	lab := netlab.NewPair(t, netlab.Options{})
	p := attachIn(t, lab.A, Options{Mode: ModeNative})
	x := newTestXSK(t, lab.A.NS, lab.A.Index)
	if err := p.SetSocket(0, x.fd); err != nil {
		t.Fatal(err)
	}
	kernel := lab.A.NS.ListenUDP(t, netip.AddrPortFrom(lab.A.Addr4(), 0))
	dst := netip.AddrPortFrom(lab.A.Addr4(), localPort(kernel))
	// A flow for the very address and port the broken frames claim, so a
	// parser that read past the end would redirect them.
	for _, a := range []netip.Addr{lab.A.Addr4(), lab.A.Addr6()} {
		if err := p.AddFlow(Flow{Proto: unix.IPPROTO_UDP, Dst: netip.AddrPortFrom(a, dst.Port())}, 0); err != nil {
			t.Fatal(err)
		}
	}

	b := frameBuilder{lab}
	udp := udpDatagram(4242, dst.Port(), nil)
	// IHL 15 claims 60 header bytes, but the frame ends after 20 + 8.
	longIHL := b.ipv4(0x4f, unix.IPPROTO_UDP, 28)[:20]
	frames := [][]byte{
		b.eth(nil, 0x0800, b.ipv4(0x45, unix.IPPROTO_UDP, 28)[:10]...),                       // IPv4 header cut
		b.eth(nil, 0x0800, append(longIHL, udp...)...),                                       // options past the end
		b.eth(nil, 0x0800, append(b.ipv4(0x65, unix.IPPROTO_UDP, 28), udp...)...),            // version 6 in an IPv4 frame
		b.eth(nil, 0x0800, append(b.ipv4(0x44, unix.IPPROTO_UDP, 28), udp...)...),            // IHL below 5
		b.eth(nil, 0x0800, append(b.ipv4(0x45, unix.IPPROTO_UDP, 24), udp[:4]...)...),        // UDP header cut
		b.eth(nil, 0x86dd, b.ipv6(unix.IPPROTO_UDP, 8)[:20]...),                              // IPv6 header cut
		b.eth(nil, 0x86dd, append(b.ipv6(0, 16), unix.IPPROTO_UDP, 10, 1, 4, 0, 0, 0, 0)...), // hop-by-hop longer than the frame
		b.eth(nil, 0x8100, 0, 100), // VLAN tag cut
	}

	before := counters(t, p)
	inject(t, lab, frames...)
	// Native veth XDP handles frames in order: once a later datagram reached
	// the kernel, the injected frames have been counted.
	if err := p.ClearSocket(0); err != nil {
		t.Fatal(err)
	}
	sender := lab.B.NS.ListenUDP(t, netip.AddrPortFrom(lab.B.Addr4(), 0))
	send(t, sender, dst, []byte("sync"))
	recvUDP(t, kernel, 1)
	d := counters(t, p).sub(before)
	if d.Malformed != uint64(len(frames)) || d.Redirected != 0 {
		t.Fatalf("counter delta %+v, want Malformed %d and nothing redirected", d, len(frames))
	}
	if got := x.frames(); len(got) != 0 {
		t.Fatalf("%d malformed frames reached the AF_XDP socket", len(got))
	}
}

// tcpSegment returns a 20-byte TCP header (SYN) and payload; the program
// reads only the ports, so the checksum stays 0.
func tcpSegment(sport, dport uint16, payload []byte) []byte {
	s := binary.BigEndian.AppendUint16(nil, sport)
	s = binary.BigEndian.AppendUint16(s, dport)
	s = append(s, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0)
	return append(s, payload...)
}

// TestTCPSteering checks TCP flows: a 3-tuple entry steers every segment
// to its port, a 5-tuple entry only its connection's, the protocol is part
// of the key (UDP to the same port stays with the kernel), and fragmented
// or truncated TCP goes to the kernel.
func TestTCPSteering(t *testing.T) {
	t.Parallel()
	lab := netlab.NewPair(t, netlab.Options{})
	p := attachIn(t, lab.A, Options{Mode: ModeNative})
	x := newTestXSK(t, lab.A.NS, lab.A.Index)
	if err := p.SetSocket(0, x.fd); err != nil {
		t.Fatal(err)
	}
	const listen, local, remote = 8015, 8016, 9015
	for _, a := range []netip.Addr{lab.A.Addr4(), lab.A.Addr6()} {
		if err := p.AddFlow(Flow{Proto: unix.IPPROTO_TCP, Dst: netip.AddrPortFrom(a, listen)}, 0); err != nil {
			t.Fatal(err)
		}
	}
	conn := Flow{Proto: unix.IPPROTO_TCP, Dst: netip.AddrPortFrom(lab.A.Addr4(), local), Src: netip.AddrPortFrom(lab.B.Addr4(), remote)}
	if err := p.AddFlow(conn, 0); err != nil {
		t.Fatal(err)
	}
	b := frameBuilder{lab}
	tcp4 := func(sport, dport uint16, payload string) []byte {
		s := tcpSegment(sport, dport, []byte(payload))
		return b.eth(nil, 0x0800, append(b.ipv4(0x45, unix.IPPROTO_TCP, 20+len(s)), s...)...)
	}
	tcp6 := func(sport, dport uint16, payload string) []byte {
		s := tcpSegment(sport, dport, []byte(payload))
		return b.eth(nil, 0x86dd, append(b.ipv6(unix.IPPROTO_TCP, len(s)), s...)...)
	}
	for _, f := range [][]byte{tcp4(40000, listen, "listen4"), tcp6(40000, listen, "listen6"), tcp4(remote, local, "conn")} {
		before := counters(t, p)
		inject(t, lab, f)
		got := x.waitFrames(t, 1)[0]
		if !bytes.Equal(got, f) {
			t.Fatalf("AF_XDP frame %x, want %x", got, f)
		}
		if d := counters(t, p).sub(before); d.Redirected != 1 {
			t.Fatalf("counter delta %+v, want Redirected 1", d)
		}
	}

	// Not ours: another source port of the 5-tuple's port, UDP to the
	// listening port, a first fragment of TCP, a cut TCP header (malformed).
	u := udpDatagram(40000, listen, nil)
	frag := b.ipv4(0x45, unix.IPPROTO_TCP, 20+20)
	frag[6] = 0x20 // MF
	seg := tcpSegment(40000, listen, nil)
	passed := [][]byte{
		tcp4(remote+1, local, "other source"),
		b.eth(nil, 0x0800, append(b.ipv4(0x45, unix.IPPROTO_UDP, 20+len(u)), u...)...),
		b.eth(nil, 0x0800, append(frag, seg...)...),
	}
	cut := b.eth(nil, 0x0800, append(b.ipv4(0x45, unix.IPPROTO_TCP, 20+12), seg[:12]...)...)
	before := counters(t, p)
	inject(t, lab, append(passed, cut, tcp4(40001, listen, "sync"))...)
	frames := x.waitFrames(t, 1)
	if len(frames) != 1 || !bytes.HasSuffix(frames[0], []byte("sync")) {
		t.Fatalf("AF_XDP socket got %d frames, want only the last one", len(frames))
	}
	if d := counters(t, p).sub(before); d.Passed != uint64(len(passed)) || d.Malformed != 1 || d.Redirected != 1 {
		t.Fatalf("counter delta %+v, want %d passed, 1 malformed, 1 redirected", d, len(passed))
	}
}

// TestVXLANSteering injects VXLAN datagrams: a flow inside an overlay is
// steered by (VNI, inner tuple) only while its port is in use; other VNIs,
// other inner ports, other UDP ports, ARP inside the tunnel and a header
// without the I flag reach the kernel.
func TestVXLANSteering(t *testing.T) {
	t.Parallel()
	lab := netlab.NewPair(t, netlab.Options{})
	p := attachIn(t, lab.A, Options{Mode: ModeNative})
	x := newTestXSK(t, lab.A.NS, lab.A.Index)
	if err := p.SetSocket(0, x.fd); err != nil {
		t.Fatal(err)
	}
	const vni, vxPort, port = 0x171717, 4789, 7000
	inner4 := netip.MustParseAddr("192.168.17.1")
	inner6 := netip.MustParseAddr("fd17::1")
	flows := []Flow{
		{Proto: unix.IPPROTO_UDP, Dst: netip.AddrPortFrom(inner4, port), VNI: vni, VXLANPort: vxPort},
		{Proto: unix.IPPROTO_UDP, Dst: netip.AddrPortFrom(inner6, port), VNI: vni, VXLANPort: vxPort},
	}
	for _, f := range flows {
		if err := p.AddFlow(f, 0); err != nil {
			t.Fatal(err)
		}
	}
	if ports, err := p.VXLANPorts(); err != nil || len(ports) != 1 || ports[vxPort] != 2 {
		t.Fatalf("VXLAN ports %v (%v), want 4789 used by 2 flows", ports, err)
	}
	got, err := p.Flows()
	if err != nil || got[flows[0]] != 0 || len(got) != 2 {
		t.Fatalf("Flows() = %v (%v), want the overlay flows back with their port", got, err)
	}
	b := frameBuilder{lab}
	innerFrame := func(dst netip.Addr, dport uint16, payload string) []byte {
		u := udpDatagram(5555, dport, []byte(payload))
		var ip []byte
		if dst.Is4() {
			s, d := netip.MustParseAddr("192.168.17.2").As4(), dst.As4()
			ip = []byte{0x45, 0, byte((20 + len(u)) >> 8), byte(20 + len(u)), 0, 1, 0, 0, 64, unix.IPPROTO_UDP, 0, 0}
			ip = append(append(ip, s[:]...), d[:]...)
			return append(append([]byte{2, 0, 0, 0, 0x17, 1, 2, 0, 0, 0, 0x17, 2, 0x08, 0x00}, ip...), u...)
		}
		s, d := netip.MustParseAddr("fd17::2").As16(), dst.As16()
		ip = []byte{0x60, 0, 0, 0, byte(len(u) >> 8), byte(len(u)), unix.IPPROTO_UDP, 64}
		ip = append(append(ip, s[:]...), d[:]...)
		return append(append([]byte{2, 0, 0, 0, 0x17, 1, 2, 0, 0, 0, 0x17, 2, 0x86, 0xdd}, ip...), u...)
	}
	outer := func(udpPort uint16, flags byte, vni uint32, inner []byte) []byte {
		vx := []byte{flags, 0, 0, 0, byte(vni >> 16), byte(vni >> 8), byte(vni), 0}
		u := udpDatagram(40000, udpPort, append(vx, inner...))
		return b.eth(nil, 0x0800, append(b.ipv4(0x45, unix.IPPROTO_UDP, 20+len(u)), u...)...)
	}
	arp := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0x17, 2, 0x08, 0x06}, make([]byte, 28)...)
	for _, c := range []struct {
		name    string
		frame   []byte
		steered bool
	}{
		{"IPv4 in the VNI", outer(vxPort, 0x08, vni, innerFrame(inner4, port, "v4 steered")), true},
		{"IPv6 in the VNI", outer(vxPort, 0x08, vni, innerFrame(inner6, port, "v6 steered")), true},
		{"other VNI", outer(vxPort, 0x08, vni+1, innerFrame(inner4, port, "other vni")), false},
		{"other inner port", outer(vxPort, 0x08, vni, innerFrame(inner4, port+1, "other port")), false},
		{"not a VXLAN port", outer(8472, 0x08, vni, innerFrame(inner4, port, "port 8472")), false},
		{"no I flag", outer(vxPort, 0x00, vni, innerFrame(inner4, port, "no I flag")), false},
		{"ARP in the tunnel", outer(vxPort, 0x08, vni, arp), false},
		{"truncated VXLAN header", outer(vxPort, 0x08, vni, nil)[:14+20+8+4], false},
	} {
		before := counters(t, p)
		// The frame after it proves it was processed (native veth XDP
		// keeps order).
		marker := outer(vxPort, 0x08, vni, innerFrame(inner4, port, "marker"))
		inject(t, lab, c.frame, marker)
		want := 1
		if c.steered {
			want = 2
		}
		frames := x.waitFrames(t, want)
		if len(frames) != want || !bytes.HasSuffix(frames[len(frames)-1], []byte("marker")) {
			t.Fatalf("%s: AF_XDP socket got %d frames, want %d", c.name, len(frames), want)
		}
		if c.steered && !bytes.Equal(frames[0], c.frame) {
			t.Fatalf("%s: the redirected frame is not the one sent:\n%x\n%x", c.name, frames[0], c.frame)
		}
		if d := counters(t, p).sub(before); d.Redirected != uint64(want) {
			t.Fatalf("%s: counter delta %+v, want Redirected %d", c.name, d, want)
		}
	}

	// Without overlay flows the program stops looking into port 4789.
	for _, f := range flows {
		if err := p.DeleteFlow(f); err != nil {
			t.Fatal(err)
		}
	}
	if ports, err := p.VXLANPorts(); err != nil || len(ports) != 0 {
		t.Fatalf("VXLAN ports after deleting the flows: %v (%v)", ports, err)
	}
	before := counters(t, p)
	inject(t, lab, outer(vxPort, 0x08, vni, innerFrame(inner4, port, "gone")))
	deadline := time.Now().Add(5 * time.Second)
	for counters(t, p).sub(before).Passed == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if d := counters(t, p).sub(before); d.Redirected != 0 || d.Passed != 1 {
		t.Fatalf("a deleted overlay flow: counter delta %+v, want Passed 1", d)
	}

	// Four ports at most; a fifth is refused with ENOSPC and changes
	// nothing.
	for i := range uint16(MaxVXLANPorts + 1) {
		f := Flow{Proto: unix.IPPROTO_UDP, Dst: netip.AddrPortFrom(inner4, port+i), VNI: vni, VXLANPort: 5000 + i}
		err := p.AddFlow(f, 0)
		if i < MaxVXLANPorts && err != nil {
			t.Fatal(err)
		}
		if i == MaxVXLANPorts && (!errors.Is(err, unix.ENOSPC) || !strings.Contains(err.Error(), "use one dstport")) {
			t.Fatalf("fifth VXLAN port: %v, want ENOSPC", err)
		}
	}
	if ports, _ := p.VXLANPorts(); len(ports) != MaxVXLANPorts {
		t.Fatalf("VXLAN ports %v", ports)
	}
	if got, _ := p.Flows(); len(got) != MaxVXLANPorts {
		t.Fatalf("flows after the refused one: %v", got)
	}
}
