package socket

import (
	"errors"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/internal/sockq"
)

// qwait is the user side of a socket's two queues as its waits see them:
// the queues in the session memory (where slot is the socket's bit), the
// signals the session's dispatcher wakes, the announcer that tells the
// daemon about TX work, the spin policy and the deadlines. UDPConn and
// TCPConn embed it.
type qwait struct {
	client         *Client
	slot           int
	released       bool // release gave up the session memory (under the socket's life lock)
	tx, rx         *shmq.Queue
	rxWait, txWait *shmq.Signal
	doorbell       interface{ Wake() error }
	// policy decides how long waits spin before sleeping (the Client's).
	policy shmq.Policy
	// Deadlines as UnixNano (0: none), read at every wait so that a change
	// applies to pending calls too (net.Conn's contract); sleepers counts
	// goroutines asleep on the waiter, which SetDeadline then wakes.
	rdl, wdl       atomic.Int64
	rsleep, wsleep atomic.Int32
}

// release stops the session's wake-ups of the socket and drops its
// reference to the session memory (unmapped with the last one). The
// caller holds the socket's life lock exclusively, so no call is in the
// queues.
func (u *qwait) release() {
	if !u.released && u.client != nil {
		u.released = true
		u.client.cs.Forget(u.slot)
		u.client.releaseSession()
	}
}

// wait blocks until the RX queue has a record (write false) or the TX queue
// has room for an n-byte record payload (write true), spinning first as the policy
// says. It returns sockq.ErrTimeout at the deadline dl, shmq.ErrClosed when
// the waiter closes (Close, daemon gone) and errDeadlineChanged when the
// deadline was changed, so the caller re-reads it. It exists beside
// shmq.Policy because those waits cannot be interrupted by a new deadline.
func (u *qwait) wait(write bool, n int, dl int64) error {
	q, w, dlp, sleepers := u.rx, u.rxWait, &u.rdl, &u.rsleep
	if write {
		q, w, dlp, sleepers = u.tx, u.txWait, &u.wdl, &u.wsleep
	}
	ready := func() bool {
		if write {
			return q.Writable(n)
		}
		return q.Readable()
	}
	if ready() {
		return nil
	}
	if spin := u.policy.Spin; spin != 0 {
		start := time.Now()
		for i := 1; ; i++ {
			if ready() {
				return nil
			}
			if i%spinCheckEvery != 0 {
				continue
			}
			if w.Closed() {
				return shmq.ErrClosed
			}
			if dlp.Load() != dl {
				return errDeadlineChanged
			}
			now := time.Now()
			if dl != 0 && now.UnixNano() >= dl {
				return sockq.ErrTimeout
			}
			if spin > 0 && now.Sub(start) >= spin {
				break
			}
			runtime.Gosched() // the engine may share this CPU
		}
	}
	arm := func() bool {
		if write {
			return q.ArmWriteWait(n)
		}
		return q.ArmReadWait()
	}
	disarm := func() {
		if write {
			q.DisarmWriteWait()
		} else {
			q.DisarmReadWait()
		}
	}
	// Announce the sleeper before re-reading the deadline: SetDeadline stores
	// the deadline before reading the count, so one of the two sees the other.
	sleepers.Add(1)
	defer sleepers.Add(-1)
	var deadline time.Time
	if dl != 0 {
		deadline = time.Unix(0, dl)
	}
	for {
		if arm() {
			disarm()
			return nil
		}
		if dlp.Load() != dl {
			disarm()
			return errDeadlineChanged
		}
		if err := w.Wait(deadline); err != nil {
			disarm()
			if errors.Is(err, shmq.ErrTimeout) {
				return sockq.ErrTimeout
			}
			return err
		}
		if ready() {
			disarm()
			return nil
		}
		if dlp.Load() != dl {
			disarm()
			return errDeadlineChanged
		}
	}
}
