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

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/internal/ctlproto"
)

// TestVanishedInterfaceStopsDaemon: without a fallback, when the
// accelerated interface disappears, the daemon cannot serve its sockets any
// more; it says so, tells its clients (SHUTDOWN, then EOF) and Serve returns
// the ring's error, so that a supervisor restarts it, instead of leaving
// clients waiting.
func TestVanishedInterfaceStopsDaemon(t *testing.T) {
	t.Parallel()
	l := newLab(t, config.Config{Fallback: "none"})
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

// TestVanishedInterfaceDropsSockets: with a TAP fallback (auto or tap), a
// vanished interface drops the sockets homed on its ring, each with a
// SOCKET_ERROR (ENETDOWN) to its client, refuses new ones with ENETDOWN and
// keeps the daemon and the session going (the socket package's
// TestE2EInterfaceRecreated covers the interface coming back).
func TestVanishedInterfaceDropsSockets(t *testing.T) {
	for _, fb := range []string{"auto", "tap"} {
		t.Run(fb, func(t *testing.T) {
			t.Parallel()
			l := newLab(t, config.Config{Fallback: fb})
			c := helloClient(t, l)
			bound := openSocket(t, c, unix.AF_INET)
			if _, err := c.bind(bound, netip.AddrPortFrom(l.p.A.Addr4(), 0), false); err != nil {
				t.Fatal(err)
			}
			unbound := openSocket(t, c, unix.AF_INET)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if out, err := l.p.B.NS.Command(ctx, "ip", "link", "del", l.p.B.Name).CombinedOutput(); err != nil {
				t.Fatalf("delete the veth: %v: %s", err, out)
			}
			dropped := map[uint32]bool{}
			_ = c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
			for len(dropped) < 2 {
				h, m, _, err := c.c.Recv()
				if err != nil {
					t.Fatalf("waiting for SOCKET_ERROR (got %d): %v", len(dropped), err)
				}
				se, ok := m.(*ctlproto.SocketError)
				if h.Code != ctlproto.CodeSocketError || !ok || unix.Errno(se.Errno) != unix.ENETDOWN {
					t.Fatalf("got %v %+v, want SOCKET_ERROR ENETDOWN", h.Code, m)
				}
				dropped[h.Socket] = true
			}
			if !dropped[bound.id] || !dropped[unbound.id] {
				t.Fatalf("dropped %v, want sockets %d and %d", dropped, bound.id, unbound.id)
			}
			if _, err := c.open(unix.AF_INET, 0); !errors.Is(err, unix.ENETDOWN) {
				t.Errorf("OPEN while the interface is gone: %v, want ENETDOWN", err)
			}
			// The client closes the dropped sockets: the daemon frees
			// what it still held for them.
			for _, k := range []*clientSocket{bound, unbound} {
				if _, err := c.ok(ctlproto.CodeClose, k.id, ctlproto.Empty{}); err != nil {
					t.Errorf("CLOSE of dropped socket %d: %v", k.id, err)
				}
			}
			if n := l.d.openSockets(); n != 0 {
				t.Errorf("%d sockets still open after the client closed the dropped ones", n)
			}
			select {
			case err := <-l.served:
				l.served <- err
				t.Fatalf("Serve returned %v: the daemon should keep serving", err)
			default:
			}
		})
	}
}
