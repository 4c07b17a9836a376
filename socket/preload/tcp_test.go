package preload

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/daemon/daemontest"
	"github.com/bypassd/bypassd/internal/netlab"
)

// TCP through the library: unmodified programs in A under libbypassd.so
// (BYPASSD_REQUIRE=1) against kernel TCP peers in B. Every test checks that
// the ring's TCP stack carried at least the bytes the programs moved and
// that A's kernel opened no connection and sent no TCP segment (Tcp
// ActiveOpens, PassiveOpens, OutSegs of A's namespace): a library that
// fell back to kernel sockets fails.

func newTCPLab(t *testing.T) *lab {
	t.Helper()
	return newTCPLabConfig(t, nil)
}

// newTCPLabConfig is newTCPLab with the daemon's configuration changed by
// set (nil: unchanged).
func newTCPLabConfig(t *testing.T, set func(*config.Config)) *lab {
	t.Helper()
	lib, _ := built(t)
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	cfg := config.Config{RXPoll: 20 * time.Microsecond, EnginePoll: 20 * time.Microsecond,
		Frames: 4096, QueueBytes: 256 << 10, Fallback: "none"}
	if set != nil {
		set(&cfg)
	}
	srv := daemontest.Start(t, p, cfg, nil)
	return &lab{p: p, srv: srv, lib: lib}
}

type tcpCounters struct {
	ringRX, ringTX         uint64 // IP bytes through the rings' TCP stacks
	opens, outSegs         uint64 // A's kernel
	ringRXPkts, ringTXPkts uint64
}

func (l *lab) tcpCounters(t *testing.T) tcpCounters {
	t.Helper()
	var c tcpCounters
	for _, r := range l.srv.Rings() {
		st := r.Stats()
		c.ringRX += st.TCPRXBytes.Load()
		c.ringTX += st.TCPTXBytes.Load()
		c.ringRXPkts += st.TCPRXPackets.Load()
		c.ringTXPkts += st.TCPTXPackets.Load()
	}
	c.opens = l.p.A.NS.TCPStat(t, "ActiveOpens") + l.p.A.NS.TCPStat(t, "PassiveOpens")
	c.outSegs = l.p.A.NS.TCPStat(t, "OutSegs")
	return c
}

// checkTCPPath fails unless the rings' TCP stacks received at least rx and
// sent at least tx bytes since before and A's kernel did no TCP.
func (l *lab) checkTCPPath(t *testing.T, before tcpCounters, rx, tx uint64) {
	t.Helper()
	var after tcpCounters
	gotRX, gotTX := awaitRing(func() (uint64, uint64) {
		after = l.tcpCounters(t)
		return after.ringRX - before.ringRX, after.ringTX - before.ringTX
	}, rx, tx)
	if gotRX < rx {
		t.Errorf("the ring's TCP stack received %d bytes, want at least %d", gotRX, rx)
	}
	if gotTX < tx {
		t.Errorf("the ring's TCP stack sent %d bytes, want at least %d", gotTX, tx)
	}
	if after.opens != before.opens || after.outSegs != before.outSegs {
		t.Errorf("A's kernel did TCP: %d connections opened, %d segments sent (a fallback to the kernel)",
			after.opens-before.opens, after.outSegs-before.outSegs)
	}
	t.Logf("ring TCP: %d frames / %d bytes in, %d frames / %d bytes out", after.ringRXPkts-before.ringRXPkts,
		after.ringRX-before.ringRX, after.ringTXPkts-before.ringTXPkts, after.ringTX-before.ringTX)
}

// serveTCP accepts on a kernel listener in ns and runs handle for each
// connection in its own goroutine until the test ends.
func serveTCP(t *testing.T, ns *netlab.NS, addr netip.Addr, handle func(net.Conn)) netip.AddrPort {
	t.Helper()
	ln := ns.ListenTCP(t, netip.AddrPortFrom(addr, 0))
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

// waitOffloadedListener waits until a program under the library logged
// that its socket listens through bypassd. (Probing it would be wrong: a
// SYN that arrives before LISTEN reaches A's kernel, which resets it.)
func waitOffloadedListener(t *testing.T, log *output) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); !strings.Contains(log.String(), "listening on "); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the program did not listen through bypassd:\n%s", log)
		}
	}
}

// waitListening waits until a kernel TCP server in ns answers at addr,
// probing from ns.
func waitListening(t *testing.T, ns *netlab.NS, addr netip.AddrPort, log fmt.Stringer) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		c, err := ns.DialTCP(addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(end) {
			t.Fatalf("nothing listens on %v: %v\n%s", addr, err, log)
		}
	}
}

// TestTCPProgram runs c/tests/tcp.c (an ordinary C program, ASan and
// UBSan) under the library against kernel peers in B: connect blocking
// and not, ECONNREFUSED, transfers 1 B .. 16 MiB byte-exact, half-close,
// SO_LINGER 0 (the peer sees a reset), a reset by the peer, epoll and
// poll with EPOLLRDHUP/EPOLLHUP, accept4 flags, options, fork.
func TestTCPProgram(t *testing.T) {
	l := newTCPLab(t)
	prog := buildTCP(t)
	b := l.p.B.Addr4()
	echo := serveTCP(t, l.p.B.NS, b, func(c net.Conn) {
		defer c.Close()
		_, _ = io.Copy(c, c)
		_ = c.(*net.TCPConn).CloseWrite()
	})
	closed := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(b, 0))
	closedPort := closed.Addr().(*net.TCPAddr).Port
	closed.Close()
	sinkErr := make(chan error, 4)
	sink := serveTCP(t, l.p.B.NS, b, func(c net.Conn) {
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		_, err := io.Copy(io.Discard, c)
		sinkErr <- err
	})
	callback := serveTCP(t, l.p.B.NS, b, func(ctl net.Conn) {
		defer ctl.Close()
		_ = ctl.SetDeadline(time.Now().Add(30 * time.Second))
		line, err := bufio.NewReader(ctl).ReadString('\n')
		port, perr := strconv.Atoi(strings.TrimSpace(line))
		if err != nil || perr != nil {
			_, _ = ctl.Write([]byte("bad\n"))
			return
		}
		_, _ = ctl.Write([]byte(callbackVerdict(l.p.B.NS, netip.AddrPortFrom(l.p.A.Addr4(), uint16(port)))))
	})
	reset := serveTCP(t, l.p.B.NS, b, func(c net.Conn) {
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close()
	})
	max := 16 << 20
	if raceEnabled {
		max = 4 << 20 // the daemon runs under the race detector
	}
	before := l.tcpCounters(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	port := func(a netip.AddrPort) string { return strconv.Itoa(int(a.Port())) }
	out, err := l.preloaded(ctx, []string{"ASAN_OPTIONS=verify_asan_link_order=0"}, prog,
		l.p.A.Addr4().String(), b.String(), port(echo), strconv.Itoa(closedPort), port(sink), port(callback),
		port(reset), strconv.Itoa(max)).CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("tcp test program: %v", err)
	}
	m := regexp.MustCompile(`bytes (\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatal("the tcp test program did not finish")
	}
	select {
	case err := <-sinkErr:
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("the sink's read ended with %v, want ECONNRESET (SO_LINGER 0 resets)", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("the sink's connection did not end")
	}
	sent, _ := strconv.ParseUint(string(m[1]), 10, 64)
	// The echo peers return what the program sent (not the sink's bytes).
	l.checkTCPPath(t, before, sent-64, sent)
}

// callbackVerdict connects from ns to the program's listener at a, sends
// 1 MiB, half-closes and checks the echo: "ok\n" or "bad ...\n".
func callbackVerdict(ns *netlab.NS, a netip.AddrPort) string {
	c, err := ns.DialTCP(a, 10*time.Second)
	if err != nil {
		return fmt.Sprintf("bad dial: %v\n", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	data := payload(1<<20, 7)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(data)
		if err == nil {
			err = c.CloseWrite()
		}
		errc <- err
	}()
	back, err := io.ReadAll(c)
	if werr := <-errc; err == nil {
		err = werr
	}
	if err != nil || !bytes.Equal(back, data) {
		return fmt.Sprintf("bad echo: %d bytes, %v\n", len(back), err)
	}
	return "ok\n"
}

// payload returns n deterministic bytes.
func payload(n int, seed uint64) []byte {
	b := make([]byte, n)
	x := seed*0x9e3779b97f4a7c15 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	return b
}

// TestSockperfTCP: Debian's sockperf with --tcp under the library, as the
// client of a kernel `sockperf server --tcp` (ping-pong and throughput)
// and as the server of a kernel client.
func TestSockperfTCP(t *testing.T) {
	bin := needTool(t, "sockperf", "sockperf")
	l := newTCPLab(t)
	t.Run("client", func(t *testing.T) {
		srv := netip.AddrPortFrom(l.p.B.Addr4(), 11211)
		log := startIn(t, l.p.B.NS.Command(context.Background(), bin, "server", "--tcp", "-i", srv.Addr().String(), "-p", "11211"))
		waitListening(t, l.p.B.NS, srv, log)
		for _, mode := range [][]string{{"ping-pong", "-m", "64"}, {"throughput", "-m", "1400"}} {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			before := l.tcpCounters(t)
			args := append(mode, "--tcp", "-i", srv.Addr().String(), "-p", "11211", "-t", "1")
			out, err := l.preloaded(ctx, nil, bin, args...).CombinedOutput()
			cancel()
			if err != nil {
				t.Fatalf("sockperf %v: %v\n%s", args, err, out)
			}
			sent, received := sockperfCounts(t, string(out))
			if sent == 0 || (mode[0] == "ping-pong" && received+1 < sent) {
				t.Fatalf("sockperf %s sent %d, received %d:\n%s", mode[0], sent, received, out)
			}
			size, _ := strconv.ParseUint(mode[2], 10, 64)
			l.checkTCPPath(t, before, received*size, (sent-1)*size)
			t.Logf("%s: sent %d received %d\n%s", mode[0], sent, received, lastLines(string(out), 3))
		}
	})
	t.Run("server", func(t *testing.T) {
		srv := netip.AddrPortFrom(l.p.A.Addr4(), 11212)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		log := startIn(t, l.preloaded(ctx, nil, bin, "server", "--tcp", "-i", srv.Addr().String(), "-p", "11212"))
		waitOffloadedListener(t, log)
		before := l.tcpCounters(t)
		cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer ccancel()
		out, err := l.p.B.NS.Command(cctx, bin, "ping-pong", "--tcp", "-m", "64", "-t", "1", "-i", srv.Addr().String(), "-p", "11212").CombinedOutput()
		if err != nil {
			t.Fatalf("kernel sockperf client: %v\n%s\nserver:\n%s", err, out, log)
		}
		sent, received := sockperfCounts(t, string(out))
		if received == 0 || received+1 < sent {
			t.Fatalf("server answered %d of %d:\n%s\nserver:\n%s", received, sent, out, log)
		}
		l.checkTCPPath(t, before, received*64, received*64)
	})
}

// TestIperf3TCP: iperf3 (TCP, 2 s each way) under the library as client
// and as server, kernel iperf3 on the other side.
func TestIperf3TCP(t *testing.T) {
	bin := needTool(t, "iperf3", "iperf3")
	l := newTCPLab(t)
	a, b := l.p.A.Addr4().String(), l.p.B.Addr4().String()
	recvRe := regexp.MustCompile(`(?m)^\[.*sec\s+([\d.]+) (\w)Bytes\s+[\d.]+ \wbits/sec\s+receiver`)
	bytesOf := func(out []byte) uint64 {
		m := recvRe.FindSubmatch(out)
		if m == nil {
			t.Fatalf("no receiver line in iperf3's output:\n%s", out)
		}
		v, _ := strconv.ParseFloat(string(m[1]), 64)
		mult := map[string]float64{"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[string(m[2])]
		return uint64(v * mult)
	}
	for i, tc := range []struct {
		name      string
		serverInA bool
		reverse   bool
	}{{"client", false, false}, {"client-reverse", false, true}, {"server", true, false}, {"server-reverse", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			port := strconv.Itoa(5301 + i) // a port per run: the last run's connections may be in TIME_WAIT
			srvAddr := b
			if tc.serverInA {
				srvAddr = a
			}
			sctx, scancel := context.WithCancel(context.Background())
			defer scancel()
			sargs := []string{"-s", "-B", srvAddr, "-p", port}
			var log *output
			if tc.serverInA {
				log = startIn(t, l.preloaded(sctx, nil, bin, sargs...))
				waitOffloadedListener(t, log)
			} else {
				log = startIn(t, l.p.B.NS.Command(sctx, bin, sargs...))
				p, _ := strconv.Atoi(port)
				waitListening(t, l.p.B.NS, netip.AddrPortFrom(l.p.B.Addr4(), uint16(p)), log)
			}
			before := l.tcpCounters(t)
			ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
			defer cancel()
			cargs := []string{"-c", srvAddr, "-p", port, "-t", "2", "-f", "m"}
			if tc.reverse {
				cargs = append(cargs, "-R")
			}
			cmd := l.p.B.NS.Command(ctx, bin, cargs...)
			if !tc.serverInA {
				cmd = l.preloaded(ctx, nil, bin, cargs...)
			}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("iperf3 %v: %v\n%s\nserver:\n%s", cargs, err, out, log)
			}
			n := bytesOf(out)
			if n < 64<<10 {
				t.Fatalf("iperf3 moved %d bytes:\n%s", n, out)
			}
			// The library's side sends when it is the client without -R
			// or the server with -R.
			libSends := tc.serverInA == tc.reverse
			rx, tx := uint64(0), n
			if !libSends {
				rx, tx = n, 0
			}
			l.checkTCPPath(t, before, rx, tx)
			t.Logf("%s", lastLines(string(out), 4))
		})
	}
}

// TestHTTPTCP: Python's http.server under the library serves a kernel
// curl, and curl under the library fetches from a kernel http.server,
// over IPv4 and IPv6.
func TestHTTPTCP(t *testing.T) {
	py := needTool(t, "python3", "python3")
	curl := needTool(t, "curl", "curl")
	l := newTCPLab(t)
	dir := t.TempDir()
	body := payload(3<<20, 42)
	if err := os.WriteFile(filepath.Join(dir, "blob"), body, 0o644); err != nil {
		t.Fatal(err)
	}
	fetch := func(t *testing.T, ctx context.Context, preloaded bool, url string) {
		t.Helper()
		args := []string{"-sS", "--fail", "--max-time", "30", "-o", filepath.Join(t.TempDir(), "got"), "-w", "%{size_download}", url}
		cmd := l.p.B.NS.Command(ctx, curl, args...)
		if preloaded {
			cmd = l.preloaded(ctx, nil, curl, args...)
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("curl %s: %v\n%s", url, err, out)
		}
		got, err := os.ReadFile(args[5])
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("curl got %d bytes (%v), want the %d-byte file byte for byte\n%s", len(got), err, len(body), out)
		}
	}
	for i, tc := range []struct {
		name      string
		serverInA bool
		v6        bool
	}{{"server", true, false}, {"client", false, false}, {"server-v6", true, true}, {"client-v6", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			addr := l.p.B.Addr4()
			switch {
			case tc.serverInA && tc.v6:
				addr = l.p.A.Addr6()
			case tc.serverInA:
				addr = l.p.A.Addr4()
			case tc.v6:
				addr = l.p.B.Addr6()
			}
			srv := netip.AddrPortFrom(addr, uint16(8081+i))
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			args := []string{"-m", "http.server", "--bind", addr.String(), "--directory", dir, strconv.Itoa(int(srv.Port()))}
			if tc.serverInA {
				waitOffloadedListener(t, startIn(t, l.preloaded(ctx, nil, py, args...)))
			} else {
				waitListening(t, l.p.B.NS, srv, startIn(t, l.p.B.NS.Command(ctx, py, args...)))
			}
			before := l.tcpCounters(t)
			url := "http://" + srv.String() + "/blob"
			for i := 0; i < 2; i++ { // a second request: a new connection to the same listener
				fetch(t, ctx, !tc.serverInA, url)
			}
			if tc.serverInA {
				l.checkTCPPath(t, before, 0, uint64(2*len(body)))
			} else {
				l.checkTCPPath(t, before, uint64(2*len(body)), 0)
			}
		})
	}
}
