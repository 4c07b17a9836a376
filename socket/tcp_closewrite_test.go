package socket

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
)

// TestTCPCloseWriteFullQueue: CloseWrite with the send queue full (a peer
// that does not read) waits for room up to the write deadline; when that
// has passed it fails with a timeout and the sending side stays open, so
// a later CloseWrite, once the peer reads, still ends the stream after
// every byte written (a failed first call used to leave the FIN unsent
// for good, and a peer waiting for EOF hung).
func TestTCPCloseWriteFullQueue(t *testing.T) {
	netlab.RequirePriv(t)
	t.Parallel()
	l := newTCPLab(t)
	kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	c, err := l.c.DialTCP("tcp4", netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = kl.SetDeadline(time.Now().Add(10 * time.Second))
	kc, err := kl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer kc.Close()
	// Fill everything: the peer's window, the stack's send buffer, the
	// send queue.
	var written int64
	b := make([]byte, 64<<10)
	for {
		_ = c.SetWriteDeadline(time.Now().Add(300 * time.Millisecond))
		n, err := c.Write(b)
		written += int64(n)
		if isTimeout(err) {
			break
		}
		if err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	_ = c.SetWriteDeadline(time.Now().Add(-time.Second))
	if err := c.CloseWrite(); !isTimeout(err) {
		t.Fatalf("CloseWrite with the queue full and the deadline passed: %v, want a timeout", err)
	}
	got := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(io.Discard, kc)
		got <- n
	}()
	_ = c.SetWriteDeadline(time.Time{})
	if err := c.CloseWrite(); err != nil {
		t.Fatalf("CloseWrite once the peer reads: %v", err)
	}
	if _, err := c.Write(b[:1]); !errors.Is(err, unix.EPIPE) {
		t.Errorf("write after CloseWrite: %v, want EPIPE", err)
	}
	select {
	case n := <-got:
		if n != written {
			t.Fatalf("the peer read %d bytes before EOF, want the %d written", n, written)
		}
		t.Logf("%d bytes, then EOF", n)
	case <-time.After(30 * time.Second):
		t.Fatal("the peer saw no EOF within 30 s of CloseWrite")
	}
}
