package sockq

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/dgram"
	"github.com/bypassd/bypassd/internal/shmq"
)

// pair is a Conn and the engine side of its queues, in process memory.
type pair struct {
	c                        *Conn
	etx, erx                 *shmq.Queue
	rxWait, txWait, doorbell *shmq.Waiter
}

func newPair(t *testing.T, capacity int) *pair {
	t.Helper()
	txMem, rxMem := make([]byte, shmq.Size(capacity)), make([]byte, shmq.Size(capacity))
	tx, err := shmq.Init(txMem, capacity)
	if err != nil {
		t.Fatal(err)
	}
	rx, _ := shmq.Init(rxMem, capacity)
	p := &pair{}
	p.etx, _ = shmq.Attach(txMem)
	p.erx, _ = shmq.Attach(rxMem)
	for _, w := range []**shmq.Waiter{&p.rxWait, &p.txWait, &p.doorbell} {
		if *w, err = shmq.NewWaiter(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = p.doorbell.Close() })
	p.c = New(tx, rx, p.rxWait, p.txWait, p.doorbell, shmq.Policy{})
	t.Cleanup(p.c.Close)
	return p
}

// echo is a minimal engine: it moves every TX record back to RX, with the
// destination as the sender, and wakes the user.
func (p *pair) echo(t *testing.T, n int) {
	t.Helper()
	for moved := 0; moved < n; {
		rec, _, err := p.etx.Peek()
		if errors.Is(err, shmq.ErrEmpty) {
			_ = p.doorbell.Wait(time.Now().Add(10 * time.Millisecond))
			continue
		}
		if err != nil {
			t.Error(err)
			return
		}
		out, err := p.erx.Reserve(len(rec))
		if err != nil {
			t.Error(err)
			return
		}
		copy(out, rec)
		_ = p.erx.Commit(len(rec), dgram.TypeDatagram)
		p.etx.Advance()
		moved++
		if p.etx.Release() {
			_ = p.txWait.Wake()
		}
		if p.erx.Publish() {
			_ = p.rxWait.Wake()
		}
	}
}

func TestSendRecv(t *testing.T) {
	p := newPair(t, 1<<16)
	dst := netip.MustParseAddrPort("10.0.0.2:7")
	msgs := [][]byte{[]byte("one"), []byte("two"), bytes.Repeat([]byte{7}, 2000)}
	done := make(chan struct{})
	go func() { defer close(done); p.echo(t, len(msgs)) }()
	if n, err := p.c.SendBatch(msgs, dst, time.Time{}); n != 3 || err != nil {
		t.Fatalf("send: %d %v", n, err)
	}
	got := make([]Message, 4)
	for i := range got {
		got[i].Buf = make([]byte, 100) // the 2000-byte datagram is truncated
	}
	received := 0
	for received < 3 {
		n, err := p.c.RecvBatch(got[received:], time.Now().Add(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		received += n
	}
	<-done
	for i, m := range msgs {
		want := m[:min(len(m), 100)]
		if !bytes.Equal(got[i].Buf[:got[i].N], want) || got[i].Addr != dst {
			t.Fatalf("message %d: %q from %v", i, got[i].Buf[:got[i].N], got[i].Addr)
		}
	}
}

func TestDeadlineCloseBreak(t *testing.T) {
	p := newPair(t, 4096)
	_, err := p.c.RecvBatch(make([]Message, 1), time.Now().Add(20*time.Millisecond))
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("receive past the deadline: %v", err)
	}
	// A full queue and a past deadline: the send fails at once.
	big := make([]byte, 1500)
	for {
		n, err := p.c.SendBatch([][]byte{big}, netip.AddrPort{}, time.Now())
		if err != nil {
			if !errors.Is(err, ErrTimeout) {
				t.Fatalf("send into a full queue: %v", err)
			}
			break
		}
		if n != 1 {
			t.Fatalf("sent %d", n)
		}
	}
	if _, err := p.c.SendBatch([][]byte{make([]byte, 4096)}, netip.AddrPort{}, time.Time{}); !errors.Is(err, unix.EMSGSIZE) {
		t.Fatalf("a record larger than the queue: %v", err)
	}
	// Break: pending and later calls fail with the reason.
	errc := make(chan error, 1)
	go func() {
		_, err := p.c.RecvBatch(make([]Message, 1), time.Time{})
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	reason := errors.New("daemon went away")
	p.c.Break(reason)
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) || !errors.Is(err, reason) {
			t.Fatalf("receive after Break: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Break did not unblock a receive")
	}
}

func TestCloseUnblocks(t *testing.T) {
	p := newPair(t, 4096)
	errc := make(chan error, 1)
	go func() {
		_, err := p.c.RecvBatch(make([]Message, 1), time.Time{})
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	p.c.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("receive after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock a receive")
	}
}
