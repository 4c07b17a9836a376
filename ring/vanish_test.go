package ring_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/bypassd/bypassd/ring"
)

// TestVanishedInterface: when the ring's interface disappears the engine
// stops with an error saying so, and users blocked on its endpoints are
// released (net.ErrClosed) instead of waiting forever.
func TestVanishedInterface(t *testing.T) {
	for _, fb := range []ring.Fallback{ring.FallbackNone, ring.FallbackAuto, ring.FallbackTAP} {
		t.Run(fb.String(), func(t *testing.T) {
			t.Parallel()
			testVanishedInterface(t, ring.Config{Fallback: fb})
		})
	}
}

// testVanishedInterface: the TAP path needs the NIC too, so with any
// fallback a vanished interface stops the ring like without one.
func testVanishedInterface(t *testing.T, cfg ring.Config) {
	l := newLab(t, cfg)
	ep := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
	errc := make(chan error, 1)
	go func() {
		_, _, err := ep.Recv(make([]byte, 64), time.Time{})
		errc <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := l.p.B.NS.Command(ctx, "ip", "link", "del", l.p.B.Name).CombinedOutput(); err != nil {
		t.Fatalf("delete the veth: %v: %s", err, out)
	}
	select {
	case <-l.r.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("engine still running 5 s after its interface vanished")
	}
	if l.r.Err() == nil {
		t.Fatal("engine stopped without an error")
	}
	t.Logf("engine error: %v", l.r.Err())
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("blocked receive: %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("blocked receive not released")
	}
}
