package socket

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/bypassd/bypassd/daemon/daemontest"
	"github.com/bypassd/bypassd/internal/netlab"
)

// manyConns is the "1,000 concurrent connections".
const manyConns = 1000

// TestTCPThousandConnections holds 1,000 connections open at once through
// one ring, both ways (the client dials a kernel server; kernel clients
// dial the client's listener), then moves distinct bytes over every one:
// each must arrive byte-exact on its own connection. The ring's stack
// counts them all established at once; the kernel of A's namespace opens
// none; when they are closed the stack holds none.
func TestTCPThousandConnections(t *testing.T) {
	if raceEnabled {
		t.Skip("1,000 connections under the race detector take minutes: make test runs this test in a build without it")
	}
	netlab.RequirePriv(t)
	t.Parallel()
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	cfg := daemonConfigForTCP()
	// 1,000 connections at 256 KiB would be 512 MiB of queues: small
	// queues keep the test's memory where the budgets are.
	cfg.QueueBytes = 16 << 10
	srv := daemontest.Start(t, p, cfg, nil)
	c, err := Dial(srv.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	l := &tcpLab{p: p, srv: srv, c: c}
	before := l.kernelOpens(t)

	t.Run("dial", func(t *testing.T) {
		st0 := l.tcpStats()
		kl := p.B.NS.ListenTCP(t, netip.AddrPortFrom(p.B.Addr4(), 0))
		raddr := kl.Addr().(*net.TCPAddr).AddrPort()
		// The kernel side hashes whatever each connection carries and
		// answers with a reply chosen by the first 8 bytes (the index).
		srvErr := make(chan error, manyConns)
		go func() {
			for i := 0; i < manyConns; i++ {
				kc, err := kl.Accept()
				if err != nil {
					srvErr <- err
					return
				}
				go func() { srvErr <- indexedHashPeer(kc) }()
			}
		}()
		conns := make([]*TCPConn, manyConns)
		dialAll(t, func(i int) error {
			var err error
			conns[i], err = c.DialTCP("tcp4", netip.AddrPort{}, raddr)
			return err
		})
		if est := l.tcpStats().Established - st0.Established; est < manyConns {
			t.Errorf("%d connections established at once in the ring's stack, want %d", est, manyConns)
		}
		exchangeAll(t, conns)
		for i := 0; i < manyConns; i++ {
			if err := <-srvErr; err != nil {
				t.Fatalf("kernel server: %v", err)
			}
		}
		if d := l.tcpStats().ActiveOpens - st0.ActiveOpens; d != manyConns {
			t.Errorf("stack opened %d connections actively, want %d", d, manyConns)
		}
	})

	t.Run("accept", func(t *testing.T) {
		st0 := l.tcpStats()
		ln, err := c.ListenTCP("tcp4", netip.AddrPortFrom(p.A.Addr4(), 0))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		laddr := ln.Addr().(*net.TCPAddr).AddrPort()
		kernErr := make(chan error, manyConns)
		for i := 0; i < manyConns; i++ {
			go func() {
				kc, err := p.B.NS.DialTCP(laddr, 60*time.Second)
				if err == nil {
					err = indexedHashPeer(kc)
				}
				kernErr <- err
			}()
		}
		conns := make([]*TCPConn, manyConns)
		_ = ln.SetDeadline(time.Now().Add(120 * time.Second))
		for i := range conns {
			if conns[i], err = ln.AcceptTCP(); err != nil {
				t.Fatalf("accept %d: %v", i, err)
			}
		}
		if est := l.tcpStats().Established - st0.Established; est < manyConns {
			t.Errorf("%d connections established at once in the ring's stack, want %d", est, manyConns)
		}
		exchangeAll(t, conns)
		for i := 0; i < manyConns; i++ {
			if err := <-kernErr; err != nil {
				t.Fatalf("kernel client: %v", err)
			}
		}
		if d := l.tcpStats().PassiveOpens - st0.PassiveOpens; d != manyConns {
			t.Errorf("stack accepted %d connections, want %d", d, manyConns)
		}
	})

	if n := l.kernelOpens(t) - before; n != 0 {
		t.Errorf("the kernel of the daemon's namespace opened %d TCP connections", n)
	}
	deadline := time.Now().Add(30 * time.Second)
	for l.tcpStats().Established != 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := l.tcpStats().Established; n != 0 {
		t.Errorf("%d connections still established after all were closed", n)
	}
}

// dialAll runs dial for every index at once (64 in flight, as a program
// opening a pool would) and fails the test with the first error.
func dialAll(t *testing.T, dial func(i int) error) {
	t.Helper()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		sem  = make(chan struct{}, 64)
	)
	for i := 0; i < manyConns; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := dial(i); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("dial %d: %w", i, err))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d dials failed, first: %v", len(errs), manyConns, errs[0])
	}
}

// exchangeAll sends every connection its own bytes (its index first) and
// checks the peer's hash and the index-specific reply, all at once.
func exchangeAll(t *testing.T, conns []*TCPConn) {
	t.Helper()
	errs := make(chan error, len(conns))
	for i, conn := range conns {
		go func() {
			defer conn.Close()
			out := manyPayload(i, 3000+i)
			_ = conn.SetDeadline(time.Now().Add(120 * time.Second))
			if _, err := conn.Write(out); err != nil {
				errs <- fmt.Errorf("connection %d: write: %w", i, err)
				return
			}
			if err := conn.CloseWrite(); err != nil {
				errs <- fmt.Errorf("connection %d: close write: %w", i, err)
				return
			}
			in, err := io.ReadAll(conn)
			if err != nil {
				errs <- fmt.Errorf("connection %d: read: %w", i, err)
				return
			}
			if err := netlab.CheckHashReply(out, in, manyReply(i)); err != nil {
				err = fmt.Errorf("connection %d: %w", i, err)
			}
			errs <- err
		}()
	}
	for range conns {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// manyPayload is n bytes for connection i, starting with i so that the
// peer knows which reply to send.
func manyPayload(i, n int) []byte {
	b := payload(n, uint64(i))
	copy(b, fmt.Sprintf("%08d", i))
	return b
}

func manyReply(i int) []byte { return payload(500+i%700, uint64(manyConns+i)) }

// indexedHashPeer is netlab.HashPeer whose reply depends on the index the
// stream starts with.
func indexedHashPeer(c net.Conn) error {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(120 * time.Second))
	head := make([]byte, 8)
	if _, err := io.ReadFull(c, head); err != nil {
		return fmt.Errorf("read the index: %w", err)
	}
	var i int
	if _, err := fmt.Sscanf(string(head), "%08d", &i); err != nil || i < 0 || i >= manyConns {
		return fmt.Errorf("index %q: %v", head, err)
	}
	return netlab.HashPeer(prefixConn{Conn: c, r: io.MultiReader(bytes.NewReader(head), c)}, manyReply(i), 120*time.Second)
}

// prefixConn gives back bytes already read before the rest of the stream.
type prefixConn struct {
	net.Conn
	r io.Reader
}

func (p prefixConn) Read(b []byte) (int, error) { return p.r.Read(b) }
