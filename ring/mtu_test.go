package ring_test

import (
	"bytes"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring"
)

// setMTU sets the MTU of both ends of the lab's pair, the peer first.
func setMTU(t *testing.T, p *netlab.Pair, mtu int) {
	t.Helper()
	for _, l := range []*netlab.Link{p.B, p.A} {
		nl := l.NS.Netlink()
		link, err := nl.LinkByName(l.Name)
		if err == nil {
			err = nl.LinkSetMTU(link, mtu)
		}
		if err != nil {
			t.Fatalf("set MTU %d on %s: %v", mtu, l.Name, err)
		}
	}
}

// exchangeJumbo sends a size-byte datagram each way between ep and peer until
// both arrive intact (datagrams may be lost while the ring re-opens its
// fast path) and returns how many IP fragments the peer reassembled for
// the last one it received.
func exchangeJumbo(t *testing.T, l *lab, ep *ring.Endpoint, peer *net.UDPConn, size int, within time.Duration) uint64 {
	t.Helper()
	want := payload(size, size)
	buf := make([]byte, 70000)
	peerAddr := peer.LocalAddr().(*net.UDPAddr).AddrPort()
	deadline := time.Now().Add(within)
	for {
		if time.Now().After(deadline) {
			st := l.r.Stats()
			t.Fatalf("%d-byte datagrams did not get through within %v (MTU %d; ring rx %d tx %d tx errors %d; provider %+v; fallback %+v)",
				size, within, l.r.MTU(), st.RXPackets.Load(), st.TXPackets.Load(), st.TXErrors.Load(), l.r.ProviderStats(), l.r.FallbackStats())
		}
		reasm := ipStat(t, l.p.B.NS, "ReasmReqds")
		if err := ep.Send(want, peerAddr, time.Time{}); err != nil {
			t.Fatalf("ring send: %v", err)
		}
		_ = peer.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		n, _, err := peer.ReadFromUDPAddrPort(buf)
		if err != nil || !bytes.Equal(buf[:n], want) {
			continue
		}
		frags := ipStat(t, l.p.B.NS, "ReasmReqds") - reasm
		if _, err := peer.WriteToUDPAddrPort(want, ep.LocalAddr()); err != nil {
			t.Fatalf("kernel send: %v", err)
		}
		n, _, err = ep.Recv(buf, time.Now().Add(300*time.Millisecond))
		if err == nil && bytes.Equal(buf[:n], want) {
			return frags
		}
	}
}

// TestMTUChange: the interface MTU goes 1500 → 9000 → 1500 under traffic.
// The ring follows: at 9000 it re-opens its fast path multi-buffer and
// sends 8972-byte datagrams unfragmented; back at 1500 it cuts them into
// fragments again. It never stops, and background traffic resumes.
func TestMTUChange(t *testing.T) {
	l := newLab(t, ring.Config{Fallback: ring.FallbackAuto})
	ep := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
	peer := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))

	// Background traffic: the peer streams small datagrams to a second
	// endpoint; a reader drains it.
	bg := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
	stream := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	var received atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		msg := make([]byte, 1000)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			_, _ = stream.WriteToUDPAddrPort(msg, bg.LocalAddr())
		}
	}()
	go func() {
		defer wg.Done()
		buf := make([]byte, 2000)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, _, err := bg.Recv(buf, time.Now().Add(50*time.Millisecond)); err == nil {
				received.Add(1)
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	resumed := func(stage string) {
		t.Helper()
		start := received.Load()
		deadline := time.Now().Add(10 * time.Second)
		for received.Load() < start+20 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: background traffic did not resume (%d received in all)", stage, received.Load())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	if frags := exchangeJumbo(t, l, ep, peer, 8972, 5*time.Second); frags != 7 {
		t.Errorf("MTU 1500: an 8972-byte datagram left as %d fragments, want 7", frags)
	}
	resumed("MTU 1500")

	setMTU(t, l.p, 9000)
	deadline := time.Now().Add(15 * time.Second)
	for caps := l.r.Caps(); l.r.MTU() != 9000 || !caps.MultiBuffer || l.r.FallbackStats().OnTAP; caps = l.r.Caps() {
		if time.Now().After(deadline) {
			t.Fatalf("after raising the MTU: ring MTU %d, caps %+v, fallback %+v; want 9000 on a multi-buffer afxdp path", l.r.MTU(), caps, l.r.FallbackStats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if frags := exchangeJumbo(t, l, ep, peer, 8972, 15*time.Second); frags != 0 {
		t.Errorf("MTU 9000: an 8972-byte datagram left as %d fragments, want one frame", frags)
	}
	exchangeJumbo(t, l, ep, peer, 65000, 5*time.Second)
	resumed("MTU 9000")

	setMTU(t, l.p, 1500)
	deadline = time.Now().Add(10 * time.Second)
	for l.r.MTU() != 1500 {
		if time.Now().After(deadline) {
			t.Fatalf("the ring did not notice the MTU going back to 1500 (still %d)", l.r.MTU())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if frags := exchangeJumbo(t, l, ep, peer, 8972, 5*time.Second); frags != 7 {
		t.Errorf("back at MTU 1500: an 8972-byte datagram left as %d fragments, want 7", frags)
	}
	resumed("back at MTU 1500")

	if err := l.r.Err(); err != nil {
		t.Fatalf("ring stopped: %v", err)
	}
	fb := l.r.FallbackStats()
	if fb.Plugouts != 1 || fb.Plugins != 1 || fb.OnTAP {
		t.Errorf("fallback %+v: want one re-open for the raised MTU (1 plug-out, 1 plug-in) and the fast path in use", fb)
	}
	st := l.r.Stats()
	t.Logf("background datagrams received: %d; fallback %+v; ring rx %d tx %d (%d fragments)", received.Load(), fb, st.RXPackets.Load(), st.TXPackets.Load(), st.TXFragments.Load())
}
