package main

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func clientOut(t *testing.T, ctx context.Context, cfg clientConfig, tr Transport) (string, sockperfSummary) {
	t.Helper()
	var buf bytes.Buffer
	if err := runClient(ctx, cfg, tr, &printer{w: &buf}); err != nil {
		t.Fatalf("runClient: %v\n%s", err, buf.String())
	}
	return buf.String(), parseSockperf(t, buf.String())
}

func TestPingPongLoopback(t *testing.T) {
	t.Parallel()
	srv, st := startServer(t, nil)
	out, s := clientOut(t, context.Background(), clientConfig{
		Mode: modePingPong, Server: srv, MsgSize: 64, Duration: 700 * time.Millisecond,
	}, kernelTransport{})
	if !s.HasLatency || s.Observations == 0 || s.AvgKind != "latency" || s.SummaryKind != "Latency" {
		t.Fatalf("no latency summary:\n%s", out)
	}
	if s.Received == 0 || s.Received > s.Sent || s.Sent-s.Received > 1 {
		t.Errorf("sent %d received %d: ping-pong on loopback loses nothing but maybe the last", s.Sent, s.Received)
	}
	if got := st.Received.Load(); got != s.Sent {
		t.Errorf("server got %d requests, client sent %d", got, s.Sent)
	}
	if s.Min > s.Percentiles["50.000"] || s.Percentiles["50.000"] > s.Max {
		t.Errorf("min %v p50 %v max %v out of order", s.Min, s.Percentiles["50.000"], s.Max)
	}
	if len(shapes(out)) != len(shapes(readTestdata(t, "sockperf-3.7-ping-pong.txt"))) {
		t.Errorf("summary has %d lines, sockperf's %d:\n%s", len(shapes(out)), len(shapes(readTestdata(t, "sockperf-3.7-ping-pong.txt"))), out)
	}
}

func TestPingPongFullRTTPaced(t *testing.T) {
	t.Parallel()
	srv, _ := startServer(t, nil)
	out, s := clientOut(t, context.Background(), clientConfig{
		Mode: modePingPong, Server: srv, MsgSize: 1400, Duration: 600 * time.Millisecond, MPS: 2000, FullRTT: true,
	}, kernelTransport{})
	if s.AvgKind != "rtt" || s.SummaryKind != "Round trip" || s.Observations == 0 {
		t.Fatalf("no round-trip summary:\n%s", out)
	}
	// Paced at 2000/s for 0.6 s: at most 1200 messages.
	if s.Sent > 1200 {
		t.Errorf("sent %d messages at --mps 2000 in 0.6 s", s.Sent)
	}
}

func TestUnderLoadLoopback(t *testing.T) {
	t.Parallel()
	srv, st := startServer(t, nil)
	out, s := clientOut(t, context.Background(), clientConfig{
		Mode: modeUnderLoad, Server: srv, MsgSize: 100, Duration: 700 * time.Millisecond, MPS: 5000, ReplyEvery: 10,
	}, kernelTransport{})
	if !s.HasLatency || s.Observations == 0 {
		t.Fatalf("no latency summary:\n%s", out)
	}
	if s.Sent > 3500 || s.Received > s.Sent/10 {
		t.Errorf("sent %d (want <= 3500 at 5000/s for 0.7 s), received %d (want <= sent/10)", s.Sent, s.Received)
	}
	if rep := st.Replied.Load(); rep > st.Received.Load()/10+1 {
		t.Errorf("server replied %d of %d requests with reply-every 10", rep, st.Received.Load())
	}
}

func TestThroughputLoopback(t *testing.T) {
	t.Parallel()
	srv, st := startServer(t, nil)
	out, s := clientOut(t, context.Background(), clientConfig{
		Mode: modeThroughput, Server: srv, MsgSize: 1472, Duration: 300 * time.Millisecond,
	}, kernelTransport{})
	if !s.HasStream || s.StreamSent == 0 || s.MsgRate == 0 || s.MBps == 0 {
		t.Fatalf("no throughput summary:\n%s", out)
	}
	if strings.Contains(out, "NOTE:") {
		t.Errorf("sockperf prints no NOTE for --mps max with 1472-byte messages:\n%s", out)
	}
	if st.Replied.Load() != 0 {
		t.Errorf("throughput messages were answered")
	}
	if got := st.Received.Load(); got > s.StreamSent {
		t.Errorf("server received %d, more than the %d sent", got, s.StreamSent)
	}
}

// dropEvery wraps the server's socket so that it does not answer every
// n-th sequence number.
type dropEvery struct {
	Conn
	n uint64
}

func (d dropEvery) WriteToUDPAddrPort(b []byte, a netip.AddrPort) (int, error) {
	if h, err := parseHeader(b); err == nil && h.Seq%d.n == 0 {
		return len(b), nil
	}
	return d.Conn.WriteToUDPAddrPort(b, a)
}

// TestPingPongLostReplies: a lost reply costs the reply timeout, is counted
// as dropped, and the test goes on.
func TestPingPongLostReplies(t *testing.T) {
	t.Parallel()
	srv, _ := startServer(t, func(c Conn) Conn { return dropEvery{c, 50} })
	out, s := clientOut(t, context.Background(), clientConfig{
		Mode: modePingPong, Server: srv, MsgSize: 64, Duration: 800 * time.Millisecond,
		ReplyTimeout: 4 * time.Millisecond,
	}, kernelTransport{})
	if s.Dropped == 0 || s.Observations == 0 {
		t.Fatalf("want dropped messages and observations:\n%s", out)
	}
	if s.Sent-s.Received < uint64(s.Dropped) {
		t.Errorf("dropped %d > sent %d - received %d", s.Dropped, s.Sent, s.Received)
	}
}

// cancelAfter cancels a context after n sends.
// cancelAfter cancels the run at the first send after n sends once the
// statistics' warm-up (the first 400 ms) is over, so that the interrupted
// run always has measurements to print.
type cancelAfter struct {
	Conn
	n      int64
	sent   atomic.Int64
	start  time.Time
	once   sync.Once
	cancel context.CancelFunc
}

func (c *cancelAfter) WriteToUDPAddrPort(b []byte, a netip.AddrPort) (int, error) {
	c.once.Do(func() { c.start = time.Now() })
	if c.sent.Add(1) >= c.n && time.Since(c.start) > 600*time.Millisecond {
		c.cancel()
	}
	return c.Conn.WriteToUDPAddrPort(b, a)
}

type wrapTransport struct {
	Transport
	wrap func(Conn) Conn
}

func (w wrapTransport) ListenUDP(network string, laddr netip.AddrPort) (Conn, error) {
	c, err := w.Transport.ListenUDP(network, laddr)
	if err != nil {
		return nil, err
	}
	return w.wrap(c), nil
}

// TestClientInterrupted: cancelling (SIGINT) ends a long test early and still
// prints its statistics, like sockperf.
func TestClientInterrupted(t *testing.T) {
	t.Parallel()
	for _, m := range []mode{modePingPong, modeUnderLoad, modeThroughput} {
		t.Run(m.String(), func(t *testing.T) {
			srv, _ := startServer(t, nil)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			tr := wrapTransport{kernelTransport{}, func(c Conn) Conn { return &cancelAfter{Conn: c, n: 2000, cancel: cancel} }}
			out, s := clientOut(t, ctx, clientConfig{
				Mode: m, Server: srv, MsgSize: 64, Duration: time.Hour, MPS: 0, ReplyEvery: 10,
			}, tr)
			if !s.InterruptedUser {
				t.Errorf("want sockperf's interrupted-by-user line:\n%s", out)
			}
			if s.Sent == 0 && s.StreamSent == 0 {
				t.Errorf("no statistics after the interruption:\n%s", out)
			}
		})
	}
}

// pacingConn is a socket whose SO_MAX_PACING_RATE fails with err.
type pacingConn struct {
	Conn
	err  error
	rate uint32
}

func (p *pacingConn) SetMaxPacingRate(r uint32) error { p.rate = r; return p.err }

func TestRateLimit(t *testing.T) {
	t.Parallel()
	srv, _ := startServer(t, nil)
	cfg := clientConfig{Mode: modeThroughput, Server: srv, MsgSize: 64, Duration: 50 * time.Millisecond, RateLimit: 12500}

	var unsupported *pacingConn
	tr := wrapTransport{kernelTransport{}, func(c Conn) Conn {
		unsupported = &pacingConn{Conn: c, err: unix.EOPNOTSUPP}
		return unsupported
	}}
	var buf bytes.Buffer
	err := runClient(context.Background(), cfg, tr, &printer{w: &buf})
	if !errors.Is(err, errPacingUnsupported) || err.Error() != "this bypassd cannot pace (a version without packet pacing): upgrade bypassd or drop --rate-limit" {
		t.Fatalf("runClient with a daemon that cannot pace: %v", err)
	}
	if unsupported.rate != 12500 {
		t.Errorf("rate %d passed, want 12500", unsupported.rate)
	}

	// Kernel sockets accept SO_MAX_PACING_RATE (they pace only under fq).
	out, s := clientOut(t, context.Background(), cfg, kernelTransport{})
	if !strings.Contains(out, "sockperf: succeed to set sock-SO_MAX_PACING_RATE") || !s.HasStream {
		t.Errorf("kernel socket with --rate-limit:\n%s", out)
	}
}

func TestClientBadConfig(t *testing.T) {
	t.Parallel()
	srv := netip.MustParseAddrPort("127.0.0.1:9")
	for _, cfg := range []clientConfig{
		{Mode: modePingPong, Server: srv, MsgSize: 13, Duration: time.Second},
		{Mode: modePingPong, Server: srv, MsgSize: maxMessage + 1, Duration: time.Second},
		{Mode: modePingPong, Server: srv, MsgSize: 64},
		{Mode: modeServer, Server: srv, MsgSize: 64, Duration: time.Second},
	} {
		if err := runClient(context.Background(), cfg, kernelTransport{}, &printer{w: new(bytes.Buffer)}); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
}
