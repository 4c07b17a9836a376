package shmq

import (
	"sync"
	"sync/atomic"
	"time"
)

// Signal is an in-process Sleeper: one wake-up token in a channel. The
// session-memory client (package socket) gives each socket one, woken by the
// goroutine that drains the session's events bitmap, so a socket costs no
// file descriptor. Only one goroutine should Wait at a time.
type Signal struct {
	ch     chan struct{}
	done   chan struct{}
	once   sync.Once
	closed atomic.Bool
}

// NewSignal returns a Signal without a pending token.
func NewSignal() *Signal {
	return &Signal{ch: make(chan struct{}, 1), done: make(chan struct{})}
}

// Wake leaves one token (several Wakes before a Wait leave one).
func (s *Signal) Wake() error {
	if s.closed.Load() {
		return ErrClosed
	}
	select {
	case s.ch <- struct{}{}:
	default:
	}
	return nil
}

// Wait consumes the token, sleeping until there is one, the deadline (zero:
// none) passes (ErrTimeout) or Close (ErrClosed).
func (s *Signal) Wait(deadline time.Time) error {
	if s.closed.Load() {
		return ErrClosed
	}
	select {
	case <-s.ch:
		return nil
	default:
	}
	var timeout <-chan time.Time
	if !deadline.IsZero() {
		d := time.Until(deadline)
		if d <= 0 {
			return ErrTimeout
		}
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-s.ch:
		return nil
	case <-s.done:
		return ErrClosed
	case <-timeout:
		return ErrTimeout
	}
}

// Closed reports whether Close was called.
func (s *Signal) Closed() bool { return s.closed.Load() }

// Close unblocks a Wait with ErrClosed; later Waits and Wakes fail.
func (s *Signal) Close() error {
	s.once.Do(func() {
		s.closed.Store(true)
		close(s.done)
	})
	return nil
}
