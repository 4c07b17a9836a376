package socket

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func payload(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, uint64(n)))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// loopback returns a connected socket on the fake daemon, whose engine
// echoes every datagram back as if remote4 had sent it.
func loopback(t *testing.T, d *fakeDaemon, cfg ListenConfig) (*UDPConn, *fakeSock) {
	t.Helper()
	c := d.dial(t)
	u, err := c.ListenUDPConfig("udp4", local4, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = u.Close() })
	return u, d.session(len(d.sessions) - 1).sock(u.id)
}

func TestEchoByteExact(t *testing.T) {
	for _, poll := range []string{"0", "20", "-1"} {
		t.Run("poll="+poll, func(t *testing.T) {
			t.Setenv(EnvRXPoll, poll)
			d := newFakeDaemon(t)
			u, _ := loopback(t, d, ListenConfig{})
			buf := make([]byte, 70000)
			for i, size := range []int{18, 1400, 8000, 0, 1} {
				p := payload(size, uint64(i))
				if n, err := u.WriteToUDPAddrPort(p, remote4); err != nil || n != size {
					t.Fatalf("write %d: %d, %v", size, n, err)
				}
				n, from, err := u.ReadFromUDPAddrPort(buf)
				if err != nil {
					t.Fatal(err)
				}
				if from != remote4 || !bytes.Equal(buf[:n], p) {
					t.Fatalf("%d bytes: got %d bytes from %v, mismatch=%v", size, n, from, !bytes.Equal(buf[:n], p))
				}
			}
			// net.PacketConn forms.
			p := payload(300, 9)
			if _, err := u.WriteTo(p, net.UDPAddrFromAddrPort(remote4)); err != nil {
				t.Fatal(err)
			}
			n, addr, err := u.ReadFrom(buf)
			if err != nil || addr.String() != remote4.String() || !bytes.Equal(buf[:n], p) {
				t.Fatalf("ReadFrom: %d %v %v", n, addr, err)
			}
		})
	}
}

func TestConnectedReadWrite(t *testing.T) {
	d := newFakeDaemon(t)
	c := d.dial(t)
	u, err := c.DialUDP("udp4", netip.AddrPort{}, remote4)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	p := payload(1400, 1)
	if n, err := u.Write(p); err != nil || n != len(p) {
		t.Fatalf("Write: %d, %v", n, err)
	}
	buf := make([]byte, 2000)
	n, err := u.Read(buf)
	if err != nil || !bytes.Equal(buf[:n], p) {
		t.Fatalf("Read: %d, %v", n, err)
	}
	if _, err := u.WriteToUDPAddrPort(p, remote4); !errors.Is(err, net.ErrWriteToConnected) {
		t.Errorf("WriteTo on a connected socket: %v, want ErrWriteToConnected", err)
	}
}

func TestWriteErrors(t *testing.T) {
	d := newFakeDaemon(t)
	u, fs := loopback(t, d, ListenConfig{QueueBytes: 256 << 10})
	var oe *net.OpError
	_, err := u.Write([]byte("x"))
	if !errors.Is(err, unix.EDESTADDRREQ) || !errors.As(err, &oe) || oe.Op != "write" {
		t.Errorf("Write unconnected: %v, want write error matching EDESTADDRREQ", err)
	}
	for _, tc := range []struct {
		dst  netip.AddrPort
		want error
	}{
		{remote6, unix.EAFNOSUPPORT},
		{netip.MustParseAddrPort("10.9.0.2:0"), unix.EINVAL},
		{netip.AddrPortFrom(netip.Addr{}, 5), unix.EDESTADDRREQ},
	} {
		if _, err := u.WriteToUDPAddrPort([]byte("x"), tc.dst); !errors.Is(err, tc.want) {
			t.Errorf("WriteTo %v: %v, want %v", tc.dst, err, tc.want)
		}
	}
	if _, err := u.WriteTo([]byte("x"), &net.IPAddr{IP: net.IPv4(10, 9, 0, 2)}); !errors.Is(err, unix.EINVAL) {
		t.Errorf("WriteTo *net.IPAddr: %v, want EINVAL", err)
	}
	// A v4-mapped destination is IPv4.
	if _, err := u.WriteTo([]byte("m"), &net.UDPAddr{IP: net.ParseIP("10.9.0.2"), Port: 7000}); err != nil {
		t.Errorf("WriteTo a 16-byte IPv4 address: %v", err)
	}
	buf := make([]byte, 10)
	if n, from, err := u.ReadFromUDPAddrPort(buf); err != nil || from != remote4 || n != 1 {
		t.Errorf("read back: %d %v %v", n, from, err)
	}

	// Oversized: nothing of it is queued, the datagrams before it are.
	before := fs.received.Load()
	big := make([]byte, MaxDatagram4+1)
	n, err := u.WriteBatch([][]byte{[]byte("a"), []byte("b"), big, []byte("c")}, remote4)
	if n != 2 || !errors.Is(err, unix.EMSGSIZE) {
		t.Errorf("WriteBatch with an oversized third datagram: %d, %v; want 2, EMSGSIZE", n, err)
	}
	if _, err := u.WriteToUDPAddrPort(big, remote4); !errors.Is(err, unix.EMSGSIZE) {
		t.Errorf("WriteTo of %d bytes: %v, want EMSGSIZE", len(big), err)
	}
	if _, err := u.WriteToUDPAddrPort(make([]byte, MaxDatagram4), remote4); err != nil {
		t.Errorf("WriteTo of exactly %d bytes: %v", MaxDatagram4, err)
	}
	msgs := make([]Message, 4)
	for i := range msgs {
		msgs[i].Buf = make([]byte, 70000)
	}
	got := 0
	for got < 3 {
		n, err := u.ReadBatch(msgs[got:])
		if err != nil {
			t.Fatal(err)
		}
		got += n
	}
	if fs.received.Load()-before != 3 || msgs[0].N != 1 || msgs[1].N != 1 || msgs[2].N != MaxDatagram4 {
		t.Errorf("engine got %d datagrams, sizes %d %d %d", fs.received.Load()-before, msgs[0].N, msgs[1].N, msgs[2].N)
	}

	// A datagram larger than the queue can hold.
	small, _ := loopback(t, d, ListenConfig{QueueBytes: 4096})
	_, err = small.WriteToUDPAddrPort(make([]byte, 3000), remote4)
	if !errors.Is(err, unix.EMSGSIZE) {
		t.Errorf("3000 bytes into a 4 KiB queue: %v, want EMSGSIZE", err)
	}
}

func TestTruncation(t *testing.T) {
	d := newFakeDaemon(t)
	u, _ := loopback(t, d, ListenConfig{})
	p := payload(1000, 3)
	if _, err := u.WriteToUDPAddrPort(p, remote4); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 100)
	n, _, err := u.ReadFromUDPAddrPort(buf)
	if err != nil || n != 100 || !bytes.Equal(buf, p[:100]) {
		t.Errorf("short read: %d, %v", n, err)
	}
	// The rest of the datagram is gone, like recvfrom.
	u.SetNonblock(true)
	if _, _, err := u.ReadFromUDPAddrPort(buf); !errors.Is(err, unix.EAGAIN) {
		t.Errorf("after a truncated read: %v, want EAGAIN (nothing left)", err)
	}
}

func TestBatch(t *testing.T) {
	d := newFakeDaemon(t)
	u, fs := loopback(t, d, ListenConfig{QueueBytes: 1 << 20})
	fs.pause()
	var sent [][]byte
	for i := 0; i < 64; i++ {
		sent = append(sent, payload(10+i*20, uint64(i)))
	}
	n, err := u.WriteBatch(sent, remote4)
	if n != len(sent) || err != nil {
		t.Fatalf("WriteBatch: %d, %v", n, err)
	}
	fs.unpause()
	msgs := make([]Message, 10)
	for i := range msgs {
		msgs[i].Buf = make([]byte, 2000)
	}
	for got := 0; got < len(sent); {
		n, err := u.ReadBatch(msgs)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs[:n] {
			if m.Addr != remote4 || !bytes.Equal(m.Buf[:m.N], sent[got]) {
				t.Fatalf("datagram %d differs", got)
			}
			got++
		}
	}
	if n, err := u.ReadBatch(nil); n != 0 || err != nil {
		t.Errorf("ReadBatch(nil) = %d, %v", n, err)
	}
	if n, err := u.WriteBatch(nil, remote4); n != 0 || err != nil {
		t.Errorf("WriteBatch(nil) = %d, %v", n, err)
	}
}

func TestDeadlines(t *testing.T) {
	for _, poll := range []string{"0", "-1"} {
		t.Run("poll="+poll, func(t *testing.T) {
			t.Setenv(EnvRXPoll, poll)
			d := newFakeDaemon(t)
			u, fs := loopback(t, d, ListenConfig{QueueBytes: 4096})
			buf := make([]byte, 100)

			// A deadline in the past fails at once, even with data queued.
			fs.inject(t, remote4, []byte("queued"))
			_ = u.SetReadDeadline(time.Now().Add(-time.Second))
			_, _, err := u.ReadFromUDPAddrPort(buf)
			var ne net.Error
			if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
				t.Errorf("read past deadline: %v, want a timeout matching os.ErrDeadlineExceeded", err)
			}
			_ = u.SetReadDeadline(time.Time{})
			if n, _, err := u.ReadFromUDPAddrPort(buf); err != nil || string(buf[:n]) != "queued" {
				t.Errorf("read after clearing the deadline: %q, %v", buf[:n], err)
			}

			// A future deadline expires.
			_ = u.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
			if _, _, err := u.ReadFromUDPAddrPort(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("read with 30ms deadline: %v", err)
			}

			// A pending read honours a deadline set after it started.
			_ = u.SetReadDeadline(time.Time{})
			got := make(chan error, 1)
			go func() {
				_, _, err := u.ReadFromUDPAddrPort(buf)
				got <- err
			}()
			time.Sleep(20 * time.Millisecond)
			_ = u.SetReadDeadline(time.Now())
			select {
			case err := <-got:
				if !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Errorf("pending read: %v, want deadline exceeded", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("pending read ignored the new deadline")
			}
			_ = u.SetReadDeadline(time.Time{})

			// Writes wait while the queue is full, until the deadline.
			fs.pause()
			p := make([]byte, 1000)
			for {
				u.SetNonblock(true)
				_, err := u.WriteToUDPAddrPort(p, remote4)
				u.SetNonblock(false)
				if errors.Is(err, unix.EAGAIN) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			_ = u.SetWriteDeadline(time.Now().Add(30 * time.Millisecond))
			if _, err := u.WriteToUDPAddrPort(p, remote4); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("write into a full queue with a deadline: %v", err)
			}
			_ = u.SetWriteDeadline(time.Time{})
			wgot := make(chan error, 1)
			go func() {
				_, err := u.WriteToUDPAddrPort(p, remote4)
				wgot <- err
			}()
			time.Sleep(20 * time.Millisecond)
			_ = u.SetDeadline(time.Now().Add(-time.Second))
			select {
			case err := <-wgot:
				if !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Errorf("pending write: %v, want deadline exceeded", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("pending write ignored the new deadline")
			}
			// A blocked write completes once the engine drains the queue.
			_ = u.SetDeadline(time.Time{})
			go func() {
				_, err := u.WriteToUDPAddrPort(p, remote4)
				wgot <- err
			}()
			time.Sleep(10 * time.Millisecond)
			fs.unpause()
			if err := <-wgot; err != nil {
				t.Errorf("blocked write after the engine resumed: %v", err)
			}
		})
	}
}

func TestNonblock(t *testing.T) {
	d := newFakeDaemon(t)
	u, fs := loopback(t, d, ListenConfig{QueueBytes: 4096})
	u.SetNonblock(true)
	_, _, err := u.ReadFromUDPAddrPort(make([]byte, 10))
	if !errors.Is(err, unix.EAGAIN) || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("non-blocking read of an empty queue: %v, want EAGAIN", err)
	}
	fs.pause()
	var werr error
	for i := 0; i < 100 && werr == nil; i++ {
		_, werr = u.WriteToUDPAddrPort(make([]byte, 500), remote4)
	}
	if !errors.Is(werr, unix.EAGAIN) {
		t.Errorf("non-blocking write into a full queue: %v, want EAGAIN", werr)
	}
}

func TestCloseUnblocks(t *testing.T) {
	d := newFakeDaemon(t)
	u, fs := loopback(t, d, ListenConfig{QueueBytes: 4096})
	fs.pause()
	for {
		u.SetNonblock(true)
		_, err := u.WriteToUDPAddrPort(make([]byte, 1000), remote4)
		u.SetNonblock(false)
		if err != nil {
			break
		}
	}
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, _, err := u.ReadFromUDPAddrPort(make([]byte, 10))
			errs <- err
		}()
		go func() {
			defer wg.Done()
			_, err := u.WriteToUDPAddrPort(make([]byte, 1000), remote4)
			errs <- err
		}()
	}
	time.Sleep(20 * time.Millisecond)
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("call pending at Close: %v, want net.ErrClosed", err)
		}
	}
	if _, err := u.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after Close: %v", err)
	}
	if err := u.SetDeadline(time.Now()); !errors.Is(err, net.ErrClosed) {
		t.Errorf("SetDeadline after Close: %v", err)
	}
	if err := u.SetOption("IP_TOS", 1); !errors.Is(err, net.ErrClosed) {
		t.Errorf("SetOption after Close: %v", err)
	}
}

// TestConcurrentSendRecv: several writers and readers on one socket, every
// datagram arrives exactly once.
func TestConcurrentSendRecv(t *testing.T) {
	d := newFakeDaemon(t)
	u, _ := loopback(t, d, ListenConfig{QueueBytes: 64 << 10})
	const writers, per = 4, 500
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				b := []byte{byte(w), byte(i), byte(i >> 8)}
				if _, err := u.WriteToUDPAddrPort(b, remote4); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	var mu sync.Mutex
	seen := map[[3]byte]bool{}
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 10)
			for {
				_ = u.SetReadDeadline(time.Now().Add(time.Second))
				n, _, err := u.ReadFromUDPAddrPort(buf)
				if errors.Is(err, os.ErrDeadlineExceeded) {
					return
				}
				if err != nil || n != 3 {
					t.Error(n, err)
					return
				}
				mu.Lock()
				k := [3]byte(buf[:3])
				if seen[k] {
					t.Errorf("duplicate %v", k)
				}
				seen[k] = true
				done := len(seen) == writers*per
				mu.Unlock()
				if done {
					_ = u.SetReadDeadline(time.Now()) // release the other readers
					return
				}
			}
		}()
	}
	wg.Wait()
	if len(seen) != writers*per {
		t.Errorf("received %d distinct datagrams, want %d", len(seen), writers*per)
	}
}

func TestZeroValues(t *testing.T) {
	var u *UDPConn
	var z UDPConn
	for _, c := range []*UDPConn{u, &z} {
		if _, err := c.Read(make([]byte, 1)); !errors.Is(err, unix.EINVAL) {
			t.Errorf("Read: %v", err)
		}
		if _, err := c.WriteToUDPAddrPort([]byte("x"), remote4); !errors.Is(err, unix.EINVAL) {
			t.Errorf("Write: %v", err)
		}
		if err := c.SetDeadline(time.Now()); !errors.Is(err, unix.EINVAL) {
			t.Errorf("SetDeadline: %v", err)
		}
		if err := c.SetOption("IP_TOS", 1); !errors.Is(err, unix.EINVAL) {
			t.Errorf("SetOption: %v", err)
		}
		if err := c.JoinGroup(netip.MustParseAddr("239.1.1.1")); !errors.Is(err, unix.EINVAL) {
			t.Errorf("JoinGroup: %v", err)
		}
		if err := c.Close(); !errors.Is(err, unix.EINVAL) {
			t.Errorf("Close: %v", err)
		}
		if c.LocalAddr() != nil || c.RemoteAddr() != nil || c.ID() != 0 {
			t.Error("addresses of a zero UDPConn")
		}
		c.SetNonblock(true)
	}
	var c *Client
	if _, err := c.ListenUDP("udp4", local4); !errors.Is(err, unix.EINVAL) {
		t.Errorf("nil Client ListenUDP: %v", err)
	}
	if _, err := (&Client{}).DialUDP("udp4", local4, remote4); !errors.Is(err, unix.EINVAL) {
		t.Errorf("zero Client DialUDP: %v", err)
	}
	if err := c.Close(); !errors.Is(err, unix.EINVAL) {
		t.Errorf("nil Client Close: %v", err)
	}
}

func TestMaxDatagram6(t *testing.T) {
	d := newFakeDaemon(t)
	c := d.dial(t)
	u, err := c.ListenUDPConfig("udp6", netip.MustParseAddrPort("[fd00:9::1]:0"), ListenConfig{QueueBytes: 256 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if _, err := u.WriteToUDPAddrPort(make([]byte, MaxDatagram6+1), remote6); !errors.Is(err, unix.EMSGSIZE) {
		t.Errorf("%d bytes over IPv6: %v, want EMSGSIZE", MaxDatagram6+1, err)
	}
	if _, err := u.WriteToUDPAddrPort(make([]byte, MaxDatagram6), remote6); err != nil {
		t.Errorf("%d bytes over IPv6: %v", MaxDatagram6, err)
	}
	buf := make([]byte, 70000)
	if n, from, err := u.ReadFromUDPAddrPort(buf); err != nil || n != MaxDatagram6 || from != remote6 {
		t.Errorf("read back: %d from %v, %v", n, from, err)
	}
}
