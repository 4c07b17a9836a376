package daemon

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctlproto"
)

// TestVanishedInterfaceStopsDaemon: when the accelerated interface
// disappears, the daemon cannot serve its sockets any more; it says so,
// tells its clients (SHUTDOWN, then EOF) and Serve returns the ring's error,
// so that a supervisor restarts it, instead of leaving clients waiting.
func TestVanishedInterfaceStopsDaemon(t *testing.T) {
	t.Parallel()
	l := newLab(t, Config{})
	c := helloClient(t, l)
	s := openSocket(t, c, unix.AF_INET)
	if _, err := c.bind(s, netip.AddrPortFrom(l.p.A.Addr4(), 0), false); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := l.p.B.NS.Command(ctx, "ip", "link", "del", l.p.B.Name).CombinedOutput(); err != nil {
		t.Fatalf("delete the veth: %v: %s", err, out)
	}
	var serveErr error
	select {
	case serveErr = <-l.served:
		l.served <- nil // the lab's cleanup expects a result
	case <-time.After(10 * time.Second):
		t.Fatal("daemon still serving 10 s after its interface vanished")
	}
	if serveErr == nil || !strings.Contains(serveErr.Error(), "gone") {
		t.Fatalf("Serve returned %v, want the ring's error", serveErr)
	}
	// The client was told, then disconnected.
	_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	h, _, _, err := c.c.Recv()
	if err == nil && h.Code != ctlproto.CodeShutdown {
		t.Fatalf("client got %v, want SHUTDOWN", h.Code)
	}
	if err == nil {
		_, _, _, err = c.c.Recv()
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, unix.ECONNRESET) {
		t.Fatalf("after SHUTDOWN: %v, want the connection closed", err)
	}
}
