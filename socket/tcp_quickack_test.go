package socket

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/netlab"
)

// TestTCPQuickAckThreshold: with --tcp-quickack-threshold 1000 and
// TCP_QUICKACK on, a kernel peer's single segments of 200 bytes are
// acknowledged at once (no delayed ACK counted) and those of 1400 bytes
// the delayed way: one delayed ACK each, seen by the peer (its TCP_INFO)
// no sooner than the 40 ms delayed-ACK timeout, and sent by the timeout,
// not drawn out by a retransmission. With TCP_QUICKACK off the threshold
// does not apply.
func TestTCPQuickAckThreshold(t *testing.T) {
	netlab.RequirePriv(t)
	t.Parallel()
	cfg := daemonConfigForTCP()
	cfg.TCPQuickAckThreshold = 1000
	l := newTCPLabConfig(t, cfg)
	delayed := func() uint64 { return l.srv.Rings()[0].Stats().TCPDelayedAcks.Load() }
	for _, quick := range []bool{true, false} {
		kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
		c, err := l.c.DialTCP("tcp4", netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort())
		if err != nil {
			t.Fatal(err)
		}
		if err := c.SetOption("TCP_QUICKACK", boolToInt(quick)); err != nil {
			t.Fatal(err)
		}
		_ = kl.SetDeadline(time.Now().Add(10 * time.Second))
		kc, err := kl.AcceptTCP()
		if err != nil {
			t.Fatal(err)
		}
		// One segment at a time: the peer waits for its ACK before the
		// client reads it (so no window update can stand in for the
		// ACK) and sends the next.
		send := func(size, n int) (uint64, []time.Duration) {
			t.Helper()
			d0 := delayed()
			buf := make([]byte, size)
			var delays []time.Duration
			for range n {
				d, retrans, err := netlab.WriteAwaitAck(kc, buf, 10*time.Second)
				if err != nil {
					t.Fatalf("TCP_QUICKACK %v, %d-byte segment: %v", quick, size, err)
				}
				if retrans > 0 {
					d = -d // marked: a retransmission may have drawn the ACK out
				}
				delays = append(delays, d)
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := io.ReadFull(c, buf); err != nil {
					t.Fatal(err)
				}
			}
			return delayed() - d0, delays
		}
		small, smallDelays := send(200, 5)
		large, largeDelays := send(1400, 5)
		t.Logf("TCP_QUICKACK %v: delayed ACKs: %d for 5 small segments, %d for 5 large; ACKs seen after %v (small), %v (large)",
			quick, small, large, smallDelays, largeDelays)
		if small != 0 {
			t.Errorf("TCP_QUICKACK %v: %d ACKs of 200-byte segments delayed, want 0", quick, small)
		}
		if !quick && large != 0 {
			t.Errorf("TCP_QUICKACK off: %d ACKs delayed, want 0 (the threshold applies with TCP_QUICKACK only)", large)
		}
		// Immediate ACKs: on a loaded machine one may be late, five in a
		// row are not.
		checkSome := func(what string, ds []time.Duration, ok func(time.Duration) bool) {
			t.Helper()
			for _, d := range ds {
				if d >= 0 && ok(d) {
					return
				}
			}
			t.Errorf("TCP_QUICKACK %v: no ACK of the %s came in time: %v", quick, what, ds)
		}
		checkSome("small segments", smallDelays, func(d time.Duration) bool { return d < delackMin })
		if !quick {
			checkSome("large segments", largeDelays, func(d time.Duration) bool { return d < delackMin })
		} else {
			if large != 5 {
				t.Errorf("TCP_QUICKACK on: %d ACKs of 1400-byte segments delayed, want one each (5)", large)
			}
			// The engine holds each ACK for 40 ms after the segment came,
			// so no load makes one arrive sooner.
			for i, d := range largeDelays {
				if d >= 0 && d < delackMin {
					t.Errorf("TCP_QUICKACK on: the ACK of large segment %d came after %v, before the delayed-ACK timeout", i, d)
				}
			}
			// And it leaves at the timeout, not at the peer's
			// retransmission (200 ms or more).
			checkSome("large segments (held ACKs never sent at their timeout)", largeDelays,
				func(d time.Duration) bool { return d < 150*time.Millisecond })
		}
		_ = kc.Close()
		_ = c.Close()
		_ = kl.Close()
	}
}

// delackMin is the engine's delayed-ACK timeout (ring.delackTimeout).
const delackMin = 40 * time.Millisecond
