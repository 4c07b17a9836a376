package socket

import (
	"io"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/stats"
)

// TestTCPObservability: while a client holds a TCP connection that moved
// 256 KiB each way, the connections topic shows it (state, owner, bytes,
// segments, RTT, window) and the daemon's stats file counts the ring's
// TCP frames and opens.
func TestTCPObservability(t *testing.T) {
	netlab.RequirePriv(t)
	t.Parallel()
	l := newTCPLab(t)
	const n = 256 << 10
	kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	echoed := make(chan error, 1)
	go func() {
		c, err := kl.Accept()
		if err == nil {
			_, err = io.CopyN(c, c, n)
			// Hold the connection until the client closes it.
			_, _ = io.Copy(io.Discard, c)
			c.Close()
		}
		echoed <- err
	}()
	c, err := l.c.DialTCP("tcp4", netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	go func() { _, _ = c.Write(payload(n, 7)) }()
	if _, err := io.CopyN(io.Discard, c, n); err != nil {
		t.Fatalf("echo: %v", err)
	}

	a, err := ctlproto.DialAdmin(l.srv.SocketPath(), "test")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var doc ctldoc.ConnectionsDoc
	if err := a.Query(ctldoc.TopicConnections, &doc); err != nil {
		t.Fatal(err)
	}
	local, remote := c.LocalAddr().String(), c.RemoteAddr().String()
	var got *ctldoc.ConnectionDoc
	for i := range doc.Connections {
		if doc.Connections[i].Local == local && doc.Connections[i].Remote == remote {
			got = &doc.Connections[i]
		}
	}
	if got == nil {
		t.Fatalf("connections topic lacks %s -> %s: %+v", local, remote, doc.Connections)
	}
	if got.State != "ESTABLISHED" || got.PID != int32(os.Getpid()) || got.Socket == 0 || got.Interface != l.p.A.Name {
		t.Errorf("connection: %+v", got)
	}
	if got.BytesOut != n || got.BytesIn != n {
		t.Errorf("bytes out/in %d/%d, want %d each", got.BytesOut, got.BytesIn, n)
	}
	// Segments out are the stack's, up to 64 KiB each (TSO); segments in
	// arrive one frame each.
	if got.SegmentsOut < n/(64<<10) || got.SegmentsIn < n/1500 || got.Cwnd == 0 || got.RTTMicros <= 0 || got.RTOMillis <= 0 ||
		got.SendQueued < 0 || got.RecvQueued < 0 {
		t.Errorf("connection: %+v", got)
	}

	// The stats file: published every 100 ms.
	path := stats.DaemonPath(l.srv.Config.StatsDir, os.Getpid())
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := stats.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		r := s.Rings[0].Counters
		if r[stats.RingTCPActiveOpens] >= 1 && r[stats.RingTCPEstablished] >= 1 && r[stats.RingTCPRXBytes] > n &&
			r[stats.RingTCPTXBytes] > n && r[stats.RingTCPSegmentsSent] >= got.SegmentsOut {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ring TCP counters: opens %d, established %d, rx/tx bytes %d/%d, segments sent %d",
				r[stats.RingTCPActiveOpens], r[stats.RingTCPEstablished], r[stats.RingTCPRXBytes], r[stats.RingTCPTXBytes],
				r[stats.RingTCPSegmentsSent])
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = c.Close()
	if err := <-echoed; err != nil {
		t.Fatalf("kernel echo: %v", err)
	}
}
