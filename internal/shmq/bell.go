package shmq

import (
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Bell is the waking side of an eventfd that the peer sleeps on, and
// nothing else: unlike a Waiter it is not registered with this process's
// netpoller. That matters for an eventfd many processes share, like a
// ring's doorbell, which every client session holds: an eventfd signals
// every epoll set it is in on each write and each read, so a Waiter over it
// in every client woke every client's netpoller thread for each datagram
// any one of them announced (and again when the engine drained it), which
// made the busy socket's latency grow with the number of idle clients.
type Bell struct {
	fd int
	// mu keeps Close from closing fd (and the number being reused) while
	// Wake writes to it.
	mu     sync.RWMutex
	closed atomic.Bool
}

// NewBell creates a Bell over a new eventfd (EFD_NONBLOCK|EFD_CLOEXEC),
// whose sleeping side polls FD itself or is in another process.
func NewBell() (*Bell, error) {
	fd, err := newEventfd()
	if err != nil {
		return nil, err
	}
	return &Bell{fd: fd}, nil
}

// newEventfd creates a non-blocking, close-on-exec eventfd.
func newEventfd() (int, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("shmq: create eventfd: %w (check the process's open-file limit)", err)
	}
	return fd, nil
}

// NewBellFD wraps an eventfd received from the peer and takes ownership of
// fd (Close closes it, also on error). Like NewWaiterFD it refuses anything
// that is not an eventfd and sets O_NONBLOCK, so Wake never blocks.
func NewBellFD(fd int) (*Bell, error) {
	if err := adoptEventfd(fd); err != nil {
		return nil, fmt.Errorf("shmq: wrap doorbell: %w", err)
	}
	return &Bell{fd: fd}, nil
}

// FD returns the eventfd, e.g. to send it to the peer or to poll it. It
// stays owned by the Bell and is invalid after Close.
func (b *Bell) FD() int { return b.fd }

// Wake adds one wake-up token. It never blocks.
func (b *Bell) Wake() error {
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.closed.Load() {
		return ErrClosed
	}
	return addToken(b.fd)
}

// Close closes the eventfd. Closing twice returns ErrClosed.
func (b *Bell) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed.Swap(true) {
		return ErrClosed
	}
	if err := unix.Close(b.fd); err != nil {
		return fmt.Errorf("shmq: close doorbell eventfd %d: %w", b.fd, err)
	}
	return nil
}
