package preload

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/daemon/daemontest"
	"github.com/bypassd/bypassd/internal/netlab"
)

// Lab tests: a real bypassd serves the A end of a veth pair; unmodified
// programs run in A under libbypassd.so with BYPASSD_REQUIRE=1, their peers
// are kernel sockets in B. Every test checks that the traffic went through
// the daemon's ring (its counters rose by at least what the program sent)
// and not through A's kernel (the Udp counters of A's namespace did not
// move): a library that fell back to the kernel fails.

type lab struct {
	p   *netlab.Pair
	srv *daemontest.Server
	lib string
}

func newLab(t *testing.T) *lab {
	t.Helper()
	lib, _ := built(t)
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	srv := daemontest.Start(t, p, config.Config{
		Frames: 4096,
		// Big enough for 65000-byte datagrams (a queue holds up to half
		// its size).
		QueueBytes: 256 << 10,
	}, nil)
	return &lab{p: p, srv: srv, lib: lib}
}

// preloaded returns cmd (to run in A) with the library and the lab's
// daemon in its environment.
func (l *lab) preloaded(ctx context.Context, env []string, name string, args ...string) *exec.Cmd {
	cmd := l.p.A.NS.Command(ctx, name, args...)
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+l.lib, "BYPASSD_SOCKET="+l.srv.SocketPath(),
		"BYPASSD_REQUIRE=1", "BYPASSD_LOG_LEVEL=info")
	cmd.Env = append(cmd.Env, env...)
	cmd.Cancel = func() error {
		dumpThreads(cmd.Process.Pid)
		return cmd.Process.Kill()
	}
	return cmd
}

// dumpThreads prints where a preloaded program that overran its time is
// stuck (each thread's stack, from gdb when it is installed), so that a
// hang seen once in CI can be understood from its log.
func dumpThreads(pid int) {
	fmt.Fprintf(os.Stderr, "preloaded program %d overran its time; its threads:\n", pid)
	if gdb, err := exec.LookPath("gdb"); err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, gdb, "-batch", "-p", strconv.Itoa(pid), "-ex", "thread apply all bt").CombinedOutput()
		fmt.Fprintf(os.Stderr, "%s (gdb: %v)\n", out, err)
		return
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*", pid))
	for _, task := range tasks {
		comm, _ := os.ReadFile(task + "/comm")
		wchan, _ := os.ReadFile(task + "/wchan")
		sys, _ := os.ReadFile(task + "/syscall")
		fmt.Fprintf(os.Stderr, "%s %s wchan=%s syscall=%s\n", filepath.Base(task), strings.TrimSpace(string(comm)), wchan, strings.TrimSpace(string(sys)))
	}
}

// counters are what proves the path: the ring's packet counters and the
// kernel's UDP datagram counters in A.
type counters struct {
	ringRX, ringTX      uint64
	kernelIn, kernelOut uint64
}

func (l *lab) counters(t *testing.T) counters {
	t.Helper()
	var c counters
	for _, r := range l.srv.Rings() {
		st := r.Stats()
		c.ringRX += st.RXPackets.Load()
		c.ringTX += st.TXPackets.Load()
	}
	err := l.p.A.NS.Do(func() error {
		for _, f := range []string{"/proc/thread-self/net/snmp", "/proc/thread-self/net/snmp6"} {
			b, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			in, out, err := udpCounters(string(b))
			if err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
			c.kernelIn += in
			c.kernelOut += out
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// udpCounters reads InDatagrams and OutDatagrams from /proc/net/snmp (a
// "Udp:" header line and a value line) or /proc/net/snmp6 ("Udp6InDatagrams
// N" lines).
func udpCounters(text string) (in, out uint64, err error) {
	lines := strings.Split(text, "\n")
	vals := map[string]string{}
	for i, line := range lines {
		f := strings.Fields(line)
		switch {
		case len(f) == 2 && strings.HasPrefix(f[0], "Udp6"):
			vals[strings.TrimPrefix(f[0], "Udp6")] = f[1]
		case len(f) > 1 && f[0] == "Udp:" && i+1 < len(lines) && f[1] == "InDatagrams":
			v := strings.Fields(lines[i+1])
			for j := 1; j < len(f) && j < len(v); j++ {
				vals[f[j]] = v[j]
			}
		}
	}
	if in, err = strconv.ParseUint(vals["InDatagrams"], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("no Udp InDatagrams: %w", err)
	}
	if out, err = strconv.ParseUint(vals["OutDatagrams"], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("no Udp OutDatagrams: %w", err)
	}
	return in, out, nil
}

// checkPath fails unless the ring carried at least rx/tx packets since
// before and A's kernel carried no UDP datagram. The ring may still be
// sending what the program queued last (the in-process daemon runs under
// the race detector in `make test`), so it waits up to 10 s for that.
func (l *lab) checkPath(t *testing.T, before counters, rx, tx uint64) {
	t.Helper()
	var after counters
	gotRX, gotTX := awaitRing(func() (uint64, uint64) {
		after = l.counters(t)
		return after.ringRX - before.ringRX, after.ringTX - before.ringTX
	}, rx, tx)
	if gotRX < rx {
		t.Errorf("ring received %d packets, want at least %d", gotRX, rx)
	}
	if gotTX < tx {
		t.Errorf("ring sent %d packets, want at least %d", gotTX, tx)
	}
	if after.kernelIn != before.kernelIn || after.kernelOut != before.kernelOut {
		t.Errorf("A's kernel carried UDP: in %d out %d datagrams (a fallback to the kernel)",
			after.kernelIn-before.kernelIn, after.kernelOut-before.kernelOut)
	}
}

// awaitRing reads the ring's counters since the start of a check until
// they reached rx and tx (the ring may still be sending what a program
// queued last; the in-process daemon runs under the race detector in
// `make test`), for 10 s at most, and returns the last reading.
func awaitRing(read func() (rx, tx uint64), rx, tx uint64) (gotRX, gotTX uint64) {
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		gotRX, gotTX = read()
		if gotRX >= rx && gotTX >= tx || time.Now().After(end) {
			return gotRX, gotTX
		}
	}
}

// sockperfProbe sends a well-formed sockperf ping (never a runt, which can
// wedge a real sockperf server) from a kernel socket in ns until srv
// answers.
func sockperfProbe(t *testing.T, ns *netlab.NS, srv netip.AddrPort) {
	t.Helper()
	c := ns.ListenUDP(t, netip.AddrPortFrom(netip.IPv4Unspecified(), 0))
	msg := make([]byte, 14)
	buf := make([]byte, 64)
	limit := time.Now().Add(15 * time.Second)
	for seq := uint64(1); ; seq++ {
		binary.BigEndian.PutUint64(msg, seq)
		binary.BigEndian.PutUint16(msg[8:], 0x3) // CLIENT | PONG
		binary.BigEndian.PutUint32(msg[10:], 14)
		if _, err := c.WriteToUDPAddrPort(msg, srv); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		n, _, err := c.ReadFromUDPAddrPort(buf)
		if err == nil && n == 14 && binary.BigEndian.Uint64(buf) == seq {
			return
		}
		if time.Now().After(limit) {
			t.Fatalf("sockperf server on %v does not answer: %v", srv, err)
		}
	}
}

// output collects a running command's output; safe to read meanwhile.
type output struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}

// startIn starts cmd and kills it when the test ends.
func startIn(t *testing.T, cmd *exec.Cmd) *output {
	t.Helper()
	out := new(output)
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

var (
	sentRe   = regexp.MustCompile(`SentMessages=(\d+); ReceivedMessages=(\d+)`)
	streamRe = regexp.MustCompile(`Total of (\d+) messages sent`)
)

// sockperfCounts reads sockperf's "SentMessages=N; ReceivedMessages=M"
// (latency modes) or "Total of N messages sent" (throughput).
func sockperfCounts(t *testing.T, out string) (sent, received uint64) {
	t.Helper()
	if m := sentRe.FindStringSubmatch(out); m != nil {
		sent, _ = strconv.ParseUint(m[1], 10, 64)
		received, _ = strconv.ParseUint(m[2], 10, 64)
		return sent, received
	}
	if m := streamRe.FindStringSubmatch(out); m != nil {
		sent, _ = strconv.ParseUint(m[1], 10, 64)
		return sent, 0
	}
	t.Fatalf("no message counts in sockperf's output:\n%s", out)
	return 0, 0
}

// TestSockperfClient: Debian's sockperf client, unmodified, under the
// library in A against a kernel `sockperf server` in B, in ping-pong,
// under-load and throughput modes (64 B, 14 B and 65000 B: fragmented).
func TestSockperfClient(t *testing.T) {
	bin := needTool(t, "sockperf", "sockperf")
	l := newLab(t)
	port := 11111
	srv := netip.AddrPortFrom(l.p.B.Addr4(), uint16(port))
	startIn(t, l.p.B.NS.Command(context.Background(), bin, "server", "-i", srv.Addr().String(), "-p", strconv.Itoa(port)))
	sockperfProbe(t, l.p.B.NS, srv)
	for _, tc := range []struct {
		name string
		args []string
		// frames per datagram the ring counts (it counts datagrams,
		// however many fragments carry them)
		frames uint64
		pong   bool
	}{
		{"ping-pong", []string{"ping-pong", "-m", "64"}, 1, true},
		{"under-load", []string{"under-load", "-m", "64", "--mps", "5000"}, 1, true},
		{"throughput-14", []string{"throughput", "-m", "14", "--mps", "5000"}, 1, false},
		{"throughput-65000", []string{"throughput", "-m", "65000", "--mps", "500"}, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			before := l.counters(t)
			args := append(tc.args, "-i", srv.Addr().String(), "-p", strconv.Itoa(port), "-t", "1")
			out, err := l.preloaded(ctx, nil, bin, args...).CombinedOutput()
			if err != nil {
				t.Fatalf("sockperf %v: %v\n%s", args, err, out)
			}
			sent, received := sockperfCounts(t, string(out))
			if sent == 0 || (tc.pong && received == 0) {
				t.Fatalf("sockperf sent %d, received %d:\n%s", sent, received, out)
			}
			if tc.name == "ping-pong" && received+1 < sent {
				t.Errorf("ping-pong: %d of %d answered", received, sent)
			}
			tx := sent * tc.frames
			if !tc.pong && tx > 0 {
				// sockperf counts the send its end-of-test timer
				// interrupts: with a full queue (a 256 KiB queue holds
				// two 65000-byte datagrams) that send waits for room
				// and fails with EINTR, where a kernel socket's would
				// not have waited.
				tx--
			}
			l.checkPath(t, before, received, tx)
			t.Logf("sent %d received %d\n%s", sent, received, lastLines(string(out), 3))
		})
	}
}

// TestSockperfServer: sockperf server under the library in A, with each
// multiplexer (epoll, poll, select), answering a kernel sockperf client in
// B.
func TestSockperfServer(t *testing.T) {
	bin := needTool(t, "sockperf", "sockperf")
	l := newLab(t)
	for i, mux := range []string{"e", "p", "s"} {
		t.Run("F-"+mux, func(t *testing.T) {
			port := 12000 + i
			srv := netip.AddrPortFrom(l.p.A.Addr4(), uint16(port))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			before := l.counters(t)
			// -F needs the addresses in a file (lines "U:IP:PORT").
			feed := filepath.Join(t.TempDir(), "feed")
			if err := os.WriteFile(feed, []byte(fmt.Sprintf("U:%s:%d\n", srv.Addr(), port)), 0o644); err != nil {
				t.Fatal(err)
			}
			log := startIn(t, l.preloaded(ctx, nil, bin, "server", "-F", mux, "-f", feed))
			sockperfProbe(t, l.p.B.NS, srv)
			cctx, ccancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer ccancel()
			out, err := l.p.B.NS.Command(cctx, bin, "ping-pong", "-m", "64", "-t", "1", "-i", srv.Addr().String(), "-p", strconv.Itoa(port)).CombinedOutput()
			if err != nil {
				t.Fatalf("kernel sockperf client: %v\n%s\nserver:\n%s", err, out, log)
			}
			sent, received := sockperfCounts(t, string(out))
			if received == 0 || received+1 < sent {
				t.Fatalf("server answered %d of %d:\n%s\nserver:\n%s", received, sent, out, log)
			}
			l.checkPath(t, before, received, received)
			if !strings.Contains(log.String(), "offloaded as bypassd socket") {
				t.Errorf("the server's log does not show the socket offloaded:\n%s", log)
			}
		})
	}
}

// echoServer answers every datagram with the same bytes, from a kernel
// socket in B.
func echoServer(t *testing.T, ns *netlab.NS, addr netip.Addr) netip.AddrPort {
	t.Helper()
	c := ns.ListenUDP(t, netip.AddrPortFrom(addr, 0))
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	return c.LocalAddr().(*net.UDPAddr).AddrPort()
}

// TestMultiplexing runs c/tests/mux.c (an ordinary C program, under ASan
// and UBSan) under the library: epoll LT/ET/one-shot with kernel fds
// mixed in, poll, select, non-blocking, timeouts, EINTR, dup, close while
// blocked, fork and fork+exec.
func TestMultiplexing(t *testing.T) {
	l := newLab(t)
	mux := buildMux(t)
	echo := echoServer(t, l.p.B.NS, l.p.B.Addr4())
	before := l.counters(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The sanitizer runtime need not come first: the library is
	// preloaded ahead of it on purpose.
	out, err := l.preloaded(ctx, []string{"ASAN_OPTIONS=verify_asan_link_order=0"}, mux,
		l.p.A.Addr4().String(), echo.Addr().String(), strconv.Itoa(int(echo.Port()))).CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("mux test: %v", err)
	}
	m := regexp.MustCompile(`sent (\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatal("mux test did not finish")
	}
	sent, _ := strconv.ParseUint(string(m[1]), 10, 64)
	l.checkPath(t, before, sent, sent)
}

// TestPythonAsyncio: an unmodified Python interpreter's asyncio UDP echo
// server (epoll underneath) under the library, driven by a kernel client.
func TestPythonAsyncio(t *testing.T) {
	py := needTool(t, "python3", "python3")
	l := newLab(t)
	const script = `
import asyncio, sys
class Echo(asyncio.DatagramProtocol):
    def connection_made(self, tr): self.tr = tr
    def datagram_received(self, data, addr): self.tr.sendto(data, addr)
async def main():
    loop = asyncio.get_running_loop()
    tr, _ = await loop.create_datagram_endpoint(Echo, local_addr=(sys.argv[1], int(sys.argv[2])))
    print("listening", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
`
	const port = 13000
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	before := l.counters(t)
	log := startIn(t, l.preloaded(ctx, nil, py, "-c", script, l.p.A.Addr4().String(), strconv.Itoa(port)))
	c := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	dst := netip.AddrPortFrom(l.p.A.Addr4(), port)
	buf := make([]byte, 2048)
	const n = 200
	got := 0
	limit := time.Now().Add(20 * time.Second)
	for i := 0; got < n; i++ {
		if time.Now().After(limit) {
			t.Fatalf("%d of %d echoes from asyncio; its output:\n%s", got, n, log)
		}
		msg := []byte(fmt.Sprintf("datagram %d", i))
		if _, err := c.WriteToUDPAddrPort(msg, dst); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		k, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			continue // the interpreter may still be starting
		}
		if !bytes.Equal(buf[:k], msg) {
			t.Fatalf("echo %q, want %q", buf[:k], msg)
		}
		got++
	}
	l.checkPath(t, before, n, n)
}

// TestDaemonGoneMidRun: bypassd stops while a thread of an unmodified
// program blocks in recv on an offloaded socket: the call fails with
// ECONNRESET (it never hangs), later calls too, and one line says why.
func TestDaemonGoneMidRun(t *testing.T) {
	py := needTool(t, "python3", "python3")
	l := newLab(t)
	const script = `
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 0))
print("bound", flush=True)
for i in range(2):
    try:
        s.recv(100)
    except OSError as e:
        print("recv failed:", e.errno, flush=True)
`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := l.preloaded(ctx, nil, py, "-c", script, l.p.A.Addr4().String())
	out := new(output)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(20 * time.Second); !strings.Contains(out.String(), "bound"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the program did not bind:\n%s", out)
		}
	}
	time.Sleep(200 * time.Millisecond) // into recv
	if err := l.srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("python: %v\n%s", err, out)
	}
	if got := out.String(); strings.Count(got, "recv failed: 104") != 2 || !strings.Contains(got, "bypassd session ended") {
		t.Errorf("output %q; want two ECONNRESET (104) and the session's end logged", got)
	}
}

// TestRequireWithoutDaemon: no daemon at BYPASSD_SOCKET. The program keeps
// working on kernel sockets with one log line; with BYPASSD_REQUIRE=1 the
// bind fails instead. Needs no privilege.
func TestRequireWithoutDaemon(t *testing.T) {
	py := needTool(t, "python3", "python3")
	lib, _ := built(t)
	const script = `
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    s.bind(("0.0.0.0", 0))
except OSError as e:
    print("bind failed:", e.errno)
else:
    print("bound", s.getsockname()[1])
`
	run := func(require string) (string, string) {
		cmd := exec.Command(py, "-c", script)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		cmd.Env = append(os.Environ(), "LD_PRELOAD="+lib, "BYPASSD_SOCKET="+t.TempDir()+"/none.sock", "BYPASSD_REQUIRE="+require)
		if err := cmd.Run(); err != nil {
			t.Fatalf("python: %v\n%s%s", err, stdout.String(), stderr.String())
		}
		return stdout.String(), stderr.String()
	}
	out, log := run("0")
	if !strings.HasPrefix(out, "bound ") || strings.Count(log, "cannot reach bypassd") != 1 {
		t.Errorf("without BYPASSD_REQUIRE: stdout %q, log %q; want a kernel socket and one log line", out, log)
	}
	out, log = run("1")
	if out != "bind failed: 111\n" || !strings.Contains(log, "BYPASSD_REQUIRE=1") {
		t.Errorf("with BYPASSD_REQUIRE=1: stdout %q, log %q; want ECONNREFUSED (111) and a log line naming BYPASSD_REQUIRE", out, log)
	}
}

func lastLines(s string, n int) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
