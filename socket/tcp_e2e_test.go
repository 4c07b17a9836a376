package socket

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/daemon/daemontest"
	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring/tcpstack"
)

// tcpLab is a veth pair with bypassd on A; TCP peers are kernel sockets in
// B. The ring tests run TCP on the TAP path too (ring.TestTCPWithKernelPeer,
// TestTCPPlugOut); the client side does not depend on the path.
type tcpLab struct {
	p   *netlab.Pair
	srv *daemontest.Server
	c   *Client
}

func newTCPLab(t *testing.T) *tcpLab {
	t.Helper()
	return newTCPLabConfig(t, daemonConfigForTCP())
}

// newTCPLabConfig is newTCPLab with the daemon configured by cfg.
func newTCPLabConfig(t *testing.T, cfg config.Config) *tcpLab {
	t.Helper()
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	srv := daemontest.Start(t, p, cfg, nil)
	l := &tcpLab{p: p, srv: srv}
	var err error
	if l.c, err = Dial(srv.SocketPath()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.c.Close() })
	return l
}

func (l *tcpLab) tcpStats() tcpstack.Stats { return l.srv.Rings()[0].TCPStats() }

// kernelOpens counts the connections the kernel of A's namespace opened.
func (l *tcpLab) kernelOpens(t *testing.T) uint64 {
	return l.p.A.NS.TCPStat(t, "ActiveOpens") + l.p.A.NS.TCPStat(t, "PassiveOpens")
}

// streamExchange writes out, half-closes and reads to EOF; it checks the
// peer's hash of out and the reply byte for byte.
func streamExchange(t *testing.T, c *TCPConn, out, reply []byte) {
	t.Helper()
	streamExchangeDiag(t, c, out, reply, nil)
}

// streamExchangeDiag is streamExchange calling diag (when not nil) before
// failing on a read error.
func streamExchangeDiag(t *testing.T, c *TCPConn, out, reply []byte, diag func()) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(out)
		if err == nil {
			err = c.CloseWrite()
		}
		errc <- err
	}()
	in, err := io.ReadAll(c)
	if err != nil {
		if diag != nil {
			diag()
		}
		t.Fatalf("read: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := netlab.CheckHashReply(out, in, reply); err != nil {
		t.Fatal(err)
	}
}

// bigTransfer is the largest transfer of the tests: 16 MiB, 1 MiB under
// the race detector.
func bigTransfer() int {
	if raceEnabled {
		return 1 << 20
	}
	return 16 << 20
}

// TestTCPDialAndAccept carries TCP between a client of bypassd and the
// kernel stack in B, both ways (client connects; kernel connects to the
// client's listener), IPv4 and IPv6, 1 B to 16 MiB byte-exact with an
// orderly close; the ring's stack counted the connections and the kernel
// on A's side opened none.
func TestTCPDialAndAccept(t *testing.T) {
	netlab.RequirePriv(t)
	t.Parallel()
	l := newTCPLab(t)
	for _, fam := range []struct {
		network string
		a, b    netip.Addr
	}{{"tcp4", l.p.A.Addr4(), l.p.B.Addr4()}, {"tcp6", l.p.A.Addr6(), l.p.B.Addr6()}} {
		t.Run(fam.network, func(t *testing.T) {
			before, st0 := l.kernelOpens(t), l.tcpStats()
			for i, size := range []int{1, 100_000, bigTransfer()} {
				out, reply := payload(size, uint64(i)), payload(size/2+1, uint64(100+i))
				kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(fam.b, 0))
				errc := make(chan error, 1)
				go func() {
					c, err := kl.Accept()
					if err == nil {
						err = netlab.HashPeer(c, reply, 60*time.Second)
					}
					errc <- err
				}()
				c, err := l.c.DialTCP(fam.network, netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort())
				if err != nil {
					t.Fatalf("dial: %v", err)
				}
				if la := c.LocalAddr().(*net.TCPAddr).AddrPort(); la.Addr() != fam.a || la.Port() == 0 {
					t.Errorf("LocalAddr %v, want %v:N", la, fam.a)
				}
				streamExchange(t, c, out, reply)
				if err := <-errc; err != nil {
					t.Fatalf("kernel server: %v", err)
				}
				if err := c.Close(); err != nil {
					t.Fatalf("close: %v", err)
				}
			}

			ln, err := l.c.ListenTCP(fam.network, netip.AddrPortFrom(fam.a, 0))
			if err != nil {
				t.Fatalf("listen: %v", err)
			}
			defer ln.Close()
			laddr := ln.Addr().(*net.TCPAddr).AddrPort()
			for i, size := range []int{1, bigTransfer()} {
				out, reply := payload(size, uint64(200+i)), payload(size/3+1, uint64(300+i))
				errc := make(chan error, 1)
				go func() {
					kc, err := l.p.B.NS.DialTCP(laddr, 10*time.Second)
					if err == nil {
						err = netlab.HashPeer(kc, reply, 60*time.Second)
					}
					errc <- err
				}()
				_ = ln.SetDeadline(time.Now().Add(10 * time.Second))
				c, err := ln.AcceptTCP()
				if err != nil {
					t.Fatalf("accept: %v", err)
				}
				if ra := c.RemoteAddr().(*net.TCPAddr).AddrPort(); ra.Addr() != fam.b {
					t.Errorf("RemoteAddr %v, want %v:N", ra, fam.b)
				}
				streamExchange(t, c, out, reply)
				if err := <-errc; err != nil {
					t.Fatalf("kernel client: %v", err)
				}
				_ = c.Close()
			}
			st := l.tcpStats()
			if d := st.ActiveOpens - st0.ActiveOpens; d != 3 {
				t.Errorf("stack opened %d connections actively, want 3", d)
			}
			if d := st.PassiveOpens - st0.PassiveOpens; d != 2 {
				t.Errorf("stack accepted %d connections, want 2", d)
			}
			if n := l.kernelOpens(t) - before; n != 0 {
				t.Errorf("the kernel of the daemon's namespace opened %d TCP connections", n)
			}
		})
	}
}

// TestTCPRefusedAndReset: a connect to a closed port fails with
// ECONNREFUSED; a peer's reset ends a read with ECONNRESET.
func TestTCPRefusedAndReset(t *testing.T) {
	netlab.RequirePriv(t)
	t.Parallel()
	l := newTCPLab(t)
	kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	closed := kl.Addr().(*net.TCPAddr).AddrPort()
	kl.Close()
	if _, err := l.c.DialTCP("tcp4", netip.AddrPort{}, closed); !errors.Is(err, unix.ECONNREFUSED) {
		t.Fatalf("dial a closed port: %v, want ECONNREFUSED", err)
	}

	kl = l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	go func() {
		c, err := kl.Accept()
		if err != nil {
			return
		}
		_ = c.(*net.TCPConn).SetLinger(0)
		buf := make([]byte, 5)
		_, _ = io.ReadFull(c, buf)
		c.Close() // RST
	}()
	c, err := l.c.DialTCP("tcp4", netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 10)); !errors.Is(err, unix.ECONNRESET) {
		t.Fatalf("read after the peer's reset: %v, want ECONNRESET", err)
	}
}

// TestTCPWriteAfterReset: a client that only writes learns of the peer's
// reset at a write, as with a kernel socket (the daemon sets its TX
// queue's consumer error), not only at its next read.
func TestTCPWriteAfterReset(t *testing.T) {
	netlab.RequirePriv(t)
	t.Parallel()
	l := newTCPLab(t)
	kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	go func() {
		c, err := kl.Accept()
		if err != nil {
			return
		}
		_ = c.(*net.TCPConn).SetLinger(0)
		c.Close() // RST
	}()
	c, err := l.c.DialTCP("tcp4", netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	chunk := make([]byte, 1024)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err = c.Write(chunk)
		if err != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !errors.Is(err, unix.ECONNRESET) {
		t.Fatalf("writes for 10 s after the peer's reset: %v, want ECONNRESET", err)
	}
	if _, err := c.Write(chunk); !errors.Is(err, unix.ECONNRESET) {
		t.Fatalf("the next write: %v, want ECONNRESET again", err)
	}
}

// daemonConfigForTCP is the daemon of the TCP tests: AF_XDP only (no
// standby TAP to set up and sweep), short spins, 256 KiB queues.
func daemonConfigForTCP() config.Config {
	return config.Config{RXPoll: 20 * time.Microsecond, EnginePoll: 20 * time.Microsecond, Frames: 4096,
		QueueBytes: 256 << 10, Fallback: "none"}
}

// childTCPHold connects to peer, says "ready" and waits to be killed.
func childTCPHold(c *Client, peer netip.AddrPort) error {
	conn, err := c.DialTCP("tcp4", netip.AddrPort{}, peer)
	if err != nil {
		return err
	}
	if _, err := conn.Write([]byte("ready")); err != nil {
		return err
	}
	_, err = conn.Read(make([]byte, 1))
	return fmt.Errorf("the connection ended before the kill: %w", err)
}

// TestTCPClientKilled: a client killed with open connections has them
// reset (the kernel peer's read fails with ECONNRESET), and the daemon
// keeps serving others.
func TestTCPClientKilled(t *testing.T) {
	netlab.RequirePriv(t)
	t.Parallel()
	l := newTCPLab(t)
	kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	cmd := childCommand(t, "tcp-hold", l.srv.SocketPath(), kl.Addr().(*net.TCPAddr).AddrPort(), l.p.A.Addr4())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	_ = kl.SetDeadline(time.Now().Add(20 * time.Second))
	kc, err := kl.Accept()
	if err != nil {
		t.Fatalf("accept the child's connection: %v", err)
	}
	defer kc.Close()
	_ = kc.SetDeadline(time.Now().Add(20 * time.Second))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(kc, buf); err != nil || string(buf) != "ready" {
		t.Fatalf("read the child's hello: %q, %v", buf, err)
	}
	resets := l.tcpStats().ResetsSent
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.Read(buf); !errors.Is(err, unix.ECONNRESET) {
		t.Fatalf("the kernel peer read %v after the client was killed, want ECONNRESET", err)
	}
	// The stack counts a reset after the frame left: the peer can see it
	// first.
	for end := time.Now().Add(5 * time.Second); l.tcpStats().ResetsSent <= resets; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Error("the stack counted no reset sent")
			break
		}
	}
	// Still serving: a new connection works.
	go func() {
		if c, err := kl.Accept(); err == nil {
			_ = netlab.HashPeer(c, []byte("after"), 60*time.Second)
		}
	}()
	c, err := l.c.DialTCP("tcp4", netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	streamExchange(t, c, []byte("x"), []byte("after"))
}

// TestTCPLoss: with 1% and 5% of the frames lost each way on the peer's
// link, transfers both ways still complete byte-exact, and the stack
// counted its retransmissions.
func TestTCPLoss(t *testing.T) {
	netlab.RequirePriv(t)
	t.Parallel()
	for _, pct := range []int{1, 5} {
		t.Run(fmt.Sprintf("%d%%", pct), func(t *testing.T) {
			t.Parallel()
			l := newTCPLab(t)
			l.p.B.Loss(t, pct)
			var errc chan error
			diag := func() {
				out, _ := l.p.B.NS.Command(context.Background(), "ss", "-tin").CombinedOutput()
				t.Logf("B: %s", out)
				t.Logf("stack: %+v", l.tcpStats())
				s, _ := l.srv.Rings()[0].TCPStack()
				t.Logf("connections: %+v", s.Connections())
				select {
				case err := <-errc:
					t.Logf("kernel side: %v", err)
				case <-time.After(time.Second):
					t.Logf("kernel side: still running")
				}
			}
			st0 := l.tcpStats()
			start := time.Now()
			kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
			// 2 MiB out is ~1,450 segments of the ring's stack: at 1% the
			// chance that none is dropped (and nothing is retransmitted)
			// is 0.99^1450, below 1e-6; 512 KiB failed that way 1 run in ~30.
			out, reply := payload(2<<20, 1), payload(min(bigTransfer(), 4<<20)/4, 2)
			errc = make(chan error, 1)
			go func() {
				c, err := kl.Accept()
				if err == nil {
					err = netlab.HashPeer(c, reply, 60*time.Second)
				}
				errc <- err
			}()
			c, err := l.c.DialTCP("tcp4", netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort())
			if err != nil {
				t.Fatalf("dial: %v", err)
			}
			defer c.Close()
			streamExchangeDiag(t, c, out, reply, diag)
			if err := <-errc; err != nil {
				t.Fatalf("kernel server: %v", err)
			}
			st := l.tcpStats()
			t.Logf("%d%% loss: %d KiB in %v, %d retransmits, %d RTO, %d fast retransmits, %d SACK and %d TLP recoveries",
				pct, (len(out)+len(reply))>>10, time.Since(start).Round(time.Millisecond), st.Retransmits-st0.Retransmits, st.Timeouts-st0.Timeouts,
				st.FastRetransmits-st0.FastRetransmits, st.SACKRecovery-st0.SACKRecovery, st.TLPRecovery-st0.TLPRecovery)
			if st.Retransmits == st0.Retransmits {
				t.Error("no retransmission counted under loss")
			}
		})
	}
}

// TestTCPMSSFromMTU: the MSS bypassd's stack advertises follows its
// interface's MTU: with A at 1280 and B at 1500, B's kernel sends segments
// of 1280 − 40 (IPv4, TCP) − 12 (timestamps) = 1228 bytes.
func TestTCPMSSFromMTU(t *testing.T) {
	netlab.RequirePriv(t)
	t.Parallel()
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	err := p.A.NS.Do(func() error {
		link, err := p.A.NS.Netlink().LinkByName(p.A.Name)
		if err != nil {
			return err
		}
		return p.A.NS.Netlink().LinkSetMTU(link, 1280)
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := daemontest.Start(t, p, daemonConfigForTCP(), nil)
	c, err := Dial(srv.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	kl := p.B.NS.ListenTCP(t, netip.AddrPortFrom(p.B.Addr4(), 0))
	mss := make(chan int, 1)
	go func() {
		kc, err := kl.Accept()
		if err != nil {
			mss <- -1
			return
		}
		defer kc.Close()
		rc, _ := kc.(*net.TCPConn).SyscallConn()
		_ = rc.Control(func(fd uintptr) {
			v, err := unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG)
			if err != nil {
				v = -1
			}
			mss <- v
		})
		_, _ = io.Copy(io.Discard, kc)
	}()
	conn, err := c.DialTCP("tcp4", netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	select {
	case got := <-mss:
		if got != 1228 {
			t.Fatalf("the kernel peer's MSS is %d, want 1228 (bypassd's interface MTU 1280)", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the kernel peer did not accept")
	}
}

// TestTCPOptions: TCP options read back as set, SO_TYPE says stream, and
// SO_LINGER {1, 0} makes Close reset the connection.
func TestTCPOptions(t *testing.T) {
	netlab.RequirePriv(t)
	t.Parallel()
	l := newTCPLab(t)
	kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	peerErr := make(chan error, 1)
	go func() {
		kc, err := kl.Accept()
		if err != nil {
			peerErr <- err
			return
		}
		defer kc.Close()
		_ = kc.SetDeadline(time.Now().Add(20 * time.Second))
		_, err = io.Copy(io.Discard, kc)
		peerErr <- err
	}()
	c, err := l.c.DialTCP("tcp4", netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetNoDelay(true); err != nil {
		t.Fatal(err)
	}
	if err := c.SetKeepAlive(true); err != nil {
		t.Fatal(err)
	}
	if err := c.SetKeepAlivePeriod(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.SetOption("TCP_KEEPCNT", 3); err != nil {
		t.Fatal(err)
	}
	if err := c.SetOption("TCP_KEEPCNT", 0); !errors.Is(err, unix.EINVAL) {
		t.Errorf("TCP_KEEPCNT 0: %v, want EINVAL", err)
	}
	if err := c.SetOption("TCP_MAXSEG", 1000); !errors.Is(err, unix.EINVAL) {
		t.Errorf("TCP_MAXSEG after connect: %v, want EINVAL", err)
	}
	for name, want := range map[string]int{"TCP_NODELAY": 1, "SO_KEEPALIVE": 1, "TCP_KEEPIDLE": 30, "TCP_KEEPINTVL": 30, "TCP_KEEPCNT": 3} {
		if v, err := c.Option(name); err != nil || v != want {
			t.Errorf("%s = %d, %v; want %d", name, v, err, want)
		}
	}
	if v, err := c.Option("TCP_MAXSEG"); err != nil || v <= 0 || v > 1460 {
		t.Errorf("TCP_MAXSEG = %d, %v; want the connection's MSS", v, err)
	}
	if _, err := c.Write([]byte("data")); err != nil {
		t.Fatal(err)
	}
	if err := c.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-peerErr; !errors.Is(err, unix.ECONNRESET) {
		t.Fatalf("the peer read %v after a close with SO_LINGER 0, want ECONNRESET", err)
	}
}
