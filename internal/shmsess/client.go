package shmsess

import (
	"sync"
	"time"

	"github.com/bypassd/bypassd/internal/shmq"
)

// Waker wakes one sleeper (an eventfd's shmq.Waiter, a shmq.Signal).
type Waker interface{ Wake() error }

// Announcer is a client socket's sockq.Announcer: it announces the socket
// on its lane and writes the lane's doorbell if the engine sleeps.
type Announcer struct {
	s          *Session
	lane, slot int
	doorbell   Waker
}

// NewAnnouncer returns the announcer of slot on lane.
func NewAnnouncer(s *Session, lane, slot int, doorbell Waker) *Announcer {
	return &Announcer{s: s, lane: lane, slot: slot, doorbell: doorbell}
}

// Wake announces (see Session.Announce).
func (a *Announcer) Wake() error {
	if a.s.Announce(a.lane, a.slot) {
		return a.doorbell.Wake()
	}
	return nil
}

// Dispatcher is the client side of the events bitmap: a goroutine that
// sleeps on the client eventfd, drains the bitmap when woken and wakes
// whatever waits on each named slot. One per session.
type Dispatcher struct {
	s    *Session
	wait *shmq.Waiter
	mu   sync.Mutex
	// slots[slot] is woken when the daemon names slot.
	slots map[int]Waker
	done  chan struct{}
}

// NewDispatcher starts dispatching s's events; the daemon wakes wait (the
// client eventfd, which the Dispatcher owns and closes on Close).
func NewDispatcher(s *Session, wait *shmq.Waiter) *Dispatcher {
	d := &Dispatcher{s: s, wait: wait, slots: map[int]Waker{}, done: make(chan struct{})}
	go d.run()
	return d
}

// Register makes events for slot wake w (replacing what was there).
func (d *Dispatcher) Register(slot int, w Waker) {
	d.mu.Lock()
	d.slots[slot] = w
	d.mu.Unlock()
}

// Unregister forgets slot; later events for it are ignored.
func (d *Dispatcher) Unregister(slot int) {
	d.mu.Lock()
	delete(d.slots, slot)
	d.mu.Unlock()
}

// Close stops the goroutine and closes the eventfd.
func (d *Dispatcher) Close() {
	_ = d.wait.Close()
	<-d.done
}

func (d *Dispatcher) run() {
	defer close(d.done)
	var batch []Waker
	collect := func(slot int) {
		if w := d.slots[slot]; w != nil {
			batch = append(batch, w)
		}
	}
	for {
		d.mu.Lock()
		d.s.Events().Drain(collect)
		d.mu.Unlock()
		for _, w := range batch {
			_ = w.Wake()
		}
		clear(batch)
		batch = batch[:0]
		if d.s.ArmClientSleep() {
			d.s.DisarmClientSleep()
			continue
		}
		if err := d.wait.Wait(time.Time{}); err != nil {
			return // closed
		}
	}
}
