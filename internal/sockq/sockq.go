// Package sockq is the user side of a socket's pair of shared-memory queues:
// it turns send and receive calls into internal/dgram records on the TX and
// RX queues (internal/shmq), waits for data or room with the spin-then-sleep
// policy, and announces the socket to the ring engine when its TX queue
// becomes non-empty.
//
// Both the ring's in-process endpoints and the client shim (package socket)
// use it, so a datagram is queued the same way whether the application lives
// in the daemon's process or not. It does not validate addresses against
// the socket's binding (its callers know the binding) and owns neither the
// memory nor the engine side of the queues.
package sockq

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/dgram"
	"github.com/bypassd/bypassd/internal/shmq"
)

// Waiter is what a blocked send or receive sleeps on: an eventfd
// (shmq.Waiter) or an in-process shmq.Signal.
type Waiter interface {
	shmq.Sleeper
	Close() error
}

// Announcer tells the engine that the TX queue went from empty to
// non-empty while the engine was waiting for that (the publish reported a
// waiting consumer): it sets the socket's announce bit and rings the
// engine's doorbell if the engine sleeps.
type Announcer interface {
	Wake() error
}

// Conn is the user side of one socket's queues. Send and receive calls may
// come from any goroutines; sends are serialized among themselves, and so are
// receives.
type Conn struct {
	tx, rx *shmq.Queue
	// rxWait is woken by the engine when it publishes into rx to a waiting
	// reader; txWait when it releases room in tx to a waiting writer.
	rxWait, txWait Waiter
	announce       Announcer
	policy         shmq.Policy

	txMu, rxMu sync.Mutex
	closed     atomic.Bool
	// broken holds the reason the queues became unusable (the daemon
	// went away or a queue is corrupt), if any.
	broken atomic.Pointer[error]
}

// New returns the user side over tx (which it produces into) and rx (which
// it consumes from).
func New(tx, rx *shmq.Queue, rxWait, txWait Waiter, announce Announcer, policy shmq.Policy) *Conn {
	return &Conn{tx: tx, rx: rx, rxWait: rxWait, txWait: txWait, announce: announce, policy: policy}
}

// Message is one received datagram.
type Message struct {
	// Buf receives the payload; N is how many bytes were stored (a longer
	// datagram is truncated, as recvfrom(2) does).
	Buf  []byte
	N    int
	Addr netip.AddrPort
	// Header is the record's header: sender, flags, timestamps.
	Header dgram.Header
}

// ErrTimeout is what a deadline produces: it matches both EAGAIN (like the
// kernel's SO_RCVTIMEO) and os.ErrDeadlineExceeded (like Go's net package),
// and is a net.Error with Timeout() true.
var ErrTimeout error = timeoutError{}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }
func (timeoutError) Is(target error) bool {
	return target == os.ErrDeadlineExceeded || target == unix.EAGAIN
}

// SendBatch queues each message as one datagram to dst (the zero AddrPort:
// the socket's connected peer, resolved by the engine) and returns how many
// were queued. While the TX queue is full it waits until the deadline (zero:
// none; in the past: never waits, returning ErrTimeout). Payload limits are
// the caller's to check; a record that can never fit yields EMSGSIZE.
func (c *Conn) SendBatch(msgs [][]byte, dst netip.AddrPort, deadline time.Time) (int, error) {
	c.txMu.Lock()
	defer c.txMu.Unlock()
	h := dgram.Header{Addr: dst}
	sent := 0
	var err error
	for sent < len(msgs) {
		if err = c.usable(); err != nil {
			break
		}
		m := msgs[sent]
		rec, rerr := c.tx.Reserve(dgram.HeaderLen + len(m))
		if rerr == nil {
			dgram.Put(rec, &h)
			copy(rec[dgram.HeaderLen:], m)
			if err = c.tx.Commit(dgram.HeaderLen+len(m), dgram.TypeDatagram); err != nil {
				break
			}
			sent++
			continue
		}
		if errors.Is(rerr, shmq.ErrTooBig) {
			err = fmt.Errorf("send %d bytes: larger than the socket's queue allows (%d): %w", len(m), c.tx.MaxPayload()-dgram.HeaderLen, unix.EMSGSIZE)
			break
		}
		if !errors.Is(rerr, shmq.ErrFull) {
			err = c.fail(fmt.Errorf("send queue: %w", rerr))
			break
		}
		// Full: let the engine see what is queued, then wait for room.
		c.publishTX()
		if err = c.waitErr(c.policy.WaitWritable(c.tx, dgram.HeaderLen+len(m), c.txWait, deadline)); err != nil {
			break
		}
	}
	c.publishTX()
	return sent, err
}

func (c *Conn) publishTX() {
	if c.tx.Publish() {
		_ = c.announce.Wake()
	}
}

// RecvBatch waits until a datagram is queued (or the deadline passes, or the
// Conn closes), then fills msgs with the datagrams already queued, without
// waiting again, and returns how many.
func (c *Conn) RecvBatch(msgs []Message, deadline time.Time) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	c.rxMu.Lock()
	defer c.rxMu.Unlock()
	for {
		if c.closed.Load() {
			return 0, net.ErrClosed
		}
		n := 0
		for n < len(msgs) {
			rec, _, err := c.rx.Peek()
			if err != nil {
				if !errors.Is(err, shmq.ErrEmpty) {
					return n, c.fail(fmt.Errorf("receive queue: %w", err))
				}
				break
			}
			m := &msgs[n]
			payload, perr := dgram.Parse(rec, &m.Header)
			if perr == nil {
				m.N = copy(m.Buf, payload)
				m.Addr = m.Header.Addr
				n++
			}
			c.rx.Advance()
		}
		if n > 0 {
			// The engine never waits for RX room (a full queue drops and
			// counts), so a release has nobody to wake.
			c.rx.Release()
			return n, nil
		}
		if err := c.usable(); err != nil {
			return 0, err
		}
		if err := c.waitErr(c.policy.WaitReadable(c.rx, c.rxWait, deadline)); err != nil {
			return 0, err
		}
	}
}

// Readable reports whether a receive would find a datagram now.
func (c *Conn) Readable() bool { return c.rx.Readable() }

// Writable reports whether a datagram of n bytes fits the TX queue now.
func (c *Conn) Writable(n int) bool { return c.tx.Writable(dgram.HeaderLen + n) }

// Close makes pending and future calls return net.ErrClosed. It closes the
// user side's waiters (not the queues' memory, which the caller owns).
func (c *Conn) Close() {
	c.closed.Store(true)
	_ = c.rxWait.Close()
	_ = c.txWait.Close()
}

// Break makes pending and future calls fail with reason (wrapping
// net.ErrClosed), for example when the daemon went away.
func (c *Conn) Break(reason error) {
	err := fmt.Errorf("%w: %w", net.ErrClosed, reason)
	c.broken.CompareAndSwap(nil, &err)
	_ = c.rxWait.Close()
	_ = c.txWait.Close()
}

func (c *Conn) fail(err error) error {
	c.Break(err)
	return c.usable()
}

func (c *Conn) usable() error {
	if c.closed.Load() {
		return net.ErrClosed
	}
	if p := c.broken.Load(); p != nil {
		return *p
	}
	return nil
}

// waitErr turns a queue wait's error into what a socket user expects.
func (c *Conn) waitErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, shmq.ErrTimeout):
		return ErrTimeout
	case errors.Is(err, shmq.ErrClosed):
		if uerr := c.usable(); uerr != nil {
			return uerr
		}
		return net.ErrClosed
	}
	return err
}
