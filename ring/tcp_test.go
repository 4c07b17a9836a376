package ring_test

import (
	"context"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring"
)

// exchange sends out on c, half-closes, and reads everything the peer sends
// back until EOF.
func exchange(t *testing.T, c net.Conn, out []byte) []byte {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(out)
		if err == nil {
			err = c.(interface{ CloseWrite() error }).CloseWrite()
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
	return in
}

// checkAnswer checks a HashPeer's answer to sent.
func checkAnswer(t *testing.T, sent, got, reply []byte) {
	t.Helper()
	if err := netlab.CheckHashReply(sent, got, reply); err != nil {
		t.Fatal(err)
	}
}

// TestTCPWithKernelPeer runs a connection each way between the ring's TCP
// stack and kernel TCP in the peer namespace, IPv4 and IPv6, with data in
// both directions and an orderly close; the ring's counters carry it and
// the kernel on the ring's side opened no connection.
func TestTCPWithKernelPeer(t *testing.T) {
	netlab.RequirePriv(t)
	l := newLab(t, ring.Config{})
	p := l.p
	for _, v6 := range []bool{false, true} {
		aAddr, bAddr := p.A.Addr4(), p.B.Addr4()
		if v6 {
			aAddr, bAddr = p.A.Addr6(), p.B.Addr6()
		}
		kernelOpens := func() uint64 { return p.A.NS.TCPStat(t, "ActiveOpens") + p.A.NS.TCPStat(t, "PassiveOpens") }
		before, rx0 := kernelOpens(), l.r.Stats().TCPRXPackets.Load()
		tcp0 := l.r.TCPStats()

		// Ring connects to a kernel listener.
		kl := p.B.NS.ListenTCP(t, netip.AddrPortFrom(bAddr, 0))
		reply := payload(1, 300_000)
		errc := make(chan error, 1)
		go func() {
			c, err := kl.Accept()
			if err == nil {
				err = netlab.HashPeer(c, reply, 30*time.Second)
			}
			errc <- err
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := l.r.DialTCP(ctx, netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort())
		cancel()
		if err != nil {
			t.Fatalf("v6=%v: dial: %v", v6, err)
		}
		sent := payload(2, 1_000_000)
		got := exchange(t, c.NetConn(), sent)
		if err := <-errc; err != nil {
			t.Fatalf("v6=%v: kernel server: %v", v6, err)
		}
		checkAnswer(t, sent, got, reply)
		_ = c.Close()

		// A kernel client connects to the ring's listener.
		rl, err := l.r.ListenTCP(netip.AddrPortFrom(aAddr, 0), 0)
		if err != nil {
			t.Fatalf("v6=%v: listen: %v", v6, err)
		}
		go func() {
			kc, err := p.B.NS.DialTCP(rl.LocalAddr(), 5*time.Second)
			if err == nil {
				err = netlab.HashPeer(kc, reply, 30*time.Second)
			}
			errc <- err
		}()
		sc, err := rl.Accept()
		if err != nil {
			t.Fatalf("v6=%v: accept: %v", v6, err)
		}
		got = exchange(t, sc, sent)
		if err := <-errc; err != nil {
			t.Fatalf("v6=%v: kernel client: %v", v6, err)
		}
		checkAnswer(t, sent, got, reply)
		_ = sc.Close()
		_ = rl.Close()

		st := l.r.TCPStats()
		if st.ActiveOpens-tcp0.ActiveOpens != 1 || st.PassiveOpens-tcp0.PassiveOpens != 1 {
			t.Errorf("v6=%v: stack opened %d active / %d passive connections, want 1 / 1", v6,
				st.ActiveOpens-tcp0.ActiveOpens, st.PassiveOpens-tcp0.PassiveOpens)
		}
		if rx := l.r.Stats().TCPRXPackets.Load() - rx0; rx < uint64(2*len(reply)/1500) {
			t.Errorf("v6=%v: ring received %d TCP frames, fewer than the data needs", v6, rx)
		}
		if n := kernelOpens() - before; n != 0 {
			t.Errorf("v6=%v: the kernel of the ring's namespace opened %d TCP connections", v6, n)
		}
	}
}
