package socket

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon"
	"github.com/bypassd/bypassd/daemon/daemontest"
	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring/tcpstack"
)

// tcpLab is a veth pair with bypassd on A; TCP peers are kernel sockets in
// B. TCP runs on the fast path only, so there is no TAP variant.
type tcpLab struct {
	p   *netlab.Pair
	srv *daemontest.Server
	c   *Client
}

func newTCPLab(t *testing.T) *tcpLab {
	t.Helper()
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	srv := daemontest.Start(t, p, daemonConfigForTCP(), nil)
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

// hashPeer serves one kernel connection: reads to EOF, answers with the
// SHA-256 of what it read and then reply, and closes.
func hashPeer(c net.Conn, reply []byte) error {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	h := sha256.New()
	if _, err := io.Copy(h, c); err != nil {
		return err
	}
	if _, err := c.Write(h.Sum(nil)); err != nil {
		return err
	}
	_, err := c.Write(reply)
	return err
}

// streamExchange writes out, half-closes and reads to EOF; it checks the
// peer's hash of out and the reply byte for byte.
func streamExchange(t *testing.T, c *TCPConn, out, reply []byte) {
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
		t.Fatalf("read: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	sum := sha256.Sum256(out)
	if len(in) < len(sum) || !bytes.Equal(in[:len(sum)], sum[:]) {
		t.Fatalf("the peer's hash of the %d bytes sent does not match (%d bytes back)", len(out), len(in))
	}
	if !bytes.Equal(in[len(sum):], reply) {
		t.Fatalf("reply: %d bytes, want %d byte-exact", len(in)-len(sum), len(reply))
	}
}

// TestTCPDialAndAccept carries TCP between a client of bypassd and the
// kernel stack in B, both ways (client connects; kernel connects to the
// client's listener), IPv4 and IPv6, 1 B to 4 MiB byte-exact with an
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
			for i, size := range []int{1, 100_000, 4 << 20} {
				out, reply := payload(size, uint64(i)), payload(size/2+1, uint64(100+i))
				kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(fam.b, 0))
				errc := make(chan error, 1)
				go func() {
					c, err := kl.Accept()
					if err == nil {
						err = hashPeer(c, reply)
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
			for i, size := range []int{1, 4 << 20} {
				out, reply := payload(size, uint64(200+i)), payload(size/3+1, uint64(300+i))
				errc := make(chan error, 1)
				go func() {
					kc, err := l.p.B.NS.DialTCP(laddr, 10*time.Second)
					if err == nil {
						err = hashPeer(kc, reply)
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

// daemonConfigForTCP is the daemon of the TCP tests: AF_XDP only (TCP
// does not use the TAP path), short spins, 256 KiB queues.
func daemonConfigForTCP() daemon.Config {
	return daemon.Config{RXPoll: 20 * time.Microsecond, EnginePoll: 20 * time.Microsecond, Frames: 4096,
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
	if l.tcpStats().ResetsSent <= resets {
		t.Error("the stack counted no reset sent")
	}
	// Still serving: a new connection works.
	go func() {
		if c, err := kl.Accept(); err == nil {
			_ = hashPeer(c, []byte("after"))
		}
	}()
	c, err := l.c.DialTCP("tcp4", netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	streamExchange(t, c, []byte("x"), []byte("after"))
}
