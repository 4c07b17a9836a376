// Command tcpbench compares TCP through bypassd with kernel TCP in one
// lab and one run: 64-byte request/response latency (p50, p99, one
// connection), transactions/s over 1, 16 and 256 connections at once,
// connection setup rate (connect, one exchange, close), and single-stream
// bulk throughput with the process's CPU time per GB, the client in
// namespace A (through bypassd's TCP stack, or the kernel's) and a kernel
// server in namespace B. Run as root; `make bench` runs it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/bypassd/bypassd/daemon"
	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/socket"
)

func main() {
	dur := flag.Duration("duration", 3*time.Second, "length of each latency run")
	size := flag.Int("size", 64, "request and response size (bytes)")
	bulk := flag.Int("bulk", 256<<20, "bytes of the bulk transfer")
	poll := flag.Duration("poll", 50*time.Microsecond, "spin time of the daemon's engine and its clients before sleeping")
	connsFlag := flag.String("conns", "1,16,256", "connection counts of the transactions/s runs")
	setups := flag.Int("setups", 300, "connections of the setup-rate run")
	paths := flag.String("paths", "bypassd,ring,kernel", "paths to measure")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run (client and daemon: one process) to this file")
	traceFile := flag.String("trace", "", "write an execution trace of the whole run to this file (go tool trace)")
	serveFD := flag.Bool("serve-fd3", false, "internal: be the echo server on the listening socket passed as fd 3")
	flag.Parse()
	if *serveFD {
		l, err := net.FileListener(os.NewFile(3, "listener"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "tcpbench server:", err)
			os.Exit(1)
		}
		serve(l.(*net.TCPListener), *size)
		return
	}
	stop, err := profile(*cpuProfile, *traceFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tcpbench:", err)
		os.Exit(1)
	}
	var conns []int
	for _, f := range strings.Split(*connsFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "tcpbench: -conns %q: want counts like 1,16,256\n", *connsFlag)
			os.Exit(2)
		}
		conns = append(conns, n)
	}
	err = run(*dur, *size, *bulk, *poll, conns, *setups, strings.Split(*paths, ","))
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tcpbench:", err)
		os.Exit(1)
	}
}

// profile starts a CPU profile and an execution trace when asked; stop
// ends them.
func profile(cpu, tr string) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, f := range stops {
			f()
		}
	}
	start := func(name string, begin func(io.Writer) error, end func()) error {
		f, err := os.Create(name)
		if err != nil {
			return err
		}
		if err := begin(f); err != nil {
			f.Close()
			return fmt.Errorf("%s: %w", name, err)
		}
		stops = append(stops, func() { end(); f.Close() })
		return nil
	}
	if cpu != "" {
		if err := start(cpu, pprof.StartCPUProfile, pprof.StopCPUProfile); err != nil {
			return nil, err
		}
	}
	if tr != "" {
		if err := start(tr, trace.Start, trace.Stop); err != nil {
			stop()
			return nil, err
		}
	}
	return stop, nil
}

func run(dur time.Duration, size, bulk int, poll time.Duration, conns []int, setups int, paths []string) error {
	if ok, why := netlab.Privileged(); !ok {
		return fmt.Errorf("needs root: %s", why)
	}
	p, err := netlab.CreatePair(netlab.Options{StaticNeigh: true})
	if err != nil {
		return err
	}
	defer p.Close()
	dir, err := os.MkdirTemp("", "tcpbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg := config.Config{Interfaces: []config.Interface{{Name: p.A.Name}}, SocketPath: filepath.Join(dir, "bypassd.sock"),
		RunDir: dir, StatsDir: filepath.Join(dir, "stats"), RXPoll: poll, EnginePoll: poll, Fallback: "none",
		// 256 connections of 1 MiB queues each way: above the default
		// per-client budget.
		MaxQueueMemory: 1 << 30}
	var d *daemon.Daemon
	if err := p.A.NS.Do(func() error { d, err = daemon.New(cfg, zap.NewNop()); return err }); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- d.Serve(ctx) }()
	defer func() { cancel(); d.Close(); <-served }()
	c, err := socket.Dial(cfg.SocketPath)
	if err != nil {
		return err
	}
	defer c.Close()

	var srv *net.TCPListener
	if err := p.B.NS.Do(func() error {
		srv, err = net.ListenTCP("tcp4", net.TCPAddrFromAddrPort(netip.AddrPortFrom(p.B.Addr4(), 0)))
		return err
	}); err != nil {
		return err
	}
	defer srv.Close()
	stopServer, err := startServer(srv, size)
	if err != nil {
		return err
	}
	defer stopServer()
	addr := srv.Addr().(*net.TCPAddr).AddrPort()

	dials := []dial{
		{"bypassd", func() (net.Conn, error) {
			conn, err := c.DialTCP("tcp4", netip.AddrPort{}, addr)
			if err == nil {
				err = conn.SetNoDelay(true)
			}
			return conn, err
		}},
		// The ring's stack in this process, without the client queues and
		// the pump: what the daemon's side costs on its own.
		{"ring", func() (net.Conn, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			rc, err := d.Rings()[0].DialTCP(ctx, netip.AddrPort{}, addr)
			if err != nil {
				return nil, err
			}
			rc.Endpoint().EP.SocketOptions().SetDelayOption(false)
			return rc.NetConn(), nil
		}},
		{"kernel", func() (net.Conn, error) {
			var conn net.Conn
			err := p.A.NS.Do(func() error { conn, err = net.Dial("tcp4", addr.String()); return err })
			return conn, err
		}},
	}
	dials = slices.DeleteFunc(dials, func(d dial) bool { return !slices.Contains(paths, d.name) })
	fmt.Printf("%-8s %10s %10s %12s %14s %12s\n", "path", "p50 µs", "p99 µs", "trans/s", "bulk Gbit/s", "CPU s/GB")
	for _, dl := range dials {
		conn, err := dl.dial()
		if err != nil {
			return fmt.Errorf("%s: dial: %w", dl.name, err)
		}
		p50, p99, tps, err := pingPong(conn, size, dur)
		conn.Close()
		if err != nil {
			return fmt.Errorf("%s: ping-pong: %w", dl.name, err)
		}
		conn, err = dl.dial()
		if err != nil {
			return fmt.Errorf("%s: dial: %w", dl.name, err)
		}
		cpu0 := cpuTime()
		gbps, err := bulkSend(conn, bulk)
		if err != nil {
			return fmt.Errorf("%s: bulk: %w", dl.name, err)
		}
		cpuPerGB := (cpuTime() - cpu0).Seconds() / (float64(bulk) / 1e9)
		fmt.Printf("%-8s %10.1f %10.1f %12.0f %14.2f %12.2f\n", dl.name, p50, p99, tps, gbps, cpuPerGB)
	}
	fmt.Println()
	fmt.Printf("%-8s %8s %12s\n", "path", "conns", "trans/s")
	for _, n := range conns {
		for _, dl := range dials {
			if dl.name == "ring" {
				continue
			}
			tps, err := manyPingPong(dl.dial, n, size, dur)
			if err != nil {
				return fmt.Errorf("%s: %d connections: %w", dl.name, n, err)
			}
			fmt.Printf("%-8s %8d %12.0f\n", dl.name, n, tps)
		}
	}
	fmt.Println()
	fmt.Printf("%-8s %14s\n", "path", "setups/s")
	for _, dl := range dials {
		if dl.name == "ring" {
			continue
		}
		rate, done, err := setupRate(dl.dial, setups, size)
		if err != nil {
			// Reported, not fatal: the other rows still mean something.
			fmt.Printf("%-8s %14s  (failed after %d connections: %v)\n", dl.name, "-", done, err)
			continue
		}
		fmt.Printf("%-8s %14.0f\n", dl.name, rate)
	}
	return nil
}

// dial is one path's way to open a connection to the server.
type dial struct {
	name string
	dial func() (net.Conn, error)
}

// cpuTime is the process's user and system CPU time: the client and, for
// bypassd, the daemon (in this process); kernel TCP's softirq work is
// counted where it runs, often not here.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// manyPingPong runs n connections' ping-pong at once for dur and returns
// the transactions per second of all of them.
func manyPingPong(dial func() (net.Conn, error), n, size int, dur time.Duration) (float64, error) {
	cs := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range cs {
			c.Close()
		}
	}()
	for range n {
		c, err := dial()
		if err != nil {
			return 0, err
		}
		cs = append(cs, c)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var total int
	var firstErr error
	start := time.Now()
	for _, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k, err := exchanges(c, size, dur)
			mu.Lock()
			total += k
			if err != nil && firstErr == nil {
				firstErr = err
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return float64(total) / time.Since(start).Seconds(), firstErr
}

// exchanges runs one connection's ping-pong for dur and counts the
// round trips.
func exchanges(c net.Conn, size int, dur time.Duration) (int, error) {
	if _, err := c.Write([]byte{'p'}); err != nil {
		return 0, err
	}
	buf := make([]byte, size)
	k := 0
	for end := time.Now().Add(dur); time.Now().Before(end); k++ {
		if _, err := c.Write(buf); err != nil {
			return k, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return k, err
		}
	}
	return k, nil
}

// setupRate opens n connections one after the other, each with one
// exchange and a close, and returns connections per second (and how many
// completed, when one failed).
func setupRate(dial func() (net.Conn, error), n, size int) (float64, int, error) {
	buf := make([]byte, size)
	start := time.Now()
	for i := range n {
		c, err := dial()
		if err != nil {
			return 0, i, err
		}
		if _, err := c.Write(append([]byte{'p'}, buf...)); err != nil {
			c.Close()
			return 0, i, err
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			c.Close()
			return 0, i, err
		}
		c.Close()
	}
	return float64(n) / time.Since(start).Seconds(), n, nil
}

// startServer runs the echo server (serve) on l in a child process: in
// this process its goroutines would wait for the Go network poller, which
// the daemon's spinning engine and clients starve (a request then sat
// 100 µs or more at the server in a trace), and would compete with the
// daemon for the same two Ps. The listening socket was made in namespace
// B and stays there.
func startServer(l *net.TCPListener, size int) (stop func(), err error) {
	f, err := l.File()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-serve-fd3", "-size", strconv.Itoa(size))
	cmd.ExtraFiles = []*os.File{f}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the echo server: %w", err)
	}
	return func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}, nil
}

// serve answers each connection: the first byte says what it is ('p':
// echo size-byte messages; 'b': read to EOF, then answer one byte).
func serve(l *net.TCPListener, size int) {
	for {
		conn, err := l.AcceptTCP()
		if err != nil {
			return
		}
		_ = conn.SetNoDelay(true)
		go func() {
			defer conn.Close()
			kind := make([]byte, 1)
			if _, err := io.ReadFull(conn, kind); err != nil {
				return
			}
			if kind[0] == 'b' {
				_, _ = io.Copy(io.Discard, conn)
				_, _ = conn.Write(kind)
				return
			}
			buf := make([]byte, size)
			for {
				if _, err := io.ReadFull(conn, buf); err != nil {
					return
				}
				if _, err := conn.Write(buf); err != nil {
					return
				}
			}
		}()
	}
}

// pingPong sends size-byte requests one at a time for dur and returns the
// round-trip p50 and p99 (µs) and transactions per second.
func pingPong(conn net.Conn, size int, dur time.Duration) (p50, p99, tps float64, err error) {
	if _, err := conn.Write([]byte{'p'}); err != nil {
		return 0, 0, 0, err
	}
	buf := make([]byte, size)
	ctx := context.Background() // marks each round trip in a -trace
	var rtts []time.Duration
	start := time.Now()
	for time.Since(start) < dur {
		t0 := time.Now()
		trace.Log(ctx, "rt", "write")
		if _, err := conn.Write(buf); err != nil {
			return 0, 0, 0, err
		}
		if _, err := io.ReadFull(conn, buf); err != nil {
			return 0, 0, 0, err
		}
		trace.Log(ctx, "rt", "read")
		rtts = append(rtts, time.Since(t0))
	}
	if len(rtts) == 0 {
		return 0, 0, 0, errors.New("no round trip completed")
	}
	slices.Sort(rtts)
	pct := func(q float64) float64 { return float64(rtts[int(q*float64(len(rtts)-1))].Nanoseconds()) / 1e3 }
	return pct(0.5), pct(0.99), float64(len(rtts)) / time.Since(start).Seconds(), nil
}

// bulkSend writes n bytes, half-closes and waits for the server's answer,
// and returns Gbit/s.
func bulkSend(conn net.Conn, n int) (float64, error) {
	defer conn.Close()
	if _, err := conn.Write([]byte{'b'}); err != nil {
		return 0, err
	}
	buf := make([]byte, 256<<10)
	start := time.Now()
	for sent := 0; sent < n; {
		m := min(len(buf), n-sent)
		if _, err := conn.Write(buf[:m]); err != nil {
			return 0, err
		}
		sent += m
	}
	if err := conn.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(conn, buf[:1]); err != nil {
		return 0, err
	}
	return float64(n) * 8 / time.Since(start).Seconds() / 1e9, nil
}
