package ring

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/internal/shmsess"
)

// Lane is one client session's announce bitmap for this ring (its lane
// block in the session memory) and the endpoints bound through it, by
// slot. A lane the engine is not serving stays armed (its sleep flag set),
// so its client rings the lane's own doorbell when it announces; the
// engine, which polls every lane doorbell through one epoll set, then
// serves the lane (disarmed, "hot") until it has been quiet for a while or
// the engine sleeps. So neither an engine pass nor going to sleep touches
// the lanes of idle sessions: the engine's work follows the sessions with
// something to do, however many are open.
type Lane struct {
	r  *Ring
	ln *shmsess.Lane
	// bell is the lane's doorbell (owned by the caller of AddLane), or
	// nil for a lane whose client rings the ring's shared doorbell (a
	// session adopted from a daemon that had no lane doorbells): the
	// engine then scans those lanes when that rings.
	bell *shmq.Bell
	// closed is set by Close; the engine drops the lane without
	// touching its block again.
	closed atomic.Bool
	// hot and quiet are the engine's: the lane is on its hot list, and
	// for how many passes in a row it announced nothing.
	hot   bool
	quiet int
	// chunks[slot/laneChunkSlots][slot%laneChunkSlots] is the endpoint
	// bound with that slot; chunks are allocated on first use so that a
	// session's table costs memory for the slots it uses.
	chunks []atomic.Pointer[laneChunk]
	// wakers are the slots announced for something other than an
	// endpoint (a stream socket's pump, see SetWaker); nWakers says
	// whether to look.
	wakers  sync.Map // int -> Waker
	nWakers atomic.Int64
	// early has a bit per slot announced while no endpoint was filed under
	// it (records queued before the bind): the bind that files one there
	// has the engine visit it; other binds leave a sleeping engine alone.
	early []atomic.Uint64
}

const laneChunkSlots = 256

type laneChunk [laneChunkSlots]atomic.Pointer[Endpoint]

// AddLane registers a session's lane block with the ring for slots 0 ..
// slots-1, with bell the lane's doorbell, which the session's client
// writes when it finds the lane armed (nil: the client writes the
// ring's shared Doorbell). The caller keeps owning bell and closes it
// after the lane. Close the lane when the session ends (after its
// endpoints).
func (r *Ring) AddLane(ln *shmsess.Lane, slots int, bell *shmq.Bell) (*Lane, error) {
	chunks := (slots + laneChunkSlots - 1) / laneChunkSlots
	l := &Lane{r: r, ln: ln, bell: bell, chunks: make([]atomic.Pointer[laneChunk], chunks),
		early: make([]atomic.Uint64, chunks*laneChunkSlots/64)}
	if bell != nil {
		if err := r.watchDoorbell(bell.FD(), unix.EPOLL_CTL_ADD); err != nil {
			return nil, fmt.Errorf("ring %s/%d: watch a lane doorbell (fd %d): %w (one epoll watch per client session and ring: raise fs.epoll.max_user_watches)", r.cfg.Interface, r.cfg.Queue, bell.FD(), err)
		}
	}
	// Armed from the start; the engine looks at the lane once (the ring
	// or lane doorbell below) in case the block holds announcements
	// already (a ring opened again, an adopted session).
	_ = l.ln.ArmSleep()
	r.mu.Lock()
	old := r.lanes.Load()
	next := append(slices.Clone(*old), l)
	r.lanes.Store(&next)
	r.mu.Unlock()
	if bell != nil {
		_ = bell.Wake()
	} else {
		_ = r.doorbell.Wake()
	}
	return l, nil
}

// Close unregisters the lane; when it returns the engine no longer reads
// its bitmap or polls its doorbell.
func (l *Lane) Close() {
	r := l.r
	l.closed.Store(true)
	r.mu.Lock()
	old := *r.lanes.Load()
	next := slices.DeleteFunc(slices.Clone(old), func(x *Lane) bool { return x == l })
	r.lanes.Store(&next)
	r.mu.Unlock()
	if l.bell != nil {
		_ = r.watchDoorbell(l.bell.FD(), unix.EPOLL_CTL_DEL)
	}
	r.sync()
}

func (l *Lane) endpoint(slot int) *Endpoint {
	i := slot / laneChunkSlots
	if i >= len(l.chunks) {
		return nil
	}
	c := l.chunks[i].Load()
	if c == nil {
		return nil
	}
	return c[slot%laneChunkSlots].Load()
}

// SetWaker makes an announcement of slot wake w (from the engine) instead
// of visiting an endpoint: how a stream socket's client reaches the
// socket's pump. Nil removes it.
func (l *Lane) SetWaker(slot int, w Waker) {
	if w == nil {
		if _, ok := l.wakers.LoadAndDelete(slot); ok {
			l.nWakers.Add(-1)
		}
		return
	}
	if _, loaded := l.wakers.Swap(slot, w); !loaded {
		l.nWakers.Add(1)
	}
}

// wake wakes slot's waker and reports whether it has one.
func (l *Lane) wake(slot int) bool {
	if l.nWakers.Load() == 0 {
		return false
	}
	w, ok := l.wakers.Load(slot)
	if ok {
		_ = w.(Waker).Wake()
	}
	return ok
}

// markEarly notes that slot was announced with no endpoint filed under it
// (see early) and returns the endpoint filed meanwhile, if any. The bit is
// set before the endpoint is read and Bind files the endpoint before it
// takes the bit (takeEarly), so one of the two visits it.
func (l *Lane) markEarly(slot int) *Endpoint {
	if w := slot / 64; w < len(l.early) {
		l.early[w].Or(1 << (slot % 64))
	}
	return l.endpoint(slot)
}

// takeEarly clears slot's early bit and reports whether it was set.
func (l *Lane) takeEarly(slot int) bool {
	bit := uint64(1) << (slot % 64)
	return l.early[slot/64].And(^bit)&bit != 0
}

func (l *Lane) valid(slot int) bool { return slot >= 0 && slot/laneChunkSlots < len(l.chunks) }

// setEndpoint files ep (nil: none) under a valid slot. Holds the ring's mu
// or is the retire path of the slot's own endpoint.
func (l *Lane) setEndpoint(slot int, ep *Endpoint) {
	i := slot / laneChunkSlots
	c := l.chunks[i].Load()
	if c == nil {
		c = new(laneChunk)
		l.chunks[i].Store(c)
	}
	c[slot%laneChunkSlots].Store(ep)
}

// inprocAnnouncer is the Announcer of an endpoint whose user is in this
// process: it queues the endpoint for the engine's next iteration.
type inprocAnnouncer struct{ ep *Endpoint }

func (a inprocAnnouncer) Wake() error {
	a.ep.r.announce(a.ep)
	return nil
}

// announce queues ep for the engine and rings the doorbell if it sleeps.
// It is lock-free (a push onto a stack the engine takes whole): a sender
// preempted inside a lock would stall an engine running at real-time
// priority on its CPU.
func (r *Ring) announce(ep *Endpoint) {
	if ep.announced.Swap(true) {
		return // still queued: the engine will look at it
	}
	for {
		old := r.inproc.Load()
		ep.nextAnnounced.Store(old)
		if r.inproc.CompareAndSwap(old, ep) {
			break
		}
	}
	// The CAS orders the push before the load (Dekker against the
	// engine's sleeping swap followed by its load of inproc).
	if r.sleeping.Load() {
		_ = r.doorbell.Wake()
	}
}

// sessionWaker wakes a client's socket through the session's events
// bitmap, writing the client eventfd only if the client sleeps.
type sessionWaker struct {
	s      *shmsess.Session
	slot   int
	client Waker
}

// SessionWaker returns the Waker of the socket in slot of session s, whose
// client sleeps on client.
func SessionWaker(s *shmsess.Session, slot int, client Waker) Waker {
	return sessionWaker{s: s, slot: slot, client: client}
}

func (w sessionWaker) Wake() error {
	if w.s.Event(w.slot) {
		return w.client.Wake()
	}
	return nil
}

// Waker wakes an endpoint's user (or its engine).
type Waker interface{ Wake() error }

// multiWaker wakes every waker in it (an in-process user's reader and
// writer: the engine does not say which of them it means).
type multiWaker []Waker

func (m multiWaker) Wake() error {
	for _, w := range m {
		_ = w.Wake()
	}
	return nil
}
