package socket

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon/daemontest"
	"github.com/bypassd/bypassd/internal/netlab"
)

// TestTCPDaemonShutdown: a daemon that stops with connections open ends
// them towards their kernel peers (a peer's read ends at once instead of
// hanging until a keepalive would notice) and towards its clients (a
// blocked read returns an error), after the bytes the client had written
// reached the peer.
func TestTCPDaemonShutdown(t *testing.T) {
	netlab.RequirePriv(t)
	t.Parallel()
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	srv := daemontest.Start(t, p, daemonConfigForTCP(), nil)
	c, err := Dial(srv.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	kl := p.B.NS.ListenTCP(t, netip.AddrPortFrom(p.B.Addr4(), 0))
	const conns = 4
	peers := make([]net.Conn, conns)
	clients := make([]*TCPConn, conns)
	out := payload(100_000, 7)
	for i := range clients {
		if clients[i], err = c.DialTCP("tcp4", netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort()); err != nil {
			t.Fatal(err)
		}
		_ = kl.SetDeadline(time.Now().Add(20 * time.Second))
		if peers[i], err = kl.Accept(); err != nil {
			t.Fatal(err)
		}
		defer peers[i].Close()
		if _, err := clients[i].Write(out); err != nil {
			t.Fatal(err)
		}
	}
	// Each peer reads what its client wrote before the daemon stops.
	for i, pc := range peers {
		_ = pc.SetDeadline(time.Now().Add(20 * time.Second))
		if _, err := io.ReadFull(pc, make([]byte, len(out))); err != nil {
			t.Fatalf("peer %d: read the client's bytes: %v", i, err)
		}
	}
	readErr := make(chan error, conns)
	for _, cc := range clients {
		go func() {
			_ = cc.SetReadDeadline(time.Now().Add(30 * time.Second))
			_, err := cc.Read(make([]byte, 1))
			readErr <- err
		}()
	}
	start := time.Now()
	if err := srv.Close(); err != nil {
		t.Fatalf("daemon close: %v", err)
	}
	for i, pc := range peers {
		_ = pc.SetDeadline(time.Now().Add(10 * time.Second))
		n, err := pc.Read(make([]byte, 1))
		if i == 0 {
			t.Logf("peer 0 read: %v", err)
		}
		if n != 0 || !(errors.Is(err, io.EOF) || errors.Is(err, unix.ECONNRESET)) {
			t.Errorf("peer %d after the daemon stopped: read %d, %v; want EOF or ECONNRESET", i, n, err)
		}
	}
	for range clients {
		if err := <-readErr; err == nil || errors.Is(err, unix.ETIMEDOUT) || isTimeout(err) {
			t.Errorf("a client's blocked read after the daemon stopped: %v, want the connection's end", err)
		}
	}
	t.Logf("connections ended %v after the daemon began to stop", time.Since(start))
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
