package socket

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestE2EInterfaceRecreated: with the TAP fallback (the daemon's default),
// the accelerated interface is deleted under an open socket: a blocked Read
// and every later call fail with ENETDOWN saying to open a new socket, new
// sockets are refused with ENETDOWN while the interface is gone, the daemon
// keeps serving, and once the interface is created again new sockets work
// end to end, with nothing of the old ring left behind.
func TestE2EInterfaceRecreated(t *testing.T) {
	t.Parallel()
	l := newLab(t, "afxdp")
	c := l.client(t)
	u, err := c.ListenUDP("udp4", netip.AddrPortFrom(l.p.A.Addr4(), 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := echoRound(u, l.echo4, []byte("before"), make([]byte, 64)); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		_, _, err := u.ReadFrom(make([]byte, 64))
		got <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sh := func(ns string, args ...string) {
		t.Helper()
		cmd := l.p.A.NS.Command(ctx, "ip", append([]string{"-n", ns}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("ip -n %s %v: %v: %s", ns, args, err, out)
		}
	}
	a, b := l.p.A, l.p.B
	sh(a.NS.Name, "link", "del", a.Name)

	var rerr error
	select {
	case rerr = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("blocked Read not released 10 s after the interface vanished")
	}
	if !errors.Is(rerr, unix.ENETDOWN) || !errors.Is(rerr, net.ErrClosed) || !strings.Contains(rerr.Error(), "interface went away") {
		t.Fatalf("Read after the interface vanished: %v; want ENETDOWN saying the interface went away", rerr)
	}
	if _, err := u.WriteTo([]byte("x"), net.UDPAddrFromAddrPort(l.echo4)); !errors.Is(err, unix.ENETDOWN) {
		t.Errorf("Write on the dropped socket: %v", err)
	}
	if err := u.Close(); err != nil {
		t.Errorf("Close of the dropped socket: %v", err)
	}
	if _, err := c.ListenUDP("udp4", netip.AddrPortFrom(a.Addr4(), 0)); !errors.Is(err, unix.ENETDOWN) {
		t.Errorf("a new socket while the interface is gone: %v, want ENETDOWN", err)
	}

	// The interface comes back: same names and addresses, a new ifindex.
	sh(a.NS.Name, "link", "add", a.Name, "type", "veth", "peer", "name", b.Name, "netns", b.NS.Name)
	sh(a.NS.Name, "addr", "add", a.IPv4.String(), "dev", a.Name)
	sh(a.NS.Name, "addr", "add", a.IPv6.String(), "dev", a.Name, "nodad")
	sh(b.NS.Name, "addr", "add", b.IPv4.String(), "dev", b.Name)
	sh(b.NS.Name, "addr", "add", b.IPv6.String(), "dev", b.Name, "nodad")
	for _, x := range []struct{ ns, dev string }{{a.NS.Name, a.Name}, {b.NS.Name, b.Name}} {
		sh(x.ns, "link", "set", x.dev, "up")
		// Complete checksums, as the lab sets up (see netlab.Options).
		if out, err := l.p.A.NS.Command(ctx, "ip", "netns", "exec", x.ns, "ethtool", "-K", x.dev, "tx", "off").CombinedOutput(); err != nil {
			t.Fatalf("ethtool -K %s tx off: %v: %s", x.dev, err, out)
		}
	}
	var u2 *UDPConn
	deadline := time.Now().Add(20 * time.Second)
	for {
		u2, err = c.ListenUDP("udp4", netip.AddrPortFrom(a.Addr4(), 0))
		if err == nil {
			break
		}
		if !errors.Is(err, unix.ENETDOWN) || time.Now().After(deadline) {
			t.Fatalf("a new socket after the interface came back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	defer u2.Close()
	buf := make([]byte, 64)
	echoed := false
	for i := 0; i < 100 && !echoed; i++ { // the first datagrams wait for ARP
		if _, err := u2.WriteToUDPAddrPort([]byte("after"), l.echo4); err != nil {
			t.Fatal(err)
		}
		_ = u2.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		n, from, err := u2.ReadFromUDPAddrPort(buf)
		echoed = err == nil && from == l.echo4 && string(buf[:n]) == "after"
	}
	if !echoed {
		t.Fatal("no echo through the reopened ring within 20 s")
	}
	// One TAP: the old ring's went with it.
	out, err := l.p.A.NS.Command(ctx, "ip", "-o", "link", "show").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(out), ": bpt"); n != 1 {
		t.Errorf("%d TAP devices after the interface came back, want 1:\n%s", n, out)
	}
}
