package ring

import (
	"sync"
	"sync/atomic"

	"github.com/bypassd/bypassd/ring/qp"
)

// Handoff between the rings of one interface.
//
// An AF_XDP socket accepts only frames received on its own queue, and RSS
// spreads a NIC's flows over all queues. So the XDP program redirects a
// flow's frames to the socket of the queue that received them, tagged with
// the flow's home (qp.Frame.Home: the queue of the ring whose endpoints own
// the flow). A ring that receives a frame homed elsewhere copies it into the
// home ring's inbox; the home engine takes it from there as if it had
// received it. Only the home engine ever writes its endpoints' RX queues, so
// each stays single-producer. A flow's frames arrive on one queue (RSS hashes
// the flow) and pass one inbox in order, so nothing is reordered within a
// flow.
//
// The inbox is a bounded lock-free multi-producer queue (Vyukov's sequence
// numbered slots): the receiving engines push, the home engine pops. A full
// inbox drops the frame and counts it (RXHandoffDropped at the receiving
// ring), as a NIC drops on a full RX ring.

// handoffSlots is the capacity of a ring's inbox in frames: 16 bursts of
// 64, about 2 MiB with 2048-byte frames.
const handoffSlots = 1024

type handoffSlot struct {
	seq  atomic.Uint64
	n    int
	hwts uint64
}

type inbox struct {
	frameSize int
	mask      uint64
	slots     []handoffSlot
	buf       []byte
	// tail is where the next producer writes (shared, CAS); head is the
	// consumer's (the home engine's only).
	tail atomic.Uint64
	_    [56]byte // keep the producers' word off the consumer's line
	head uint64
}

func newInbox(n, frameSize int) *inbox {
	ib := &inbox{frameSize: frameSize, mask: uint64(n - 1), slots: make([]handoffSlot, n), buf: make([]byte, n*frameSize)}
	for i := range ib.slots {
		ib.slots[i].seq.Store(uint64(i))
	}
	return ib
}

// push copies frame into the inbox; false when it is full (or the frame
// does not fit a slot).
func (ib *inbox) push(frame []byte, hwts uint64) bool {
	if len(frame) > ib.frameSize {
		return false
	}
	pos := ib.tail.Load()
	var s *handoffSlot
	for {
		s = &ib.slots[pos&ib.mask]
		seq := s.seq.Load()
		switch d := int64(seq - pos); {
		case d == 0:
			if ib.tail.CompareAndSwap(pos, pos+1) {
				goto claimed
			}
			pos = ib.tail.Load()
		case d < 0:
			return false // full: the consumer has not freed this slot
		default:
			pos = ib.tail.Load() // another producer took it
		}
	}
claimed:
	i := int(pos & ib.mask)
	copy(ib.buf[i*ib.frameSize:], frame)
	s.n, s.hwts = len(frame), hwts
	s.seq.Store(pos + 1)
	return true
}

// peek returns the oldest frame, or ok=false when there is none. The frame
// stays valid until pop.
func (ib *inbox) peek() (frame []byte, hwts uint64, ok bool) {
	s := &ib.slots[ib.head&ib.mask]
	if s.seq.Load() != ib.head+1 {
		return nil, 0, false
	}
	i := int(ib.head & ib.mask)
	return ib.buf[i*ib.frameSize : i*ib.frameSize+s.n], s.hwts, true
}

// pop frees the frame peek returned.
func (ib *inbox) pop() {
	ib.slots[ib.head&ib.mask].seq.Store(ib.head + ib.mask + 1)
	ib.head++
}

// pending reports whether a frame waits (for the engine about to sleep).
func (ib *inbox) pending() bool {
	return ib.slots[ib.head&ib.mask].seq.Load() == ib.head+1
}

// ringGroup is the rings of one interface (in one network namespace) of
// this process, indexed by queue: where a receiving ring finds a frame's
// home ring.
type ringGroup struct {
	rings atomic.Pointer[map[uint32]*Ring]
	refs  int
}

var ringGroups = struct {
	sync.Mutex
	m map[qp.IfaceKey]*ringGroup
}{m: map[qp.IfaceKey]*ringGroup{}}

// joinGroup registers r as the ring of its queue. Runs on a thread in the
// interface's namespace.
func (r *Ring) joinGroup() error {
	key, err := qp.IfaceKeyOf(r.ifindex)
	if err != nil {
		return err
	}
	ringGroups.Lock()
	defer ringGroups.Unlock()
	g := ringGroups.m[key]
	if g == nil {
		g = &ringGroup{}
		g.rings.Store(&map[uint32]*Ring{})
		ringGroups.m[key] = g
	}
	next := map[uint32]*Ring{}
	for q, o := range *g.rings.Load() {
		next[q] = o
	}
	next[uint32(r.cfg.Queue)] = r
	g.rings.Store(&next)
	g.refs++
	r.group, r.groupKey = g, key
	return nil
}

// leaveGroup unregisters r: other rings stop handing it frames (a frame
// pushed a moment before stays in its inbox and goes with it).
func (r *Ring) leaveGroup() {
	g := r.group
	if g == nil {
		return
	}
	ringGroups.Lock()
	defer ringGroups.Unlock()
	next := map[uint32]*Ring{}
	for q, o := range *g.rings.Load() {
		if o != r {
			next[q] = o
		}
	}
	g.rings.Store(&next)
	if g.refs--; g.refs == 0 {
		delete(ringGroups.m, r.groupKey)
	}
}

// handOff passes a frame whose flow is homed on another ring to that
// ring's inbox. It reports false when the frame was dropped (no such ring,
// or its inbox full).
func (e *engine) handOff(f *qp.Frame) bool {
	r := e.r
	home := (*r.group.rings.Load())[f.Home]
	if home == nil || !home.inbox.push(f.Buf, f.HWTimestamp) {
		r.stats.RXHandoffDropped.Add(1)
		return false
	}
	r.stats.RXHandedOff.Add(1)
	for _, w := range e.woken {
		if w == home {
			return true
		}
	}
	e.woken = append(e.woken, home)
	return true
}

// wakeHomes wakes the sleeping engines of the rings this burst handed
// frames to (once per ring and burst).
func (e *engine) wakeHomes() {
	for _, home := range e.woken {
		if home.sleeping.Load() {
			home.doorbell.Wake()
		}
	}
	e.woken = e.woken[:0]
}
