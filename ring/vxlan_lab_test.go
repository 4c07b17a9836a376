package ring_test

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring"
)

// vxlanSizes cross the overlay's MTU (1450: 1422 bytes of UDP payload in
// one frame): inner fragments both ways.
var vxlanSizes = []int{1, 700, 1422, 1423, 8000}

// TestVXLANOverlay: an endpoint bound to an address of a VXLAN device over
// the ring's interface exchanges datagrams with a kernel VXLAN device in the
// peer namespace, byte for byte both ways, through the ring (its counters
// rose, the namespace's kernel UDP counters did not); another VNI and the
// overlay's other ports stay with the kernel.
func TestVXLANOverlay(t *testing.T) {
	t.Parallel()
	l := newLabWith(t, netlab.Options{StaticNeigh: true}, ring.Config{})
	oa, ob := l.p.AddVXLAN(t, 4217, 4789, 17)
	xa, xb := l.p.AddVXLAN(t, 4218, 4789, 18)
	ep := l.bind(t, netip.AddrPortFrom(oa.Addr4(), 0))
	peer := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(ob.Addr4(), 0))
	peerAddr := peer.LocalAddr().(*net.UDPAddr).AddrPort()
	// Kernel sockets beside it: another port on the same overlay, and the
	// same port on the other VNI's device.
	kSame := l.p.A.NS.ListenUDP(t, netip.AddrPortFrom(oa.Addr4(), 0))
	kOther := l.p.A.NS.ListenUDP(t, netip.AddrPortFrom(xa.Addr4(), ep.LocalAddr().Port()))
	otherPeer := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(xb.Addr4(), 0))

	inBefore := udpStat(t, l.p.A.NS, false, "InDatagrams")
	outBefore := udpStat(t, l.p.A.NS, false, "OutDatagrams")
	csumBefore := udpStat(t, l.p.B.NS, false, "InCsumErrors")
	const perSize = 20
	buf := make([]byte, 70000)
	n := 0
	for _, size := range vxlanSizes {
		for i := range perSize {
			want := payload(i, size)
			if err := ep.Send(want, peerAddr, time.Now().Add(5*time.Second)); err != nil {
				t.Fatalf("ring send: %v", err)
			}
			_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
			got, from, err := peer.ReadFromUDPAddrPort(buf)
			if err != nil {
				t.Fatalf("size %d datagram %d: kernel recv on the overlay: %v (ring stats %+v)", size, i, err, l.r.Stats())
			}
			if !bytes.Equal(buf[:got], want) || from != ep.LocalAddr() {
				t.Fatalf("size %d datagram %d: %d bytes from %v, want %d from %v", size, i, got, from, size, ep.LocalAddr())
			}
			want = payload(i+1000, size)
			if _, err := peer.WriteToUDPAddrPort(want, ep.LocalAddr()); err != nil {
				t.Fatalf("kernel send: %v", err)
			}
			got, from, err = ep.Recv(buf, time.Now().Add(5*time.Second))
			if err != nil {
				t.Fatalf("size %d datagram %d: ring recv: %v (ring stats %+v)", size, i, err, l.r.Stats())
			}
			if !bytes.Equal(buf[:got], want) || from != peerAddr {
				t.Fatalf("size %d datagram %d: ring got %d bytes from %v, want %d from %v", size, i, got, from, size, peerAddr)
			}
			n++
		}
	}
	st := l.r.Stats()
	if st.TXPackets.Load() != uint64(n) || st.RXPackets.Load() != uint64(n) || st.TXEncapsulated.Load() != uint64(n) {
		t.Errorf("ring counted TX %d (encapsulated %d), RX %d datagrams, want %d each", st.TXPackets.Load(), st.TXEncapsulated.Load(), st.RXPackets.Load(), n)
	}
	if st.RXDecapsulated.Load() < uint64(n) || st.RXChecksum.Load() != 0 || st.RXMalformed.Load() != 0 {
		t.Errorf("decapsulated %d frames for %d datagrams, checksum errors %d, malformed %d", st.RXDecapsulated.Load(), n, st.RXChecksum.Load(), st.RXMalformed.Load())
	}
	t.Logf("ring: TX %d (encapsulated %d), RX %d (decapsulated frames %d), reassembled %d", st.TXPackets.Load(), st.TXEncapsulated.Load(), st.RXPackets.Load(), st.RXDecapsulated.Load(), l.r.ReassemblyStats().Reassembled)
	if l.r.ReassemblyStats().Reassembled != 2*perSize {
		t.Errorf("reassembled %d inner datagrams, want %d", l.r.ReassemblyStats().Reassembled, 2*perSize)
	}
	if d := udpStat(t, l.p.A.NS, false, "InDatagrams") - inBefore; d != 0 {
		t.Errorf("the kernel received %d UDP datagrams in the bypassed namespace (the tunnel's or the overlay's)", d)
	}
	if d := udpStat(t, l.p.A.NS, false, "OutDatagrams") - outBefore; d != 0 {
		t.Errorf("the kernel sent %d UDP datagrams from the bypassed namespace", d)
	}
	if d := udpStat(t, l.p.B.NS, false, "InCsumErrors") - csumBefore; d != 0 {
		t.Errorf("the peer counted %d UDP checksum errors", d)
	}

	// The overlay's other port and the other VNI reach the kernel.
	rxBefore := st.RXPackets.Load()
	for _, c := range []struct {
		from *net.UDPConn
		to   *net.UDPConn
	}{{peer, kSame}, {otherPeer, kOther}} {
		msg := []byte("for the kernel")
		if _, err := c.from.WriteToUDPAddrPort(msg, c.to.LocalAddr().(*net.UDPAddr).AddrPort()); err != nil {
			t.Fatal(err)
		}
		_ = c.to.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, _, err := c.to.ReadFromUDPAddrPort(buf)
		if err != nil || !bytes.Equal(buf[:got], msg) {
			t.Fatalf("kernel socket %v: %v", c.to.LocalAddr(), err)
		}
	}
	if st.RXPackets.Load() != rxBefore {
		t.Errorf("the ring took datagrams that were not its endpoint's")
	}
	if ep.Stats().RXPackets.Load() != uint64(n) {
		t.Errorf("endpoint received %d datagrams, want %d", ep.Stats().RXPackets.Load(), n)
	}
	if err := ep.JoinGroup(netip.MustParseAddr("239.1.1.1"), netip.Addr{}); !errors.Is(err, unix.EOPNOTSUPP) {
		t.Errorf("join on the overlay: %v, want EOPNOTSUPP", err)
	}
	if err := l.r.CanHandOver(); err == nil {
		t.Error("a ring with overlay endpoints says it can be handed over")
	}
}
