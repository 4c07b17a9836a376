package ring_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
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
// both directions and an orderly close, on the fast path and on the TAP
// path; the ring's counters carry it and the kernel on the ring's side
// opened no connection.
func TestTCPWithKernelPeer(t *testing.T) {
	netlab.RequirePriv(t)
	for _, c := range []struct {
		name string
		cfg  ring.Config
	}{{"afxdp", ring.Config{}}, {"tap", ring.Config{Fallback: ring.FallbackTAP}}} {
		t.Run(c.name, func(t *testing.T) {
			l := newLab(t, c.cfg)
			tap0 := l.r.FallbackStats().RXPackets
			tcpWithKernelPeer(t, l)
			if c.cfg.Fallback == ring.FallbackTAP && l.r.FallbackStats().RXPackets-tap0 < 1000 {
				t.Errorf("the TAP received %d frames, fewer than the TCP data needs", l.r.FallbackStats().RXPackets-tap0)
			}
		})
	}
}

func tcpWithKernelPeer(t *testing.T, l *lab) {
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

// TestTCPPlugOut: a connection in the middle of a transfer survives the
// loss of the fast path (the XDP link detached, as a VF unplug takes it):
// its frames move to the TAP path and the transfer completes byte-exact
// both ways.
func TestTCPPlugOut(t *testing.T) {
	netlab.RequirePriv(t)
	if _, err := exec.LookPath("bpftool"); err != nil {
		if os.Getenv("BYPASSD_REQUIRE_PRIV") == "1" {
			t.Fatal("bpftool is needed to detach the XDP link (apt-get install bpftool)")
		}
		t.Skip("bpftool is needed to detach the XDP link")
	}
	l := newLab(t, ring.Config{Fallback: ring.FallbackAuto})
	kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	reply := payload(3, 2<<20)
	errc := make(chan error, 1)
	go func() {
		c, err := kl.Accept()
		if err == nil {
			err = netlab.HashPeer(c, reply, 60*time.Second)
		}
		errc <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := l.r.DialTCP(ctx, netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	nc := c.NetConn()
	_ = nc.SetDeadline(time.Now().Add(60 * time.Second))
	sent := payload(4, 4<<20)
	half := len(sent) / 2
	if _, err := nc.Write(sent[:half]); err != nil {
		t.Fatalf("write before the plug-out: %v", err)
	}
	fb0, rx0 := l.r.FallbackStats(), l.r.Stats().TCPRXPackets.Load()
	id, err := l.r.Program().LinkID()
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.CommandContext(ctx, "bpftool", "link", "detach", "id", fmt.Sprint(id)).CombinedOutput(); err != nil {
		t.Fatalf("bpftool link detach id %d: %v: %s", id, err, out)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !l.r.FallbackStats().OnTAP {
		if time.Now().After(deadline) {
			t.Fatalf("no switch to the TAP path within 10 s: %+v", l.r.FallbackStats())
		}
		time.Sleep(time.Millisecond)
	}
	got := exchange(t, nc, sent[half:])
	if err := <-errc; err != nil {
		t.Fatalf("kernel server: %v", err)
	}
	checkAnswer(t, sent, got, reply)
	fb := l.r.FallbackStats()
	if fb.Plugouts != fb0.Plugouts+1 || !fb.OnTAP {
		t.Errorf("fallback: %+v, want one plug-out and the TAP path", fb)
	}
	// The reply (2 MiB) came in through the TAP, to the same stack.
	if tapRX, tcpRX := fb.RXPackets-fb0.RXPackets, l.r.Stats().TCPRXPackets.Load()-rx0; tapRX < uint64(len(reply)/1500) || tcpRX < uint64(len(reply)/1500) {
		t.Errorf("after the plug-out: %d frames from the TAP, %d TCP frames to the stack; the reply needs %d", tapRX, tcpRX, len(reply)/1500)
	}
	t.Logf("TCP stack: %+v", l.r.TCPStats())
}
