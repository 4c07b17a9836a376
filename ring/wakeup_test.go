package ring_test

import (
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/bypassd/bypassd/ring"
)

// TestNewEndpointWakesEngine: an endpoint bound while the engine sleeps
// (its idle timeout is a second) gets its first datagram out at once, not
// when the engine happens to wake up. The bound is generous; the wake-up
// takes well under a millisecond.
func TestNewEndpointWakesEngine(t *testing.T) {
	l := newLab(t, ring.Config{})
	recv := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	time.Sleep(50 * time.Millisecond) // let the engine go to sleep
	for i := 0; i < 3; i++ {
		ep := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
		time.Sleep(50 * time.Millisecond)
		if err := ep.Send([]byte("wake"), recv.LocalAddr().(*net.UDPAddr).AddrPort(), time.Time{}); err != nil {
			t.Fatal(err)
		}
		_ = recv.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := recv.Read(make([]byte, 16)); err != nil {
			t.Fatalf("endpoint %d: first datagram not sent while the engine slept: %v", i, err)
		}
	}
}
