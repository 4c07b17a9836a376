package main

import (
	"bytes"
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// needSockperf skips a test when the sockperf binary (Debian package
// sockperf) is missing, or fails it under BYPASSD_REQUIRE_PRIV=1, where the
// lab is expected to be complete (`make deps` installs it).
func needSockperf(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("sockperf")
	if err != nil {
		msg := "sockperf not installed (apt-get install sockperf, or `make deps`)"
		if os.Getenv("BYPASSD_REQUIRE_PRIV") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return path
}

// freeLoopbackPort returns a UDP port on 127.0.0.1 that was free a moment
// ago, for a sockperf process to bind.
func freeLoopbackPort(t *testing.T) uint16 {
	t.Helper()
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(loopback))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Port()
}

// startCmd starts cmd and stops it (SIGKILL) when the test ends; output is
// collected into the returned buffer.
func startCmd(t *testing.T, cmd *exec.Cmd) *syncBuffer {
	t.Helper()
	out := new(syncBuffer)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", cmd.Args, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return out
}

// waitSockperfServer sends well-formed ping requests (never runts: they
// upset a real sockperf server) until one is answered.
func waitSockperfServer(t *testing.T, srv netip.AddrPort) {
	t.Helper()
	c := peer(t)
	buf := make([]byte, 100)
	limit := time.Now().Add(10 * time.Second)
	for seq := uint64(1); ; seq++ {
		if _, err := c.WriteToUDPAddrPort(rawMsg(seq, flagClient|flagPong, 14, 14), srv); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		n, _, err := c.ReadFromUDPAddrPort(buf)
		if err == nil {
			if h, err := parseHeader(buf[:n]); err == nil && h.Seq == seq && h.Flags == flagPong {
				return
			}
		}
		if time.Now().After(limit) {
			t.Fatalf("sockperf server on %v does not answer: %v", srv, err)
		}
	}
}

// TestInteropClientToSockperfServer: bypass-perf (kernel sockets) against a
// real `sockperf server` on 127.0.0.1, in every client mode; the server must
// still answer afterwards (nothing bypass-perf sent wedged it).
func TestInteropClientToSockperfServer(t *testing.T) {
	t.Parallel()
	bin := needSockperf(t)
	srv := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freeLoopbackPort(t))
	startCmd(t, exec.Command(bin, "server", "-i", srv.Addr().String(), "-p", strconv.Itoa(int(srv.Port()))))
	waitSockperfServer(t, srv)

	out, s := clientOut(t, context.Background(), clientConfig{
		Mode: modePingPong, Server: srv, MsgSize: 64, Duration: time.Second,
	}, kernelTransport{})
	if !s.HasLatency || s.Observations == 0 || s.Dropped != 0 || s.Sent-s.Received > 1 {
		t.Errorf("ping-pong against sockperf server:\n%s", out)
	}
	out, s = clientOut(t, context.Background(), clientConfig{
		Mode: modeUnderLoad, Server: srv, MsgSize: 200, Duration: time.Second, MPS: 5000, ReplyEvery: 10,
	}, kernelTransport{})
	if !s.HasLatency || s.Observations == 0 {
		t.Errorf("under-load against sockperf server:\n%s", out)
	}
	out, s = clientOut(t, context.Background(), clientConfig{
		Mode: modeThroughput, Server: srv, MsgSize: 1400, Duration: 200 * time.Millisecond,
	}, kernelTransport{})
	if !s.HasStream || s.StreamSent == 0 {
		t.Errorf("throughput against sockperf server:\n%s", out)
	}
	waitSockperfServer(t, srv)
}

// TestInteropSockperfClientToServer: the real `sockperf` client (ping-pong,
// under-load, throughput) against bypass-perf's server (kernel sockets) on
// 127.0.0.1, with sockperf's own summary parsed.
func TestInteropSockperfClientToServer(t *testing.T) {
	t.Parallel()
	bin := needSockperf(t)
	cases := []struct {
		name  string
		args  []string
		check func(t *testing.T, s sockperfSummary, st *serverStats, out string)
	}{
		{"ping-pong", []string{"ping-pong", "-m", "64", "-t", "1"}, func(t *testing.T, s sockperfSummary, st *serverStats, out string) {
			if !s.HasLatency || s.Observations == 0 || s.Dropped != 0 {
				t.Errorf("sockperf ping-pong against bypass-perf server:\n%s", out)
			}
			if st.Replied.Load() < s.Received {
				t.Errorf("sockperf received %d replies, the server sent %d", s.Received, st.Replied.Load())
			}
		}},
		{"under-load", []string{"under-load", "-m", "300", "-t", "1", "--mps", "5000", "--reply-every", "10"}, func(t *testing.T, s sockperfSummary, st *serverStats, out string) {
			if !s.HasLatency || s.Observations == 0 {
				t.Errorf("sockperf under-load against bypass-perf server:\n%s", out)
			}
			if st.Received.Load() < s.Sent/2 || st.Replied.Load() > st.Received.Load()/10+1 {
				t.Errorf("server received %d replied %d of sockperf's %d", st.Received.Load(), st.Replied.Load(), s.Sent)
			}
		}},
		{"throughput", []string{"throughput", "-m", "1400", "-t", "1", "--mps", "20000"}, func(t *testing.T, s sockperfSummary, st *serverStats, out string) {
			if !s.HasStream || s.StreamSent == 0 {
				t.Errorf("sockperf throughput against bypass-perf server:\n%s", out)
			}
			if st.Received.Load() == 0 || st.Received.Load() > s.StreamSent || st.Replied.Load() != 0 {
				t.Errorf("server received %d replied %d of sockperf's %d", st.Received.Load(), st.Replied.Load(), s.StreamSent)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, st := startServer(t, nil)
			args := append(tc.args, "-i", srv.Addr().String(), "-p", strconv.Itoa(int(srv.Port())))
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var out bytes.Buffer
			cmd := exec.CommandContext(ctx, bin, args...)
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				t.Fatalf("sockperf %v: %v\n%s", args, err, out.String())
			}
			tc.check(t, parseSockperf(t, out.String()), st, out.String())
			if st.Invalid.Load() != 0 {
				t.Errorf("the server found %d invalid datagrams from sockperf", st.Invalid.Load())
			}
		})
	}
}

// TestInteropBinary runs the command end to end (flags, exit status,
// stdout) against a real sockperf server.
func TestInteropBinary(t *testing.T) {
	t.Parallel()
	bin := needSockperf(t)
	srv := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), freeLoopbackPort(t))
	startCmd(t, exec.Command(bin, "server", "-i", srv.Addr().String(), "-p", strconv.Itoa(int(srv.Port()))))
	waitSockperfServer(t, srv)
	var out, errb bytes.Buffer
	cmd := command(t, "--kernel", "ping-pong", "-i", srv.Addr().String(), "-p", strconv.Itoa(int(srv.Port())), "-t", "0.6", "-m", "100")
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %v\n%s%s", cmd.Args, err, out.String(), errb.String())
	}
	if s := parseSockperf(t, out.String()); !s.HasLatency || s.Observations == 0 {
		t.Errorf("bypass-perf binary output:\n%s", out.String())
	}
}

// envRunMain makes the test binary behave as bypass-perf itself, so tests
// can run the command as a separate process without building it.
const envRunMain = "BYPASS_PERF_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(envRunMain) == "1" {
		os.Exit(cli(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// command returns a command running bypass-perf with args (the test binary
// in its bypass-perf role).
func command(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), envRunMain+"=1")
	return cmd
}
