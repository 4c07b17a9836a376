package socket

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/stats"
)

// TestTCPConnectCloseCycles: a client that connects to one kernel server,
// sends a byte and closes, 2,000 times in a row (500 under the race
// detector), succeeds every time, as with the kernel: each connection
// leaves its port in TIME-WAIT at the daemon, and the next connect gets
// another (the kernel reservation is held through TIME-WAIT, so the
// kernel's ephemeral choice skips it). The ring's stack opened them all;
// the kernel on the client's side opened none.
func TestTCPConnectCloseCycles(t *testing.T) {
	netlab.RequirePriv(t)
	t.Parallel()
	l := newTCPLab(t)
	kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	go func() {
		for {
			c, err := kl.Accept()
			if err != nil {
				return
			}
			go func() {
				_ = c.SetDeadline(time.Now().Add(30 * time.Second))
				_, _ = io.Copy(io.Discard, c)
				_ = c.Close()
			}()
		}
	}()
	dst := kl.Addr().(*net.TCPAddr).AddrPort()
	cycles := 2000
	if raceEnabled {
		cycles = 500
	}
	before, st0 := l.kernelOpens(t), l.tcpStats()
	ports := make(map[uint16]int, cycles)
	start := time.Now()
	for i := range cycles {
		c, err := l.c.DialTCP("tcp4", netip.AddrPort{}, dst)
		if err != nil {
			t.Fatalf("cycle %d of %d: %v", i, cycles, err)
		}
		p := c.LocalAddr().(*net.TCPAddr).AddrPort().Port()
		if j, dup := ports[p]; dup {
			t.Errorf("cycle %d got port %d of cycle %d (in TIME-WAIT)", i, p, j)
		}
		ports[p] = i
		if _, err := c.Write([]byte{byte(i)}); err != nil {
			t.Fatalf("cycle %d: write: %v", i, err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("cycle %d: close: %v", i, err)
		}
	}
	t.Logf("%d connect/write/close cycles in %v", cycles, time.Since(start).Round(time.Millisecond))
	if d := l.tcpStats().ActiveOpens - st0.ActiveOpens; d != uint64(cycles) {
		t.Errorf("the ring's stack opened %d connections, want %d", d, cycles)
	}
	if n := l.kernelOpens(t) - before; n != 0 {
		t.Errorf("the kernel of the daemon's namespace opened %d TCP connections", n)
	}
}

// openFDs counts this process's open descriptors (the daemon and its
// clients share the test process).
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// checkReleased waits until the ring holds nothing for TCP any more (no
// connection in its stack, no port reservation, no TCP flow steered) and
// the client's session no socket or queue memory, and the process has no
// more descriptors than fds.
func (l *tcpLab) checkReleased(t *testing.T, fds int) {
	t.Helper()
	r := l.srv.Rings()[0]
	tcpFlows := func() int {
		n, err := r.TCPFlows()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	path := stats.ClientPath(l.srv.Config.StatsDir, os.Getpid())
	var snap *stats.Snapshot
	state := func() string {
		return fmt.Sprintf("connections %+v, %d port reservations, %d TCP flows, client %+v, %d descriptors (%d before)",
			r.TCPConnections(), r.TCPPorts(), tcpFlows(), snap, openFDs(t), fds)
	}
	for end := time.Now().Add(15 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var err error
		snap, err = stats.ReadFile(path)
		if err == nil && len(r.TCPConnections()) == 0 && r.TCPPorts() == 0 && tcpFlows() == 0 &&
			snap.Client.Sockets == 0 && snap.Client.QueueMemory == 0 && openFDs(t) <= fds {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("not released after 15 s: %s", state())
		}
	}
}

// TestTCPPeerVanishes: the kernel peer vanishes in the middle of a
// connection (every frame to and from it dropped on its link): with
// keepalive (idle 1 s, 1 s between probes, 2 probes) an idle reader's
// Read fails with ETIMEDOUT after about 3 s; with TCP_USER_TIMEOUT
// 1,500 ms a connection in the middle of a transfer fails with ETIMEDOUT
// after about that. Afterwards the daemon holds nothing of it: no
// connection, port reservation, flow, socket, queue memory or descriptor.
// The ring carried the bytes before; A's kernel opened no connection.
func TestTCPPeerVanishes(t *testing.T) {
	netlab.RequirePriv(t)
	t.Parallel()
	for _, tc := range []struct {
		name     string
		set      func(c *TCPConn) error
		transfer bool // vanish while the client writes, not while idle
		min, max time.Duration
	}{
		{"keepalive", func(c *TCPConn) error {
			if err := c.SetKeepAlive(true); err != nil {
				return err
			}
			if err := c.SetKeepAlivePeriod(time.Second); err != nil {
				return err
			}
			return c.SetOption("TCP_KEEPCNT", 2)
		}, false, 2 * time.Second, 15 * time.Second},
		{"user-timeout", func(c *TCPConn) error { return c.SetOption("TCP_USER_TIMEOUT", 1500) }, true, time.Second, 15 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := newTCPLab(t)
			kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
			fds := openFDs(t)
			before, rx0 := l.kernelOpens(t), l.srv.Rings()[0].Stats().TCPRXPackets.Load()
			hello := payload(100_000, 7)
			received := make(chan int, 1)
			peer := make(chan net.Conn, 1)
			go func() {
				kc, err := kl.Accept()
				if err != nil {
					received <- -1
					return
				}
				peer <- kc
				_ = kc.SetDeadline(time.Now().Add(60 * time.Second))
				if _, err := kc.Write(hello); err != nil {
					received <- -1
					return
				}
				n, _ := io.Copy(io.Discard, kc)
				received <- int(n)
			}()
			c, err := l.c.DialTCP("tcp4", netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := tc.set(c); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
			got := make([]byte, len(hello))
			if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, hello) {
				t.Fatalf("read the peer's hello: %v", err)
			}
			writeDone := make(chan error, 1)
			if tc.transfer {
				// Write until the connection fails: the peer reads what
				// arrives until it vanishes.
				go func() {
					buf := payload(64<<10, 8)
					for {
						if _, err := c.Write(buf); err != nil {
							writeDone <- err
							return
						}
					}
				}()
				time.Sleep(200 * time.Millisecond)
			}
			vanished := time.Now()
			restore := l.p.B.Blackhole(t)
			_, err = c.Read(make([]byte, 1))
			took := time.Since(vanished)
			t.Logf("read after the peer vanished: %v after %v", err, took.Round(time.Millisecond))
			if !errors.Is(err, unix.ETIMEDOUT) {
				t.Fatalf("read after the peer vanished: %v, want ETIMEDOUT", err)
			}
			if took < tc.min || took > tc.max {
				t.Errorf("the connection timed out after %v, want %v..%v", took, tc.min, tc.max)
			}
			_ = c.Close()
			if tc.transfer {
				select {
				case err := <-writeDone:
					t.Logf("the writer ended with %v", err)
				case <-time.After(10 * time.Second):
					t.Fatal("a Write still blocks 10 s after the connection failed and was closed")
				}
			}
			restore()
			// The vanished host's socket is no business of the daemon's.
			select {
			case kc := <-peer:
				_ = kc.Close()
			case <-time.After(10 * time.Second):
				t.Fatal("the kernel peer never accepted")
			}
			if n := l.kernelOpens(t) - before; n != 0 {
				t.Errorf("the kernel of the daemon's namespace opened %d TCP connections", n)
			}
			if rx := l.srv.Rings()[0].Stats().TCPRXPackets.Load() - rx0; rx < uint64(len(hello)/1500) {
				t.Errorf("the ring received %d TCP frames, fewer than the peer's %d bytes need", rx, len(hello))
			}
			t0 := time.Now()
			l.checkReleased(t, fds)
			t.Logf("released after %v", time.Since(t0).Round(time.Millisecond))
			kl.Close()
			if n := <-received; tc.transfer && n <= 0 {
				t.Errorf("the peer received %d bytes before it vanished", n)
			}
		})
	}
}

// connDoc returns the connections topic's line of the connection from
// local to remote.
func (l *tcpLab) connDoc(t *testing.T, local, remote net.Addr) ctldoc.ConnectionDoc {
	t.Helper()
	a, err := ctlproto.DialAdmin(l.srv.SocketPath(), "test")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var doc ctldoc.ConnectionsDoc
	if err := a.Query(ctldoc.TopicConnections, &doc); err != nil {
		t.Fatal(err)
	}
	for _, c := range doc.Connections {
		if c.Local == local.String() && c.Remote == remote.String() {
			return c
		}
	}
	t.Fatalf("no connection %v -> %v in %+v", local, remote, doc.Connections)
	return ctldoc.ConnectionDoc{}
}

// idleCost is what the daemon did for a connection over a while: engine
// wake-ups, TCP frames each way, the connection's pump wake-ups.
type idleCost struct{ wakeups, rx, tx, pump uint64 }

func (l *tcpLab) cost(t *testing.T, c *TCPConn) idleCost {
	st := l.srv.Rings()[0].Stats()
	d := l.connDoc(t, c.LocalAddr(), c.RemoteAddr())
	return idleCost{st.Wakeups.Load(), st.TCPRXPackets.Load(), st.TCPTXPackets.Load(), d.PumpWakeups}
}

// writeCounted writes b to w in 64 KiB pieces, counting what was taken.
func writeCounted(w io.Writer, b []byte, written *atomic.Int64) error {
	for off := 0; off < len(b); off += 64 << 10 {
		n, err := w.Write(b[off:min(off+64<<10, len(b))])
		written.Add(int64(n))
		if err != nil {
			return err
		}
	}
	return nil
}

// waitStalled waits until a writer's count stopped moving for a second
// (the buffers on the way are full and the window closed; on a loaded
// machine a goroutine can stall for a few hundred ms on its own) and
// returns it.
func waitStalled(t *testing.T, written *atomic.Int64, size int64) int64 {
	t.Helper()
	var w0 int64
	stable := 0
	for end := time.Now().Add(30 * time.Second); stable < 5; time.Sleep(200 * time.Millisecond) {
		w := written.Load()
		if w == w0 && w > 0 {
			stable++
		} else {
			stable = 0
		}
		w0 = w
		if time.Now().After(end) || w == size {
			t.Fatalf("the writer never stopped: %d of %d bytes written", w, size)
		}
	}
	return w0
}

// TestTCPZeroWindow: a window of 0 held for 5 s, either way, then opened.
// Our client writes 8 MiB (2 under the race detector) to a kernel peer that does not read (SO_RCVBUF
// 4 KiB): the client's writer stops (the window closes all the way back
// to its queue), and while it is held the daemon sends only window probes
// and wakes its engine and the connection's pump a bounded number of
// times (no spinning); when the peer reads, all of it arrives byte-exact.
// The other way, a kernel peer writes as much to our client that does not
// read: the kernel's writer stops, the daemon answers its probes, and
// when the client reads, all of it arrives byte-exact.
func TestTCPZeroWindow(t *testing.T) {
	netlab.RequirePriv(t)
	t.Parallel()
	// More than every buffer on the way holds (client queue, the
	// stacks' buffers): 2 MiB under the race detector, which is slow to
	// copy 8.
	size := 8 << 20
	if raceEnabled {
		size = 2 << 20
	}
	const hold = 5 * time.Second
	// Bounds of what 5 s of a held window may cost: probes back off
	// from the RTO (a few per second at most), wake-ups follow them.
	check := func(t *testing.T, what string, d idleCost) {
		t.Logf("%s, over %v: %d engine wake-ups, %d TCP frames in, %d out, %d pump wake-ups", what, hold, d.wakeups, d.rx, d.tx, d.pump)
		if d.wakeups > 1000 || d.rx > 200 || d.tx > 200 || d.pump > 200 {
			t.Errorf("%s: the daemon did not stay idle: %+v", what, d)
		}
	}
	sub := func(a, b idleCost) idleCost {
		return idleCost{b.wakeups - a.wakeups, b.rx - a.rx, b.tx - a.tx, b.pump - a.pump}
	}

	t.Run("peer-not-reading", func(t *testing.T) {
		t.Parallel()
		l := newTCPLab(t)
		var kl net.Listener
		if err := l.p.B.NS.Do(func() error {
			lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 4096) })
				return errors.Join(err, serr)
			}}
			var err error
			kl, err = lc.Listen(context.Background(), "tcp4", netip.AddrPortFrom(l.p.B.Addr4(), 0).String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer kl.Close()
		accepted := make(chan net.Conn, 1)
		go func() {
			kc, err := kl.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- kc
		}()
		c, err := l.c.DialTCP("tcp4", netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		kc, ok := <-accepted
		if !ok {
			t.Fatal("the kernel peer did not accept")
		}
		out := payload(size, 31)
		var written atomic.Int64
		writeErr := make(chan error, 1)
		go func() {
			_ = c.SetWriteDeadline(time.Now().Add(60 * time.Second))
			if err := writeCounted(c, out, &written); err != nil {
				writeErr <- err
				return
			}
			writeErr <- c.CloseWrite()
		}()
		// The window closes once the buffers on the way are full.
		w0 := waitStalled(t, &written, int64(size))
		c0 := l.cost(t, c)
		time.Sleep(hold)
		check(t, "zero window at the peer", sub(c0, l.cost(t, c)))
		if w := written.Load(); w != w0 {
			t.Errorf("the writer went on from %d to %d bytes while the window was closed", w0, w)
		}
		t.Logf("held with %d of %d bytes written, %d queued in the stack", w0, size, l.connDoc(t, c.LocalAddr(), c.RemoteAddr()).SendQueued)
		// The peer reads again: everything arrives.
		peerErr := make(chan error, 1)
		go func() { peerErr <- netlab.HashPeer(kc, nil, 60*time.Second) }()
		if err := <-writeErr; err != nil {
			t.Fatalf("write: %v", err)
		}
		_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
		got, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("read the peer's hash: %v", err)
		}
		if err := netlab.CheckHashReply(out, got, nil); err != nil {
			t.Fatal(err)
		}
		if err := <-peerErr; err != nil {
			t.Fatalf("kernel peer: %v", err)
		}
	})

	t.Run("client-not-reading", func(t *testing.T) {
		t.Parallel()
		l := newTCPLab(t)
		kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
		in := payload(size, 32)
		var written atomic.Int64
		peerErr := make(chan error, 1)
		go func() {
			kc, err := kl.Accept()
			if err != nil {
				peerErr <- err
				return
			}
			defer kc.Close()
			_ = kc.SetDeadline(time.Now().Add(60 * time.Second))
			peerErr <- writeCounted(kc, in, &written)
		}()
		c, err := l.c.DialTCP("tcp4", netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		w0 := waitStalled(t, &written, int64(size))
		c0 := l.cost(t, c)
		time.Sleep(hold)
		check(t, "zero window at the client", sub(c0, l.cost(t, c)))
		if w := written.Load(); w != w0 {
			t.Errorf("the kernel's writer went on from %d to %d bytes while our window was closed", w0, w)
		}
		t.Logf("held with %d of %d bytes written by the peer, %d queued in the stack", w0, size, l.connDoc(t, c.LocalAddr(), c.RemoteAddr()).RecvQueued)
		_ = c.SetReadDeadline(time.Now().Add(60 * time.Second))
		got := make([]byte, size)
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatalf("read: %v", err)
		}
		if !bytes.Equal(got, in) {
			t.Fatalf("the %d bytes arrived, but not byte-exact", size)
		}
		if err := <-peerErr; err != nil {
			t.Fatalf("kernel peer: %v", err)
		}
	})
}
