package ring_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring"
)

// lab is a two-namespace veth lab with a ring on A's end.
type lab struct {
	p *netlab.Pair
	r *ring.Ring
}

func newLab(t *testing.T, cfg ring.Config) *lab {
	t.Helper()
	return newLabWith(t, netlab.Options{}, cfg)
}

// newLabWith is newLab on a pair made with opts (an MTU, say).
func newLabWith(t *testing.T, opts netlab.Options, cfg ring.Config) *lab {
	t.Helper()
	p := netlab.NewPair(t, opts)
	l := &lab{p: p}
	cfg.Interface = p.A.Name
	err := p.A.NS.Do(func() error {
		var err error
		l.r, err = ring.Open(cfg)
		return err
	})
	if err != nil {
		t.Fatalf("open ring: %v", err)
	}
	t.Cleanup(func() {
		if err := l.r.Close(); err != nil {
			t.Errorf("close ring: %v", err)
		}
	})
	return l
}

func (l *lab) bind(t *testing.T, addr netip.AddrPort) *ring.Endpoint {
	t.Helper()
	ep, err := l.r.BindUDP(addr)
	if err != nil {
		t.Fatalf("bind %v: %v", addr, err)
	}
	t.Cleanup(func() { _ = ep.Close() })
	return ep
}

func payload(seq, n int) []byte {
	b := make([]byte, n)
	rng := rand.New(rand.NewPCG(uint64(seq), uint64(n)))
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// udpStat reads a counter of the Udp (or Udp6) line of /proc/net/snmp(6)
// inside ns.
func udpStat(t *testing.T, ns *netlab.NS, v6 bool, field string) uint64 {
	t.Helper()
	table := "Udp"
	if v6 {
		table, field = "", "Udp6"+field
	}
	v, err := ns.SNMPCounter(table, field)
	if err != nil {
		t.Fatalf("read udp stat %s: %v", field, err)
	}
	return v
}

// ipStat reads a counter of the Ip line of /proc/net/snmp inside ns.
func ipStat(t *testing.T, ns *netlab.NS, field string) uint64 {
	t.Helper()
	v, err := ns.SNMPCounter("Ip", field)
	if err != nil {
		t.Fatalf("read ip stat %s: %v", field, err)
	}
	return v
}

var sizes = []int{18, 1400, 8000}

type family struct {
	name string
	addr func(l *netlab.Link) netip.Addr
}

var families = []family{
	{"ipv4", (*netlab.Link).Addr4},
	{"ipv6", (*netlab.Link).Addr6},
}

// paths are the ways a ring moves frames; tests that must hold on each run
// once per path.
var paths = []struct {
	name string
	cfg  ring.Config
}{
	{"afxdp", ring.Config{}},
	{"tap", ring.Config{Fallback: ring.FallbackTAP}},
}

func TestKernelToRing(t *testing.T) {
	for _, fam := range families {
		for _, path := range paths {
			t.Run(fam.name+"/"+path.name, func(t *testing.T) {
				t.Parallel()
				l := newLab(t, path.cfg)
				ep := l.bind(t, netip.AddrPortFrom(fam.addr(l.p.A), 0))
				sender := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(fam.addr(l.p.B), 0))
				const perSize = 200
				buf := make([]byte, 70000)
				for _, size := range sizes {
					for i := 0; i < perSize; i++ {
						want := payload(i, size)
						if _, err := sender.WriteToUDPAddrPort(want, ep.LocalAddr()); err != nil {
							t.Fatalf("kernel send: %v", err)
						}
						n, from, err := ep.Recv(buf, time.Now().Add(5*time.Second))
						if err != nil {
							t.Fatalf("size %d datagram %d: recv: %v (ring stats %+v)", size, i, err, l.r.Stats())
						}
						if !bytes.Equal(buf[:n], want) {
							t.Fatalf("size %d datagram %d: payload differs (got %d bytes)", size, i, n)
						}
						if from != netip.AddrPortFrom(fam.addr(l.p.B), sender.LocalAddr().(*net.UDPAddr).AddrPort().Port()) {
							t.Fatalf("sender address %v", from)
						}
					}
				}
				if got := l.r.Stats().RXPackets.Load(); got != uint64(perSize*len(sizes)) {
					t.Errorf("ring RXPackets = %d, want %d", got, perSize*len(sizes))
				}
				if got := l.r.ReassemblyStats().Reassembled; got != perSize {
					t.Errorf("reassembled %d datagrams, want %d", got, perSize)
				}
			})
		}
	}
}

func TestRingToKernel(t *testing.T) {
	for _, fam := range families {
		for _, path := range paths {
			t.Run(fam.name+"/"+path.name, func(t *testing.T) {
				t.Parallel()
				l := newLab(t, path.cfg)
				ep := l.bind(t, netip.AddrPortFrom(fam.addr(l.p.A), 0))
				recv := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(fam.addr(l.p.B), 0))
				dst := recv.LocalAddr().(*net.UDPAddr).AddrPort()
				csumBefore := udpStat(t, l.p.B.NS, fam.name == "ipv6", "InCsumErrors")
				const perSize = 200
				buf := make([]byte, 70000)
				for _, size := range sizes {
					for i := 0; i < perSize; i++ {
						want := payload(i, size)
						if err := ep.Send(want, dst, time.Time{}); err != nil {
							t.Fatalf("ring send: %v", err)
						}
						_ = recv.SetReadDeadline(time.Now().Add(5 * time.Second))
						n, from, err := recv.ReadFromUDPAddrPort(buf)
						if err != nil {
							t.Fatalf("size %d datagram %d: kernel recv: %v (ring stats %+v)", size, i, err, l.r.Stats())
						}
						if !bytes.Equal(buf[:n], want) {
							t.Fatalf("size %d datagram %d: payload differs (got %d bytes)", size, i, n)
						}
						if from.Port() != ep.LocalAddr().Port() || from.Addr().Unmap() != fam.addr(l.p.A) {
							t.Fatalf("source address %v, want %v", from, ep.LocalAddr())
						}
					}
				}
				if after := udpStat(t, l.p.B.NS, fam.name == "ipv6", "InCsumErrors"); after != csumBefore {
					t.Errorf("receiver counted %d UDP checksum errors", after-csumBefore)
				}
				if got := l.r.Stats().TXFragments.Load(); got == 0 {
					t.Errorf("8000-byte datagrams were not fragmented")
				}
			})
		}
	}
}

// TestKernelPathUnaffected: with the program attached and a port offloaded,
// ping and ordinary sockets on other ports keep working.
func TestKernelPathUnaffected(t *testing.T) {
	l := newLab(t, ring.Config{})
	l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, dst := range []netip.Addr{l.p.A.Addr4(), l.p.A.Addr6()} {
		out, err := l.p.B.NS.Command(ctx, "ping", "-c", "3", "-i", "0.2", "-W", "2", dst.String()).CombinedOutput()
		if err != nil {
			t.Fatalf("ping %v while the program is attached: %v\n%s", dst, err, out)
		}
	}
	plain := l.p.A.NS.ListenUDP(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
	sender := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	if _, err := sender.WriteToUDPAddrPort([]byte("kernel"), plain.LocalAddr().(*net.UDPAddr).AddrPort()); err != nil {
		t.Fatal(err)
	}
	_ = plain.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 64)
	n, err := plain.Read(buf)
	if err != nil || string(buf[:n]) != "kernel" {
		t.Fatalf("kernel socket on a non-offloaded port: %q, %v", buf[:n], err)
	}
	c, err := l.r.Program().Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c.Passed == 0 {
		t.Errorf("XDP program passed no frames to the kernel: %+v", c)
	}
}

func TestReopenSameQueue(t *testing.T) {
	p := netlab.NewPair(t, netlab.Options{})
	for i := 0; i < 10; i++ {
		err := p.A.NS.Do(func() error {
			r, err := ring.Open(ring.Config{Interface: p.A.Name})
			if err != nil {
				return err
			}
			ep, err := r.BindUDP(netip.AddrPortFrom(p.A.Addr4(), 0))
			if err != nil {
				r.Close()
				return err
			}
			if err := ep.Close(); err != nil {
				return err
			}
			return r.Close()
		})
		if err != nil {
			t.Fatalf("open/close round %d: %v", i, err)
		}
	}
	// Nothing of ours stays attached.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := p.A.NS.Command(ctx, "ip", "-d", "link", "show", "dev", p.A.Name).CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "prog/xdp") || strings.Contains(string(out), "xdp") && strings.Contains(string(out), " id ") {
		t.Errorf("XDP program still attached after close:\n%s", out)
	}
}

func TestBadInput(t *testing.T) {
	l := newLab(t, ring.Config{})
	t.Run("port in use", func(t *testing.T) {
		taken := l.p.A.NS.ListenUDP(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
		_, err := l.r.BindUDP(taken.LocalAddr().(*net.UDPAddr).AddrPort())
		if !errors.Is(err, unix.EADDRINUSE) {
			t.Fatalf("bind to a port in use: %v, want EADDRINUSE", err)
		}
		ep := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
		if _, err := l.r.BindUDP(ep.LocalAddr()); !errors.Is(err, unix.EADDRINUSE) {
			t.Fatalf("second bind to an offloaded port: %v, want EADDRINUSE", err)
		}
	})
	t.Run("foreign address", func(t *testing.T) {
		_, err := l.r.BindUDP(netip.AddrPortFrom(l.p.B.Addr4(), 0))
		if !errors.Is(err, unix.EADDRNOTAVAIL) {
			t.Fatalf("bind to another host's address: %v, want EADDRNOTAVAIL", err)
		}
	})
	t.Run("unknown interface", func(t *testing.T) {
		err := l.p.A.NS.Do(func() error {
			_, err := ring.Open(ring.Config{Interface: "bdnosuch0"})
			return err
		})
		if err == nil || !strings.Contains(err.Error(), "bdnosuch0") {
			t.Fatalf("open unknown interface: %v, want an error naming it", err)
		}
	})
	t.Run("unknown queue", func(t *testing.T) {
		err := l.p.A.NS.Do(func() error {
			_, err := ring.Open(ring.Config{Interface: l.p.A.Name, Queue: 7})
			return err
		})
		if err == nil || !strings.Contains(err.Error(), "queue 7") {
			t.Fatalf("open unknown queue: %v, want an error naming it", err)
		}
	})
	t.Run("message too long", func(t *testing.T) {
		ep := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
		err := ep.Send(make([]byte, 65508), netip.AddrPortFrom(l.p.B.Addr4(), 9), time.Time{})
		if !errors.Is(err, unix.EMSGSIZE) {
			t.Fatalf("send 65508 bytes: %v, want EMSGSIZE", err)
		}
	})
	t.Run("no destination", func(t *testing.T) {
		ep := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
		if err := ep.Send([]byte("x"), netip.AddrPort{}, time.Time{}); !errors.Is(err, unix.EDESTADDRREQ) {
			t.Fatalf("send without destination: %v, want EDESTADDRREQ", err)
		}
	})
	t.Run("recv deadline and close", func(t *testing.T) {
		ep := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
		_, _, err := ep.Recv(make([]byte, 10), time.Now().Add(50*time.Millisecond))
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("recv past deadline: %v", err)
		}
		done := make(chan error, 1)
		go func() {
			_, _, err := ep.Recv(make([]byte, 10), time.Time{})
			done <- err
		}()
		time.Sleep(20 * time.Millisecond)
		_ = ep.Close()
		select {
		case err := <-done:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("recv after close: %v, want net.ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not unblock Recv")
		}
	})
}

// TestWildcardBindAndEcho binds the unspecified address and runs a
// ping-pong with a kernel echo in the peer namespace.
func TestWildcardBindAndEcho(t *testing.T) {
	l := newLab(t, ring.Config{})
	ep := l.bind(t, netip.AddrPortFrom(netip.IPv4Unspecified(), 0))
	echo := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := echo.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = echo.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	dst := echo.LocalAddr().(*net.UDPAddr).AddrPort()
	if err := ep.Connect(dst); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	for i := 0; i < 1000; i++ {
		want := payload(i, 1+i%1400)
		if err := ep.Send(want, netip.AddrPort{}, time.Time{}); err != nil {
			t.Fatal(err)
		}
		n, from, err := ep.Recv(buf, time.Now().Add(5*time.Second))
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		if from != dst || !bytes.Equal(buf[:n], want) {
			t.Fatalf("round %d: got %d bytes from %v", i, n, from)
		}
	}
}

// TestMain checks, after every test has run and cleaned up, that no
// namespace of this process's labs is left (with them go their links and
// XDP programs).
func TestMain(m *testing.M) {
	code := m.Run()
	entries, _ := os.ReadDir("/run/netns")
	mine := fmt.Sprintf("%s%d-", netlab.Prefix, os.Getpid())
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), mine) {
			fmt.Fprintf(os.Stderr, "leftover network namespace %s\n", e.Name())
			code = 1
		}
	}
	os.Exit(code)
}
