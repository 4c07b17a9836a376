package socket

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon/daemontest"
	"github.com/bypassd/bypassd/internal/netlab"
)

// TestTCPClientLimits: a client at its socket budget (--max-sockets)
// gets EMFILE with what to do, from a dial and from an accept, as from a
// kernel at its descriptor limit; a connection it could not accept yet
// waits in the listener's queue (its peer is not reset) and is accepted
// once the client closed another.
func TestTCPClientLimits(t *testing.T) {
	netlab.RequirePriv(t)
	t.Parallel()
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	cfg := daemonConfigForTCP()
	cfg.MaxSockets = 3
	srv := daemontest.Start(t, p, cfg, nil)
	c, err := Dial(srv.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ln, err := c.ListenTCP("tcp4", netip.AddrPortFrom(p.A.Addr4(), 0))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	laddr := ln.Addr().(*net.TCPAddr).AddrPort()
	const peers = 3
	replies := make(chan error, peers)
	for i := 0; i < peers; i++ {
		go func() {
			kc, err := p.B.NS.DialTCP(laddr, 10*time.Second)
			if err == nil {
				err = netlab.HashPeer(kc, []byte("ok"), 60*time.Second)
			}
			replies <- err
		}()
	}
	_ = ln.SetDeadline(time.Now().Add(20 * time.Second))
	var accepted []*TCPConn
	for i := 0; i < 2; i++ {
		ac, err := ln.AcceptTCP()
		if err != nil {
			t.Fatalf("accept %d within the budget: %v", i, err)
		}
		accepted = append(accepted, ac)
	}
	// Listener and two connections: the budget of 3 is spent.
	for _, op := range []struct {
		name string
		do   func() error
	}{
		{"accept", func() error { _, err := ln.AcceptTCP(); return err }},
		{"dial", func() error {
			_, err := c.DialTCP("tcp4", netip.AddrPort{}, netip.AddrPortFrom(p.B.Addr4(), 9))
			return err
		}},
	} {
		err := op.do()
		if !errors.Is(err, unix.EMFILE) || !strings.Contains(err.Error(), "--max-sockets") {
			t.Errorf("%s over the budget: %v; want EMFILE saying what to raise", op.name, err)
		}
	}
	for _, ac := range accepted {
		streamExchange(t, ac, []byte("first"), []byte("ok"))
		_ = ac.Close()
	}
	// The third peer waited in the queue, unharmed.
	ac, err := ln.AcceptTCP()
	if err != nil {
		t.Fatalf("accept after closing two: %v", err)
	}
	streamExchange(t, ac, []byte("late"), []byte("ok"))
	_ = ac.Close()
	for i := 0; i < peers; i++ {
		if err := <-replies; err != nil {
			t.Errorf("kernel peer: %v", err)
		}
	}
}
