package socket

import (
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/netlab"
)

// TestTCPConnectCloseCycles: a client that connects to one kernel server,
// sends a byte and closes, 2,000 times in a row (500 under the race
// detector), succeeds every time, as with the kernel: each connection
// leaves its port in TIME-WAIT at the daemon, and the next connect gets
// another (the kernel reservation is held through TIME-WAIT, so the
// kernel's ephemeral choice skips it). The ring's stack opened them all;
// the kernel on the client's side opened none.
func TestTCPConnectCloseCycles(t *testing.T) {
	netlab.RequirePriv(t)
	t.Parallel()
	l := newTCPLab(t)
	kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	go func() {
		for {
			c, err := kl.Accept()
			if err != nil {
				return
			}
			go func() {
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				_, _ = io.Copy(io.Discard, c)
				_ = c.Close()
			}()
		}
	}()
	dst := kl.Addr().(*net.TCPAddr).AddrPort()
	cycles := 2000
	if raceEnabled {
		cycles = 500
	}
	before, st0 := l.kernelOpens(t), l.tcpStats()
	ports := make(map[uint16]int, cycles)
	start := time.Now()
	for i := range cycles {
		c, err := l.c.DialTCP("tcp4", netip.AddrPort{}, dst)
		if err != nil {
			t.Fatalf("cycle %d of %d: %v", i, cycles, err)
		}
		p := c.LocalAddr().(*net.TCPAddr).AddrPort().Port()
		if j, dup := ports[p]; dup {
			t.Errorf("cycle %d got port %d of cycle %d (in TIME-WAIT)", i, p, j)
		}
		ports[p] = i
		if _, err := c.Write([]byte{byte(i)}); err != nil {
			t.Fatalf("cycle %d: write: %v", i, err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("cycle %d: close: %v", i, err)
		}
	}
	t.Logf("%d connect/write/close cycles in %v", cycles, time.Since(start).Round(time.Millisecond))
	if d := l.tcpStats().ActiveOpens - st0.ActiveOpens; d != uint64(cycles) {
		t.Errorf("the ring's stack opened %d connections, want %d", d, cycles)
	}
	if n := l.kernelOpens(t) - before; n != 0 {
		t.Errorf("the kernel of the daemon's namespace opened %d TCP connections", n)
	}
}
