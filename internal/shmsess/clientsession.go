package shmsess

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/internal/sockq"
)

// ClientSession is a client's side of its session memory: the mapping, the
// dispatcher of the events bitmap and the lanes' doorbells. The socket
// package and the daemon's tests use it; the C preload library implements
// the same from docs/shm-queue.md.
type ClientSession struct {
	s     *Session
	mem   []byte
	disp  *Dispatcher
	bells []*shmq.Bell
}

// OpenClientSession maps the session memory a HELLO reply announced
// (maxSlots sockets, lanes lanes, size bytes) from its descriptors: the
// memfd, the client eventfd, then one doorbell per lane. It owns fds from
// the call on and closes each one it does not keep, also on error.
func OpenClientSession(maxSlots, lanes int, size uint64, fds []int) (_ *ClientSession, err error) {
	c := &ClientSession{}
	defer func() {
		for _, fd := range fds {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
		if err != nil {
			c.Close()
		}
	}()
	if len(fds) != 2+lanes || lanes < 1 {
		return nil, fmt.Errorf("session memory: %d descriptors for %d lanes (want 2 + lanes): %w", len(fds), lanes, unix.EPROTO)
	}
	if size == 0 || size > 1<<47 {
		return nil, fmt.Errorf("session memory of %d bytes: %w", size, unix.EPROTO)
	}
	if c.mem, err = shmq.MapMemfd(fds[0], int(size)); err != nil {
		return nil, fmt.Errorf("map the session memory: %w", err)
	}
	if c.s, err = Attach(c.mem, maxSlots, lanes); err != nil {
		return nil, err
	}
	take := func(i int) (*shmq.Waiter, error) {
		fd := fds[i]
		fds[i] = -1 // NewWaiterFD owns it from here, also on error
		return shmq.NewWaiterFD(fd)
	}
	wake, err := take(1)
	if err != nil {
		return nil, fmt.Errorf("client eventfd: %w", err)
	}
	c.disp = NewDispatcher(c.s, wake)
	for i := range lanes {
		// A doorbell is only rung from here: a Bell, not a Waiter, or
		// every client's netpoller wakes whenever any client rings it.
		fd := fds[2+i]
		fds[2+i] = -1 // NewBellFD owns it from here, also on error
		b, err := shmq.NewBellFD(fd)
		if err != nil {
			return nil, fmt.Errorf("doorbell of lane %d: %w", i, err)
		}
		c.bells = append(c.bells, b)
	}
	return c, nil
}

// QueueOffsets are where an OPEN reply puts a socket.
type QueueOffsets struct {
	Slot, Lane         int
	TXOffset, RXOffset uint64
	QueueBytes         int
}

// SocketQueues are a client socket's queues and what its user side sleeps
// on and announces with.
type SocketQueues struct {
	TX, RX         *shmq.Queue
	RXWait, TXWait *shmq.Signal
	Announce       *Announcer
}

// Conn returns the user side over q.
func (q SocketQueues) Conn(policy shmq.Policy) *sockq.Conn {
	return sockq.New(q.TX, q.RX, q.RXWait, q.TXWait, q.Announce, policy)
}

// Socket attaches the queues of a socket the daemon opened: woken through
// the dispatcher, announcing on its lane.
func (c *ClientSession) Socket(q QueueOffsets) (SocketQueues, error) {
	l := c.s.Layout()
	if q.Slot < 0 || q.Slot >= l.MaxSlots || q.Lane < 0 || q.Lane >= l.Lanes {
		return SocketQueues{}, fmt.Errorf("slot %d / lane %d outside the session's %d slots and %d lanes: %w", q.Slot, q.Lane, l.MaxSlots, l.Lanes, unix.EPROTO)
	}
	txm, err := c.s.Queue(q.TXOffset, q.QueueBytes)
	if err != nil {
		return SocketQueues{}, fmt.Errorf("send queue: %w: %w", err, unix.EPROTO)
	}
	rxm, err := c.s.Queue(q.RXOffset, q.QueueBytes)
	if err != nil {
		return SocketQueues{}, fmt.Errorf("receive queue: %w: %w", err, unix.EPROTO)
	}
	tx, err := shmq.Attach(txm)
	if err != nil {
		return SocketQueues{}, fmt.Errorf("attach the send queue: %w", err)
	}
	rx, err := shmq.Attach(rxm)
	if err != nil {
		return SocketQueues{}, fmt.Errorf("attach the receive queue: %w", err)
	}
	if tx.Capacity() != q.QueueBytes || rx.Capacity() != q.QueueBytes {
		return SocketQueues{}, fmt.Errorf("queues of %d and %d bytes where the daemon said %d: %w", tx.Capacity(), rx.Capacity(), q.QueueBytes, unix.EPROTO)
	}
	sq := SocketQueues{TX: tx, RX: rx, RXWait: shmq.NewSignal(), TXWait: shmq.NewSignal(),
		Announce: NewAnnouncer(c.s, q.Lane, q.Slot, c.bells[q.Lane])}
	c.disp.Register(q.Slot, signals{sq.RXWait, sq.TXWait})
	return sq, nil
}

// Announced reports whether lane i's announce bitmap has bits the engine
// has not drained yet (tests wait on it).
func (c *ClientSession) Announced(lane int) bool { return c.s.Lane(lane).Pending() }

// Forget stops waking slot's socket (after its CLOSE, or when it was never
// used).
func (c *ClientSession) Forget(slot int) { c.disp.Unregister(slot) }

// Close stops the dispatcher, closes the doorbells and unmaps the memory.
// No socket of the session may be used afterwards.
func (c *ClientSession) Close() error {
	if c.disp != nil {
		c.disp.Close()
		c.disp = nil
	}
	for _, b := range c.bells {
		_ = b.Close()
	}
	c.bells = nil
	var err error
	if c.mem != nil {
		err = shmq.Unmap(c.mem)
		c.mem = nil
	}
	return err
}

// signals wakes a socket's reader and writer: an event says "look at this
// socket", not which side.
type signals [2]*shmq.Signal

func (s signals) Wake() error {
	return errors.Join(s[0].Wake(), s[1].Wake())
}
