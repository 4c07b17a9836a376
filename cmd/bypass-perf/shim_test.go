package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/daemon/daemontest"
	"github.com/bypassd/bypassd/internal/netlab"
)

// shimLab is a veth pair with bypassd serving A's end in-process; B is an
// ordinary kernel namespace where the real sockperf runs.
type shimLab struct {
	p          *netlab.Pair
	socketPath string
}

func newShimLab(t *testing.T) *shimLab {
	t.Helper()
	// Static neighbour entries: a benchmark lab needs no ARP, and the
	// ring's next-hop resolution is not what these tests are about.
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	srv := daemontest.Start(t, p, config.Config{
		QueueBytes: 256 << 10,
		// Clients spin a little before sleeping, as a latency set-up would.
		RXPoll: 50 * time.Microsecond,
		// The engine too spins a little, then sleeps.
		EnginePoll: 50 * time.Microsecond,
	}, nil)
	return &shimLab{p: p, socketPath: srv.SocketPath()}
}

// shim opens a session with the lab's daemon, closed when the test ends.
func (l *shimLab) shim(t *testing.T) *shimTransport {
	t.Helper()
	tr, err := openShim(l.socketPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr
}

// sockperfServerInB starts a real sockperf server on B's address and waits
// until it answers (probing from inside B, over B's loopback).
func (l *shimLab) sockperfServerInB(t *testing.T, bin string) netip.AddrPort {
	t.Helper()
	var probe *net.UDPConn
	if err := l.p.B.NS.Do(func() error {
		var err error
		probe, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(l.p.B.Addr4(), 0)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	// A port free in B a moment ago.
	srv := probe.LocalAddr().(*net.UDPAddr).AddrPort()
	probe.Close()
	startCmd(t, l.p.B.NS.Command(nil, bin, "server", "-i", srv.Addr().String(), "-p", strconv.Itoa(int(srv.Port()))))
	if err := l.p.B.NS.Do(func() error {
		var err error
		probe, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(l.p.B.Addr4(), 0)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	buf := make([]byte, 100)
	limit := time.Now().Add(10 * time.Second)
	for seq := uint64(1); ; seq++ {
		if _, err := probe.WriteToUDPAddrPort(rawMsg(seq, flagClient|flagPong, 14, 14), srv); err != nil {
			t.Fatal(err)
		}
		_ = probe.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		if n, _, err := probe.ReadFromUDPAddrPort(buf); err == nil {
			if h, err := parseHeader(buf[:n]); err == nil && h.Seq == seq {
				return srv
			}
		}
		if time.Now().After(limit) {
			t.Fatalf("sockperf server on %v in %s does not answer", srv, l.p.B.NS.Name)
		}
	}
}

// TestShimClientToSockperfServer: bypass-perf through bypassd (namespace A)
// against a real `sockperf server` in namespace B, in every client mode.
func TestShimClientToSockperfServer(t *testing.T) {
	t.Parallel()
	bin := needSockperf(t)
	l := newShimLab(t)
	srv := l.sockperfServerInB(t, bin)
	tr := l.shim(t)

	out, s := clientOut(t, context.Background(), clientConfig{
		Mode: modePingPong, Server: srv, MsgSize: 64, Duration: time.Second,
	}, tr)
	if !s.HasLatency || s.Observations == 0 || s.Dropped != 0 {
		t.Errorf("ping-pong through the shim against sockperf server:\n%s", out)
	}
	out, s = clientOut(t, context.Background(), clientConfig{
		Mode: modeUnderLoad, Server: srv, MsgSize: 1400, Duration: time.Second, MPS: 5000, ReplyEvery: 10,
	}, tr)
	if !s.HasLatency || s.Observations == 0 {
		t.Errorf("under-load through the shim against sockperf server:\n%s", out)
	}
	out, s = clientOut(t, context.Background(), clientConfig{
		Mode: modeThroughput, Server: srv, MsgSize: 1400, Duration: 200 * time.Millisecond, Batch: 16,
	}, tr)
	if !s.HasStream || s.StreamSent == 0 {
		t.Errorf("throughput through the shim against sockperf server:\n%s", out)
	}

	// --rate-limit paces the socket (1 MiB/s = 8388 kbit/s), and a rate
	// outside the range is refused with the range in the message.
	var buf bytes.Buffer
	err := runClient(context.Background(), clientConfig{
		Mode: modeThroughput, Server: srv, MsgSize: 64, Duration: 50 * time.Millisecond, RateLimit: 1 << 20,
	}, tr, &printer{w: &buf})
	if err != nil || !strings.Contains(buf.String(), "succeed to set sock-SO_MAX_PACING_RATE") {
		t.Errorf("--rate-limit through the shim: %v\n%s", err, buf.String())
	}
	err = runClient(context.Background(), clientConfig{
		Mode: modeThroughput, Server: srv, MsgSize: 64, Duration: 50 * time.Millisecond, RateLimit: 100,
	}, tr, &printer{w: &buf})
	if !errors.Is(err, unix.ERANGE) || !strings.Contains(err.Error(), "from 1000 to 100000000 kbit/s") {
		t.Errorf("--rate-limit 100 through the shim: %v, want ERANGE naming the range", err)
	}
}

// TestShimSockperfClientToServer: the real sockperf client in namespace B
// against bypass-perf's server through bypassd in namespace A.
func TestShimSockperfClientToServer(t *testing.T) {
	t.Parallel()
	bin := needSockperf(t)
	l := newShimLab(t)
	tr := l.shim(t)
	conn, err := tr.ListenUDP("udp4", netip.AddrPortFrom(l.p.A.Addr4(), 0))
	if err != nil {
		t.Fatal(err)
	}
	srv := conn.(*shimConn).LocalAddr().(*net.UDPAddr).AddrPort()
	st := new(serverStats)
	done := make(chan error, 1)
	go func() { done <- serve(conn, st, nil) }()
	t.Cleanup(func() {
		conn.Close()
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Errorf("serve: %v", err)
		}
	})

	for _, tc := range []struct {
		args  []string
		check func(s sockperfSummary) bool
	}{
		{[]string{"ping-pong", "-m", "64", "-t", "1"}, func(s sockperfSummary) bool {
			return s.HasLatency && s.Observations > 0 && s.Dropped == 0
		}},
		{[]string{"under-load", "-m", "1400", "-t", "1", "--mps", "5000", "--reply-every", "10"}, func(s sockperfSummary) bool {
			return s.HasLatency && s.Observations > 0
		}},
	} {
		args := append(tc.args, "-i", srv.Addr().String(), "-p", strconv.Itoa(int(srv.Port())))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		var out bytes.Buffer
		cmd := l.p.B.NS.Command(ctx, bin, args...)
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		cancel()
		if err != nil {
			t.Fatalf("sockperf %v in %s: %v\n%s", args, l.p.B.NS.Name, err, out.String())
		}
		if s := parseSockperf(t, out.String()); !tc.check(s) {
			t.Errorf("sockperf %s against bypass-perf's server through the shim:\n%s", tc.args[0], out.String())
		}
	}
	if st.Invalid.Load() != 0 || st.ReplyErrors.Load() != 0 {
		t.Errorf("server: %d invalid datagrams, %d reply errors", st.Invalid.Load(), st.ReplyErrors.Load())
	}
}

// TestShimBinary runs the command with its default transport (the
// shim) against sockperf in B.
func TestShimBinary(t *testing.T) {
	t.Parallel()
	bin := needSockperf(t)
	l := newShimLab(t)
	srv := l.sockperfServerInB(t, bin)
	var out, errb bytes.Buffer
	cmd := command(t, "--daemon-socket", l.socketPath, "ping-pong", "-i", srv.Addr().String(), "-p", strconv.Itoa(int(srv.Port())), "-t", "0.6", "-m", "200")
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %v\n%s%s", cmd.Args, err, out.String(), errb.String())
	}
	if s := parseSockperf(t, out.String()); !s.HasLatency || s.Observations == 0 || !bytes.Contains(out.Bytes(), []byte("bypassd shim")) {
		t.Errorf("bypass-perf through the shim:\n%s", out.String())
	}
}
