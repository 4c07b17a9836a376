package tcpstack

import (
	"errors"
	"sync"
	"time"
)

// ErrBellClosed is what Wait returns once the bell is closed.
var ErrBellClosed = errors.New("tcpstack: bell closed")

// Bell wakes a pump (or a listening socket's goroutine) from inside the
// daemon: the engine rings it when the client announces the socket, the
// stack's events ring it. It is a channel, not an eventfd, because every
// ringer is in this process: a goroutine woken through a channel is
// runnable at once (on the ringer's P when that P is about to park, as a
// stack processor goroutine is after a segment), while an eventfd's reader
// waits for the runtime's network poller, which a process whose Ps are
// busy polls only every few milliseconds (measured: the daemon's pump
// woke 80 µs to several ms after the stack's event; docs/benchmarks.md).
// It costs no file descriptor.
type Bell struct {
	ch     chan struct{}
	closed chan struct{}
	once   sync.Once
}

// NewBell returns a bell that has not been rung.
func NewBell() *Bell {
	return &Bell{ch: make(chan struct{}, 1), closed: make(chan struct{})}
}

// Wake rings the bell; rings before the next Wait coalesce. It never
// blocks, also after Close.
func (b *Bell) Wake() error {
	select {
	case b.ch <- struct{}{}:
	default:
	}
	return nil
}

// Wait waits until the bell was rung since the last Wait, the deadline
// passes (the zero time: no deadline; nil is returned either way, the
// caller re-checks its conditions) or the bell is closed (ErrBellClosed).
func (b *Bell) Wait(deadline time.Time) error {
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-b.ch:
		return nil
	case <-b.closed:
		return ErrBellClosed
	case <-timeout:
		return nil
	}
}

// Close wakes a Wait for good. Closing twice is a no-op.
func (b *Bell) Close() error {
	b.once.Do(func() { close(b.closed) })
	return nil
}
