package shmq

import (
	"errors"
	"fmt"
	"runtime"
	"time"
)

// SpinForever as Policy.Spin never sleeps on the eventfd.
const SpinForever time.Duration = -1

// Policy is the spin-then-sleep waiting policy (VMA_RX_POLL semantics): busy
// poll the queue for Spin, then sleep on the eventfd. Spin == 0 sleeps at
// once, SpinForever never sleeps (deadline and Close are still honoured).
// Spinning costs a CPU but saves the several microseconds a wake-up through
// the kernel costs (see notes/lab-facts.md).
type Policy struct {
	Spin time.Duration
}

// PolicyFromMicros converts a BYPASSD_RX_POLL-style value: -1 spins forever,
// 0 never spins, N > 0 spins N microseconds.
func PolicyFromMicros(us int) (Policy, error) {
	switch {
	case us == -1:
		return Policy{Spin: SpinForever}, nil
	case us < -1:
		return Policy{}, fmt.Errorf("shmq: poll value %d µs is invalid; use -1 (spin forever), 0 (never spin) or a positive number of µs", us)
	case int64(us) > int64(time.Hour/time.Microsecond):
		return Policy{}, fmt.Errorf("shmq: poll value %d µs is over an hour; use -1 to spin forever", us)
	}
	return Policy{Spin: time.Duration(us) * time.Microsecond}, nil
}

// Sleeper is what a waiting side sleeps on: an eventfd (Waiter) or an
// in-process Signal.
type Sleeper interface {
	// Wait sleeps until woken (possibly spuriously), the deadline (zero:
	// none) passes (ErrTimeout) or the sleeper is closed (ErrClosed).
	Wait(deadline time.Time) error
	Closed() bool
}

// spinCheckEvery is how many queue checks run between clock reads and
// yields: reading the clock on every check would dominate the loop.
const spinCheckEvery = 64

// spin polls ready until it returns true (nil), the spin budget is used
// up (errSpinDone), the deadline passes or w is closed. w may be nil.
func (p Policy) spin(ready func() bool, w Sleeper, deadline time.Time) error {
	if p.Spin == 0 {
		return errSpinDone
	}
	start := time.Now()
	for i := 1; ; i++ {
		if ready() {
			return nil
		}
		if i%spinCheckEvery != 0 {
			continue
		}
		if w != nil && w.Closed() {
			return ErrClosed
		}
		now := time.Now()
		if !deadline.IsZero() && !now.Before(deadline) {
			return ErrTimeout
		}
		if p.Spin > 0 && now.Sub(start) >= p.Spin {
			return errSpinDone
		}
		// Let other goroutines (possibly the producer) run on this P.
		runtime.Gosched()
	}
}

var errSpinDone = errors.New("spin budget used up")

// WaitReadable returns nil once q has a record to Peek (or is corrupt, which
// Peek then reports), ErrTimeout at the deadline (zero: none) and ErrClosed
// when w is closed. w is the consumer's Waiter, the one the producer wakes
// when Publish returns true; it may be nil only with SpinForever. Consumer
// side.
func (p Policy) WaitReadable(q *Queue, w Sleeper, deadline time.Time) error {
	if q.Readable() {
		return nil
	}
	err := p.spin(q.Readable, w, deadline)
	if err != errSpinDone {
		return err
	}
	if w == nil {
		return errors.New("shmq: wait readable: a Waiter is required unless the policy spins forever")
	}
	for {
		if q.ArmReadWait() {
			q.DisarmReadWait()
			return nil
		}
		if err := w.Wait(deadline); err != nil {
			q.DisarmReadWait()
			return err
		}
		// Woken (possibly spuriously, by a stale token): re-check.
		if q.Readable() {
			q.DisarmReadWait()
			return nil
		}
	}
}

// WaitWritable returns nil once Reserve(n) would not return ErrFull,
// ErrTimeout at the deadline (zero: none), ErrClosed when w is closed and
// ErrTooBig at once if n can never fit. w is the producer's Waiter, the one
// the consumer wakes when Release returns true; it may be nil only with
// SpinForever. Producer side.
func (p Policy) WaitWritable(q *Queue, n int, w Sleeper, deadline time.Time) error {
	if n < 0 || n > q.maxPayload {
		return ErrTooBig
	}
	ready := func() bool { return q.Writable(n) }
	if ready() {
		return nil
	}
	err := p.spin(ready, w, deadline)
	if err != errSpinDone {
		return err
	}
	if w == nil {
		return errors.New("shmq: wait writable: a Waiter is required unless the policy spins forever")
	}
	for {
		if q.ArmWriteWait(n) {
			q.DisarmWriteWait()
			return nil
		}
		if err := w.Wait(deadline); err != nil {
			q.DisarmWriteWait()
			return err
		}
		if ready() {
			q.DisarmWriteWait()
			return nil
		}
	}
}
