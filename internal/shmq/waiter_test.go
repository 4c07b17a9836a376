package shmq

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func newTestWaiter(t testing.TB) *Waiter {
	t.Helper()
	w, err := NewWaiter()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func TestWaiterWakeWait(t *testing.T) {
	w := newTestWaiter(t)
	for range 3 {
		if err := w.Wake(); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Wait(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatalf("Wait after Wake: %v", err)
	}
	// All three tokens were consumed by one Wait.
	err := w.Wait(time.Now().Add(10 * time.Millisecond))
	if err != ErrTimeout || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Wait without a token: %v, want ErrTimeout", err)
	}
	var te interface{ Timeout() bool }
	if !errors.As(err, &te) || !te.Timeout() {
		t.Fatal("ErrTimeout has no Timeout() == true")
	}
	// A deadline in the past returns at once.
	if err := w.Wait(time.Now().Add(-time.Second)); err != ErrTimeout {
		t.Fatalf("Wait with past deadline: %v", err)
	}
}

func TestWaiterCloseUnblocks(t *testing.T) {
	w, err := NewWaiter()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Wait(time.Time{}) }()
	// Give Wait a chance to park; the result is ErrClosed either way.
	time.Sleep(10 * time.Millisecond)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != ErrClosed {
			t.Fatalf("Wait returned %v, want ErrClosed", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not unblock Wait")
	}
	if err := w.Wait(time.Time{}); err != ErrClosed {
		t.Errorf("Wait after Close: %v", err)
	}
	if err := w.Wake(); err != ErrClosed {
		t.Errorf("Wake after Close: %v", err)
	}
	if err := w.Close(); err != ErrClosed {
		t.Errorf("second Close: %v", err)
	}
	if !w.Closed() {
		t.Error("Closed() false after Close")
	}
}

func TestWaiterFD(t *testing.T) {
	w := newTestWaiter(t)
	dup, err := unix.Dup(w.FD())
	if err != nil {
		t.Fatal(err)
	}
	peer, err := NewWaiterFD(dup)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { peer.Close() })
	if err := peer.Wake(); err != nil {
		t.Fatal(err)
	}
	if err := w.Wait(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatalf("Wait after the peer's Wake: %v", err)
	}

	// A blocking eventfd is switched to non-blocking.
	bfd, err := unix.Eventfd(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	bw, err := NewWaiterFD(bfd)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bw.Close() })
	if fl, err := unix.FcntlInt(uintptr(bfd), unix.F_GETFL, 0); err != nil || fl&unix.O_NONBLOCK == 0 {
		t.Fatalf("wrapped eventfd is not non-blocking (flags %#x, %v)", fl, err)
	}
	if err := bw.Wait(time.Now().Add(5 * time.Millisecond)); err != ErrTimeout {
		t.Fatalf("deadline on a wrapped blocking eventfd: %v", err)
	}

	refusesPipe(t, func(fd int) error { _, err := NewWaiterFD(fd); return err })
	if _, err := NewWaiterFD(-1); err == nil {
		t.Error("NewWaiterFD(-1) succeeded")
	}
}

// refusesPipe checks that wrap refuses a pipe (anything but an eventfd)
// and closes it.
func refusesPipe(t *testing.T, wrap func(fd int) error) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer closeFD(p[0])
	if err := wrap(p[1]); err == nil {
		t.Fatal("a pipe was accepted as an eventfd")
	}
	if _, err := unix.FcntlInt(uintptr(p[1]), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Errorf("refused fd was not closed: %v", err)
	}
}

// A peer that saturates the eventfd counter must not make Wake block.
func TestWaiterSaturated(t *testing.T) {
	w := newTestWaiter(t)
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], 0xFFFFFFFFFFFFFFFE)
	if _, err := unix.Write(w.FD(), b[:]); err != nil {
		t.Fatal(err)
	}
	if err := w.Wake(); err != nil {
		t.Fatalf("Wake on a saturated eventfd: %v", err)
	}
	if err := w.Wait(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
}

func TestPolicyFromMicros(t *testing.T) {
	for us, want := range map[int]time.Duration{-1: SpinForever, 0: 0, 100: 100 * time.Microsecond} {
		p, err := PolicyFromMicros(us)
		if err != nil || p.Spin != want {
			t.Errorf("PolicyFromMicros(%d) = %v, %v", us, p.Spin, err)
		}
	}
	for _, us := range []int{-2, -1000, 1 << 40} {
		if _, err := PolicyFromMicros(us); err == nil {
			t.Errorf("PolicyFromMicros(%d) accepted", us)
		}
	}
}

func TestPolicyDeadlineAndClose(t *testing.T) {
	q := newTestQueue(t, 4096)
	for _, p := range []Policy{{Spin: SpinForever}, {Spin: 0}, {Spin: time.Millisecond}} {
		w := newTestWaiter(t)
		if err := p.WaitReadable(q, w, time.Now().Add(20*time.Millisecond)); err != ErrTimeout {
			t.Errorf("spin %v: WaitReadable on empty queue: %v, want ErrTimeout", p.Spin, err)
		}
		if atomic.LoadUint32(q.consWaiting) != 0 {
			t.Errorf("spin %v: waiting flag left set after timeout", p.Spin)
		}
		done := make(chan error, 1)
		go func() { done <- p.WaitReadable(q, w, time.Time{}) }()
		time.Sleep(5 * time.Millisecond)
		w.Close()
		select {
		case err := <-done:
			if err != ErrClosed {
				t.Errorf("spin %v: WaitReadable after Close: %v", p.Spin, err)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("spin %v: Close did not unblock WaitReadable", p.Spin)
		}
	}
	if err := (Policy{}).WaitReadable(q, nil, time.Time{}); err == nil {
		t.Error("sleeping policy without a Waiter accepted")
	}
	if err := (Policy{Spin: SpinForever}).WaitReadable(q, nil, time.Now().Add(time.Millisecond)); err != ErrTimeout {
		t.Errorf("spin-forever without Waiter: %v, want ErrTimeout", err)
	}
	if err := (Policy{}).WaitWritable(q, q.MaxPayload()+1, nil, time.Time{}); err != ErrTooBig {
		t.Errorf("WaitWritable too big: %v", err)
	}
	if err := (Policy{}).WaitWritable(q, 10, nil, time.Time{}); err != nil {
		t.Errorf("WaitWritable on an empty queue: %v", err)
	}
}

// A consumer asleep on an empty queue is woken by a single Publish.
func TestWakeOnPublish(t *testing.T) {
	q := newTestQueue(t, 4096)
	w := newTestWaiter(t)
	done := make(chan error, 1)
	go func() { done <- (Policy{}).WaitReadable(q, w, time.Now().Add(20*time.Second)) }()
	waitFlag(t, q.consWaiting)
	q.Push(1, []byte("wake"))
	if !q.Publish() {
		t.Fatal("Publish did not report the sleeping consumer")
	}
	if err := w.Wake(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("WaitReadable: %v", err)
	}
	if p, _, err := q.Peek(); err != nil || string(p) != "wake" {
		t.Fatalf("Peek: %q %v", p, err)
	}
}

// A producer waiting for space is woken by a single Release.
func TestWakeOnRelease(t *testing.T) {
	q := newTestQueue(t, 4096)
	w := newTestWaiter(t)
	for q.Push(1, make([]byte, 500)) == nil {
	}
	q.Publish()
	done := make(chan error, 1)
	go func() { done <- (Policy{}).WaitWritable(q, 500, w, time.Now().Add(20*time.Second)) }()
	waitFlag(t, q.prodWaiting)
	if _, _, err := q.Peek(); err != nil {
		t.Fatal(err)
	}
	q.Advance()
	if !q.Release() {
		t.Fatal("Release did not report the waiting producer")
	}
	w.Wake()
	if err := <-done; err != nil {
		t.Fatalf("WaitWritable: %v", err)
	}
}

// TestPingPongNoLostWakeups bounces one record between two goroutines over
// two queues, both always sleeping (no spinning) so that every round trip
// goes through the wake-up protocol. A lost wake-up shows as a timeout.
func TestPingPongNoLostWakeups(t *testing.T) {
	const iterations = 100000
	ab, ba := newTestQueue(t, 4096), newTestQueue(t, 4096)
	wa, wb := newTestWaiter(t), newTestWaiter(t) // a sleeps on wa, b on wb
	errc := make(chan error, 2)
	var wg sync.WaitGroup
	var wakes atomic.Int64
	side := func(in, out *Queue, mine, peer *Waiter, first bool) {
		defer wg.Done()
		expect := uint64(0) // values go 0 (a→b), 1 (b→a), 2 (a→b), ...
		if first {
			expect = 1
		}
		var buf [8]byte
		send := func(v uint64) error {
			binary.LittleEndian.PutUint64(buf[:], v)
			if err := out.Push(1, buf[:]); err != nil {
				return err
			}
			if out.Publish() {
				wakes.Add(1)
				return peer.Wake()
			}
			return nil
		}
		if first {
			if err := send(0); err != nil {
				errc <- err
				return
			}
		}
		for range iterations {
			if err := (Policy{}).WaitReadable(in, mine, time.Now().Add(20*time.Second)); err != nil {
				errc <- errors.New("lost wake-up: " + err.Error())
				return
			}
			p, _, err := in.Peek()
			if err != nil {
				errc <- err
				return
			}
			got := binary.LittleEndian.Uint64(p)
			if got != expect {
				errc <- fmt.Errorf("got %d, want %d", got, expect)
				return
			}
			expect += 2
			in.Advance()
			in.Release()
			if err := send(got + 1); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}
	wg.Add(2)
	go side(ba, ab, wa, wb, true)
	go side(ab, ba, wb, wa, false)
	wg.Wait()
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d round trips, %d eventfd wake-ups", iterations, wakes.Load())
}
