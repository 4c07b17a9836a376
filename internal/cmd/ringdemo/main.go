// Command ringdemo is what `make demo` runs: it builds a two-namespace lab,
// starts a real `sockperf server` in one namespace and, from the other,
// runs a sockperf-protocol UDP ping-pong against it twice — once through a
// bypassd ring (AF_XDP, past the kernel's UDP stack) and once through an
// ordinary kernel socket — then prints both latency summaries and the
// ring's and XDP program's counters. It removes everything it created, also
// on Ctrl-C, and exits non-zero on any failure.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring"
)

func main() {
	dur := flag.Duration("t", 3*time.Second, "length of each ping-pong run")
	size := flag.Int("m", 64, "message size in bytes (sockperf -m), 14..65507")
	port := flag.Int("p", 11111, "sockperf server port")
	poll := flag.Duration("poll", 50*time.Microsecond, "how long the ring engine and the receiving call spin before sleeping (negative: forever)")
	flag.Parse()
	if err := run(*dur, *size, uint16(*port), *poll); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(dur time.Duration, size int, port uint16, poll time.Duration) error {
	if size < sockperfHeader || size > 65507 {
		return fmt.Errorf("message size %d: must be 14..65507", size)
	}
	if ok, why := netlab.Privileged(); !ok {
		return fmt.Errorf("needs root: %s", why)
	}
	if _, err := exec.LookPath("sockperf"); err != nil {
		return errors.New("sockperf not found: run `make deps` (or apt-get install sockperf)")
	}
	p, err := netlab.CreatePair(netlab.Options{})
	if err != nil {
		return err
	}
	defer p.Close()
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	server := netip.AddrPortFrom(p.B.Addr4(), port)
	fmt.Printf("lab: %s (%s, %v) <-> %s (%s, %v)\n", p.A.NS.Name, p.A.Name, p.A.IPv4, p.B.NS.Name, p.B.Name, p.B.IPv4)
	srv := p.B.NS.Command(ctx, "sockperf", "server", "-i", server.Addr().String(), "-p", fmt.Sprint(port))
	srv.Stdout, srv.Stderr = nil, nil
	if err := srv.Start(); err != nil {
		return fmt.Errorf("start sockperf server: %w", err)
	}
	defer func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
	}()
	fmt.Printf("sockperf server on %v in %s\n\n", server, p.B.NS.Name)

	var r *ring.Ring
	if err := p.A.NS.Do(func() error {
		var err error
		r, err = ring.Open(ring.Config{Interface: p.A.Name, Poll: poll, RXPoll: poll})
		return err
	}); err != nil {
		return err
	}
	defer r.Close()
	ep, err := r.BindUDP(netip.AddrPortFrom(p.A.Addr4(), 0))
	if err != nil {
		return err
	}
	caps := r.Caps()
	fmt.Printf("ring %s/0: provider %s, mode %s, endpoint %v, spin %v\n", p.A.Name, caps.Provider, caps.Mode, ep.LocalAddr(), poll)
	ringRTT, err := pingPong(ctx, ringConn{ep, server}, dur, size)
	if err != nil {
		return fmt.Errorf("ring ping-pong: %w", err)
	}

	var kc *net.UDPConn
	if err := p.A.NS.Do(func() error {
		var err error
		kc, err = net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(server))
		return err
	}); err != nil {
		return err
	}
	defer kc.Close()
	kernelRTT, err := pingPong(ctx, kernelConn{kc}, dur, size)
	if err != nil {
		return fmt.Errorf("kernel ping-pong: %w", err)
	}

	summary("bypassd ring (AF_XDP)", ringRTT, size, dur)
	summary("kernel UDP socket", kernelRTT, size, dur)
	st := r.Stats()
	fmt.Printf("\nring counters: rx %d pkts / %d B, tx %d pkts / %d B, rx checksum errors %d, no endpoint %d, wake-ups %d\n",
		st.RXPackets.Load(), st.RXBytes.Load(), st.TXPackets.Load(), st.TXBytes.Load(), st.RXChecksum.Load(), st.RXNoEndpoint.Load(), st.Wakeups.Load())
	if c, err := r.Program().Counters(); err == nil {
		fmt.Printf("XDP program: redirected %d, passed to kernel %d, no socket %d, malformed %d\n", c.Redirected, c.Passed, c.NoSocket, c.Malformed)
	}
	if ringRTT == nil || len(ringRTT) == 0 {
		return errors.New("no ring round trips completed")
	}
	return nil
}

// conn is one side of a ping-pong: the ring endpoint or a kernel socket.
type conn interface {
	send(b []byte) error
	recv(b []byte, deadline time.Time) (int, error)
}

type ringConn struct {
	ep  *ring.Endpoint
	dst netip.AddrPort
}

func (c ringConn) send(b []byte) error { return c.ep.Send(b, c.dst, time.Time{}) }
func (c ringConn) recv(b []byte, d time.Time) (int, error) {
	n, _, err := c.ep.Recv(b, d)
	return n, err
}

type kernelConn struct{ c *net.UDPConn }

func (c kernelConn) send(b []byte) error { _, err := c.c.Write(b); return err }
func (c kernelConn) recv(b []byte, d time.Time) (int, error) {
	_ = c.c.SetReadDeadline(d)
	return c.c.Read(b)
}

// sockperf's UDP header: seq u64 | flags u16 | length u32, big-endian.
const (
	sockperfHeader = 14
	flagClient     = 0x1
	flagPong       = 0x2
)

// pingPong sends sockperf ping-pong requests one at a time for dur and
// returns the round-trip times of the replies (after a short warm-up that
// also resolves the neighbour).
func pingPong(ctx context.Context, c conn, dur time.Duration, size int) ([]time.Duration, error) {
	msg := make([]byte, size)
	buf := make([]byte, 65536)
	var rtts []time.Duration
	warmupEnd := time.Now().Add(300 * time.Millisecond)
	end := warmupEnd.Add(dur)
	for seq := uint64(1); time.Now().Before(end); seq++ {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		binary.BigEndian.PutUint64(msg[0:], seq)
		binary.BigEndian.PutUint16(msg[8:], flagClient|flagPong)
		binary.BigEndian.PutUint32(msg[10:], uint32(size))
		start := time.Now()
		if err := c.send(msg); err != nil {
			return nil, err
		}
		for {
			n, err := c.recv(buf, time.Now().Add(2*time.Second))
			if err != nil {
				return nil, fmt.Errorf("seq %d: no reply from the sockperf server: %w", seq, err)
			}
			if n == size && binary.BigEndian.Uint64(buf) == seq {
				break // stale replies of an earlier timeout are skipped
			}
		}
		if start.After(warmupEnd) {
			rtts = append(rtts, time.Since(start))
		}
	}
	return rtts, nil
}

// summary prints a sockperf-style latency summary (one-way = RTT/2).
func summary(name string, rtts []time.Duration, size int, dur time.Duration) {
	fmt.Printf("\n== %s: %d round trips of %d bytes in %v\n", name, len(rtts), size, dur)
	if len(rtts) == 0 {
		return
	}
	s := slices.Clone(rtts)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	us := func(d time.Duration) float64 { return float64(d) / 2 / float64(time.Microsecond) }
	pct := func(p float64) time.Duration {
		i := int(0.5+p*float64(len(s))) - 1
		return s[max(0, min(i, len(s)-1))]
	}
	fmt.Printf("Summary: Latency is %.3f usec (avg one-way)\n", us(sum/time.Duration(len(s))))
	fmt.Printf("---> <MAX> observation = %8.3f\n", us(s[len(s)-1]))
	for _, p := range []float64{0.999, 0.99, 0.90, 0.50, 0.25} {
		fmt.Printf("---> percentile %6.3f = %8.3f\n", p*100, us(pct(p)))
	}
	fmt.Printf("---> <MIN> observation = %8.3f\n", us(s[0]))
}
