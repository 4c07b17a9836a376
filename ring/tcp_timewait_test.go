package ring_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring"
)

// kernelBind binds a kernel TCP socket to addr in ns (SO_REUSEADDR when
// reuse) and closes it: how a program other than bypassd finds the port.
func kernelBind(ns *netlab.NS, addr netip.AddrPort, reuse bool) error {
	return ns.Do(func() error {
		s, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(s)
		if reuse {
			if err := unix.SetsockoptInt(s, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
				return err
			}
		}
		return unix.Bind(s, &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()})
	})
}

// waitFor polls cond for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			return false
		}
	}
	return true
}

// tcpFlows counts the TCP flows steered to the ring.
func tcpFlows(t *testing.T, r *ring.Ring) int {
	t.Helper()
	n, err := r.TCPFlows()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTCPTimeWaitHoldsPort: a connection the ring's stack closed first
// waits in TIME-WAIT and keeps its port reserved in the kernel meanwhile
// (a kernel bind of it fails, so the kernel never hands it to the next
// connect: 300 connect/close cycles in a row all get a port of their
// own), and gives it back when TIME-WAIT ends, with its flow.
func TestTCPTimeWaitHoldsPort(t *testing.T) {
	netlab.RequirePriv(t)
	l := newLab(t, ring.Config{TCPTimeWait: 3 * time.Second})
	kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	go func() {
		for {
			c, err := kl.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); _ = c.Close() }()
		}
	}()
	dst := kl.Addr().(*net.TCPAddr).AddrPort()
	const cycles = 300
	ports := map[uint16]int{}
	var first netip.AddrPort
	for i := range cycles {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := l.r.DialTCP(ctx, netip.AddrPort{}, dst)
		cancel()
		if err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		if _, err := c.NetConn().Write([]byte{byte(i)}); err != nil {
			t.Fatalf("cycle %d: write: %v", i, err)
		}
		p := c.LocalAddr().Port()
		if j, dup := ports[p]; dup {
			t.Errorf("cycle %d got port %d of cycle %d, still in TIME-WAIT", i, p, j)
		}
		ports[p] = i
		if i == 0 {
			first = c.LocalAddr()
		}
		_ = c.Close()
	}
	// Closed ones move to TIME-WAIT as the kernel's FIN comes back.
	inTimeWait := func() int {
		n := 0
		for _, ci := range l.r.TCPConnections() {
			if ci.State == "TIME-WAIT" {
				n++
			}
		}
		return n
	}
	if !waitFor(3*time.Second, func() bool { return inTimeWait() > 0 }) {
		t.Fatalf("no connection in TIME-WAIT: %+v", l.r.TCPConnections())
	}
	if n := l.r.TCPPorts(); n == 0 {
		t.Fatal("no port reserved while connections wait in TIME-WAIT")
	}
	// The first connection's port is still held if its TIME-WAIT is.
	for _, ci := range l.r.TCPConnections() {
		if ci.Local == first && ci.State == "TIME-WAIT" {
			if err := kernelBind(l.p.A.NS, netip.AddrPortFrom(netip.IPv4Unspecified(), first.Port()), false); !errors.Is(err, unix.EADDRINUSE) {
				t.Errorf("kernel bind of port %d in TIME-WAIT: %v, want EADDRINUSE", first.Port(), err)
			}
		}
	}
	if !waitFor(20*time.Second, func() bool { return l.r.TCPPorts() == 0 && len(l.r.TCPConnections()) == 0 }) {
		t.Fatalf("TIME-WAIT over, %d ports still reserved, connections %+v", l.r.TCPPorts(), l.r.TCPConnections())
	}
	if !waitFor(5*time.Second, func() bool { return tcpFlows(t, l.r) == 0 }) {
		t.Errorf("%d TCP flows still steered", tcpFlows(t, l.r))
	}
	if err := kernelBind(l.p.A.NS, netip.AddrPortFrom(netip.IPv4Unspecified(), first.Port()), false); err != nil {
		t.Errorf("kernel bind of port %d after TIME-WAIT: %v", first.Port(), err)
	}
}

// TestTCPTimeWaitReuseAddr: a server that closed its connections first
// (they wait in TIME-WAIT on its port) and restarts binds the port again
// with SO_REUSEADDR, if it had set it, as on Linux; without it the bind
// fails with EADDRINUSE, and so does a kernel socket's.
func TestTCPTimeWaitReuseAddr(t *testing.T) {
	netlab.RequirePriv(t)
	l := newLab(t, ring.Config{})
	addr := netip.AddrPortFrom(l.p.A.Addr4(), 0)
	b, err := l.r.BindTCP(addr, true)
	if err != nil {
		t.Fatal(err)
	}
	addr = b.LocalAddr()
	rl, err := b.Listen(0)
	if err != nil {
		t.Fatal(err)
	}
	peerDone := make(chan error, 1)
	go func() {
		kc, err := l.p.B.NS.DialTCP(addr, 5*time.Second)
		if err == nil {
			_ = kc.SetDeadline(time.Now().Add(20 * time.Second))
			_, err = io.Copy(io.Discard, kc)
			_ = kc.Close()
		}
		peerDone <- err
	}()
	sc, err := rl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	_ = sc.Close() // the server closes first: its side waits in TIME-WAIT
	if err := <-peerDone; err != nil {
		t.Fatalf("kernel client: %v", err)
	}
	_ = rl.Close()
	if !waitFor(5*time.Second, func() bool {
		cs := l.r.TCPConnections()
		return len(cs) == 1 && cs[0].State == "TIME-WAIT"
	}) {
		t.Fatalf("want the accepted connection in TIME-WAIT, have %+v", l.r.TCPConnections())
	}
	if _, err := l.r.BindTCP(addr, false); !errors.Is(err, unix.EADDRINUSE) {
		t.Errorf("bind without SO_REUSEADDR over TIME-WAIT: %v, want EADDRINUSE", err)
	}
	if err := kernelBind(l.p.A.NS, addr, false); !errors.Is(err, unix.EADDRINUSE) {
		t.Errorf("kernel bind without SO_REUSEADDR over TIME-WAIT: %v, want EADDRINUSE", err)
	}
	b, err = l.r.BindTCP(addr, true)
	if err != nil {
		t.Fatalf("bind with SO_REUSEADDR over TIME-WAIT: %v", err)
	}
	rl, err = b.Listen(0)
	if err != nil {
		t.Fatalf("listen again: %v", err)
	}
	defer rl.Close()
	// The new listener's port is exclusive again.
	if err := kernelBind(l.p.A.NS, addr, true); !errors.Is(err, unix.EADDRINUSE) {
		t.Errorf("kernel bind with SO_REUSEADDR beside a live listener: %v, want EADDRINUSE", err)
	}
	go func() {
		kc, err := l.p.B.NS.DialTCP(addr, 5*time.Second)
		if err == nil {
			err = netlab.HashPeer(kc, []byte("again"), 20*time.Second)
		}
		peerDone <- err
	}()
	sc, err = rl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	sent := []byte("restarted")
	checkAnswer(t, sent, exchange(t, sc, sent), []byte("again"))
	_ = sc.Close()
	if err := <-peerDone; err != nil {
		t.Fatalf("kernel client: %v", err)
	}
}

// TestTCPTimeWaitRingClose: closing the ring ends the TIME-WAIT of its
// connections (the stack aborts them) and gives their ports back at once.
func TestTCPTimeWaitRingClose(t *testing.T) {
	netlab.RequirePriv(t)
	l := newLab(t, ring.Config{})
	kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	go func() {
		if c, err := kl.Accept(); err == nil {
			_, _ = io.Copy(io.Discard, c)
			_ = c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := l.r.DialTCP(ctx, netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	port := c.LocalAddr().Port()
	_ = c.Close()
	if !waitFor(5*time.Second, func() bool {
		cs := l.r.TCPConnections()
		return len(cs) == 1 && cs[0].State == "TIME-WAIT"
	}) {
		t.Fatalf("want the connection in TIME-WAIT, have %+v", l.r.TCPConnections())
	}
	if l.r.TCPPorts() != 1 {
		t.Fatalf("%d port reservations in TIME-WAIT, want 1", l.r.TCPPorts())
	}
	if err := l.r.Close(); err != nil {
		t.Fatal(err)
	}
	if !waitFor(2*time.Second, func() bool { return l.r.TCPPorts() == 0 }) {
		t.Fatalf("%d port reservations left after the ring closed", l.r.TCPPorts())
	}
	if err := kernelBind(l.p.A.NS, netip.AddrPortFrom(netip.IPv4Unspecified(), port), false); err != nil {
		t.Errorf("kernel bind of port %d after the ring closed: %v", port, err)
	}
}
