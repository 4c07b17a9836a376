package shmq

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// ErrClosed is returned by Waiter methods after Close.
var ErrClosed = errors.New("shmq: waiter closed")

// ErrTimeout is returned when a wait reaches its deadline. It matches
// os.ErrDeadlineExceeded with errors.Is and has Timeout() == true, like the
// net package's deadline errors.
var ErrTimeout error = timeoutError{}

type timeoutError struct{}

func (timeoutError) Error() string        { return "shmq: wait deadline exceeded" }
func (timeoutError) Timeout() bool        { return true }
func (timeoutError) Is(target error) bool { return target == os.ErrDeadlineExceeded }

// Waiter is an eventfd through which one side of a queue sleeps and the
// other side wakes it. The sleeping side calls Wait; the waking side (in the
// same process, or in the peer with the fd received over SCM_RIGHTS and
// wrapped by NewWaiterFD) calls Wake.
//
// Waiting goes through Go's netpoller, so a sleeping Wait costs a parked
// goroutine, not an OS thread, and Close unblocks it. Only one goroutine
// should Wait at a time (one wake-up token serves one sleeper).
type Waiter struct {
	// Bell wakes (FD, Wake): it writes fd directly, which avoids
	// allocating per wake-up; fd is kept there because f.Fd() would
	// switch the shared file description to blocking mode.
	Bell
	f *os.File // owns fd; Wait reads through it (netpoller, deadline, Close unblocks)
}

// NewWaiter creates a Waiter over a new eventfd (EFD_NONBLOCK|EFD_CLOEXEC).
func NewWaiter() (*Waiter, error) {
	fd, err := newEventfd()
	if err != nil {
		return nil, err
	}
	return newWaiter(fd), nil
}

// NewWaiterFD wraps an eventfd received from the peer and takes ownership of
// fd (Close closes it, also on error). It refuses anything that is not an
// eventfd, and sets O_NONBLOCK (which the peer shares) if it is missing, so a
// hostile peer cannot make Wake or Wait block a thread forever.
func NewWaiterFD(fd int) (*Waiter, error) {
	if err := adoptEventfd(fd); err != nil {
		return nil, fmt.Errorf("shmq: wrap eventfd: %w", err)
	}
	return newWaiter(fd), nil
}

// adoptEventfd checks that fd, received from the peer, is an eventfd and
// makes it non-blocking and close-on-exec; it closes fd on error.
func adoptEventfd(fd int) error {
	if fd < 0 {
		return fmt.Errorf("invalid fd %d", fd)
	}
	target, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		unix.Close(fd)
		return fmt.Errorf("identify fd %d (is /proc mounted?): %w", fd, err)
	}
	if target != "anon_inode:[eventfd]" {
		unix.Close(fd)
		return fmt.Errorf("fd %d is %q, not an eventfd; the peer sent the wrong descriptor", fd, target)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return fmt.Errorf("set O_NONBLOCK on fd %d: %w", fd, err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, unix.FD_CLOEXEC); err != nil {
		unix.Close(fd)
		return fmt.Errorf("set FD_CLOEXEC on fd %d: %w", fd, err)
	}
	return nil
}

func newWaiter(fd int) *Waiter {
	// fd is non-blocking, so os.NewFile registers it with the netpoller.
	return &Waiter{Bell: Bell{fd: fd}, f: os.NewFile(uintptr(fd), "shmq-eventfd")}
}

// addToken adds one wake-up token to the eventfd fd. It never blocks: a
// saturated eventfd counter (only possible if the peer wrote a huge
// value) already means "readable".
func addToken(fd int) error {
	buf := [8]byte{1} // the value 1 in native (little-endian) byte order
	for {
		_, err := unix.Write(fd, buf[:])
		switch err {
		case nil, unix.EAGAIN:
			return nil
		case unix.EINTR:
			continue
		default:
			return fmt.Errorf("shmq: wake eventfd %d: %w", fd, err)
		}
	}
}

// Wait sleeps until a wake-up token is available and consumes all pending
// tokens, the deadline passes (ErrTimeout; the zero time means no deadline)
// or the Waiter is closed (ErrClosed). Wake-ups may be spurious: re-check the
// condition you waited for.
func (w *Waiter) Wait(deadline time.Time) error {
	if w.closed.Load() {
		return ErrClosed
	}
	if err := w.f.SetReadDeadline(deadline); err != nil {
		if errors.Is(err, os.ErrClosed) {
			return ErrClosed
		}
		return fmt.Errorf("shmq: wait on eventfd %d: set deadline: %w", w.fd, err)
	}
	var buf [8]byte
	for {
		n, err := w.f.Read(buf[:])
		switch {
		case err == nil && n == 8:
			return nil
		case err == nil:
			// eventfd reads are all-or-nothing; anything else is not an eventfd.
			return fmt.Errorf("shmq: wait on eventfd %d: short read of %d bytes", w.fd, n)
		case errors.Is(err, os.ErrDeadlineExceeded):
			return ErrTimeout
		case errors.Is(err, os.ErrClosed):
			return ErrClosed
		case errors.Is(err, unix.EINTR):
			continue
		default:
			return fmt.Errorf("shmq: wait on eventfd %d: %w", w.fd, err)
		}
	}
}

// Closed reports whether Close was called.
func (w *Waiter) Closed() bool { return w.closed.Load() }

// Close closes the eventfd and unblocks a concurrent Wait with ErrClosed.
// Closing twice returns ErrClosed.
func (w *Waiter) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed.Swap(true) {
		return ErrClosed
	}
	if err := w.f.Close(); err != nil {
		return fmt.Errorf("shmq: close eventfd %d: %w", w.fd, err)
	}
	return nil
}
