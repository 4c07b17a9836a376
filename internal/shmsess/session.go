package shmsess

import (
	"fmt"
	"math/bits"
	"sync/atomic"
	"unsafe"
)

// Bitmap is a view of one three-level ready bitmap in session memory. Set
// may be called from any number of goroutines (or processes) at once, and
// so may Drain. Bits outside the bitmap's range, which only a broken peer
// sets, are ignored.
type Bitmap struct {
	summary *uint64
	mid     []uint64
	leaf    []uint64
	slots   int
}

func newBitmap(mem []byte, off int64, l Layout) Bitmap {
	midOff := off + 64
	leafOff := midOff + align(int64(8*l.Mids), 64)
	return Bitmap{
		summary: (*uint64)(unsafe.Pointer(&mem[off])),
		mid:     unsafe.Slice((*uint64)(unsafe.Pointer(&mem[midOff])), l.Mids),
		leaf:    unsafe.Slice((*uint64)(unsafe.Pointer(&mem[leafOff])), l.Words),
		slots:   l.MaxSlots,
	}
}

// Set sets slot's bit, bottom level first, so that a concurrent Drain
// either sees it now or finds the upper bits set later.
func (b *Bitmap) Set(slot int) {
	if slot < 0 || slot >= b.slots {
		return
	}
	w := slot / 64
	m := w / 64
	// Load first: a bit already set (a busy socket seen by a slow drainer)
	// costs no write to the shared line.
	if p := &b.leaf[w]; atomic.LoadUint64(p)&(1<<(slot%64)) == 0 {
		atomic.OrUint64(p, 1<<(slot%64))
	}
	if p := &b.mid[m]; atomic.LoadUint64(p)&(1<<(w%64)) == 0 {
		atomic.OrUint64(p, 1<<(w%64))
	}
	// The summary RMW is the announcing side's Dekker store (E): always
	// performed, so it orders before the sleep-flag load that follows.
	atomic.OrUint64(b.summary, 1<<m)
}

// Pending reports whether the summary word has any bit set (seq_cst
// load: the sleeping side's Dekker load (H)).
func (b *Bitmap) Pending() bool { return atomic.LoadUint64(b.summary) != 0 }

// Drain clears every set bit, top level first, and calls visit for each
// slot that was set, in increasing order within a pass. It returns the
// number of visits. Work is bounded by the bitmap's size.
func (b *Bitmap) Drain(visit func(slot int)) int {
	s := atomic.LoadUint64(b.summary)
	if s == 0 {
		return 0
	}
	s = atomic.SwapUint64(b.summary, 0)
	n := 0
	for s != 0 {
		m := bits.TrailingZeros64(s)
		s &= s - 1
		if m >= len(b.mid) {
			continue
		}
		x := atomic.SwapUint64(&b.mid[m], 0)
		for x != 0 {
			j := bits.TrailingZeros64(x)
			x &= x - 1
			w := 64*m + j
			if w >= len(b.leaf) {
				continue
			}
			y := atomic.SwapUint64(&b.leaf[w], 0)
			for y != 0 {
				bit := bits.TrailingZeros64(y)
				y &= y - 1
				if slot := 64*w + bit; slot < b.slots {
					visit(slot)
					n++
				}
			}
		}
	}
	return n
}

// Lane is one lane block: the engine's sleep flag and the announce bitmap.
type Lane struct {
	sleeping *uint32
	Bitmap
}

// ArmSleep is the engine's step before sleeping (Dekker (G), then (H)): it
// announces the sleep and reports whether work was announced meanwhile (do
// not sleep then).
func (ln *Lane) ArmSleep() (pending bool) {
	atomic.SwapUint32(ln.sleeping, 1)
	return ln.Pending()
}

// DisarmSleep withdraws ArmSleep after the engine woke up, so clients do
// not write the doorbell while it runs.
func (ln *Lane) DisarmSleep() {
	if atomic.LoadUint32(ln.sleeping) != 0 {
		atomic.StoreUint32(ln.sleeping, 0)
	}
}

// Session is one side's view of a session memory.
type Session struct {
	mem            []byte
	l              Layout
	events         Bitmap
	lanes          []Lane
	clientSleeping *uint32
}

// Init formats mem, a fresh (all-zero) mapping of exactly l.Size bytes, as
// an empty session memory: it writes the header only, so the bitmaps and
// the arena stay untouched (uncommitted) pages. Daemon side.
func Init(mem []byte, l Layout) (*Session, error) {
	if int64(len(mem)) != l.Size {
		return nil, fmt.Errorf("shmsess: init: %d bytes mapped, the layout needs %d", len(mem), l.Size)
	}
	if uintptr(unsafe.Pointer(&mem[0]))%PageSize != 0 {
		return nil, fmt.Errorf("shmsess: init: memory is not page aligned; map it with mmap")
	}
	writeHeader(mem, l)
	return newSession(mem, l), nil
}

// Attach validates the session memory the daemon sent (mapped whole) against
// the slots and lanes of the HELLO reply. Client side; errors wrap
// ErrCorrupt.
func Attach(mem []byte, maxSlots, lanes int) (*Session, error) {
	if len(mem) > 0 && uintptr(unsafe.Pointer(&mem[0]))%PageSize != 0 {
		return nil, fmt.Errorf("shmsess: attach: memory is not page aligned; map it with mmap")
	}
	l, err := readLayout(mem, maxSlots, lanes)
	if err != nil {
		return nil, err
	}
	return newSession(mem, l), nil
}

func newSession(mem []byte, l Layout) *Session {
	s := &Session{mem: mem, l: l, clientSleeping: (*uint32)(unsafe.Pointer(&mem[offClientSleeping]))}
	s.events = newBitmap(mem, l.EventsOffset, l)
	s.lanes = make([]Lane, l.Lanes)
	for i := range s.lanes {
		off := l.LanesOffset + int64(i)*l.LaneStride
		s.lanes[i] = Lane{sleeping: (*uint32)(unsafe.Pointer(&mem[off])), Bitmap: newBitmap(mem, off+LaneHeaderSize, l)}
	}
	return s
}

// Layout returns the session's layout.
func (s *Session) Layout() Layout { return s.l }

// Mem returns the whole session memory.
func (s *Session) Mem() []byte { return s.mem }

// Queue returns the memory of one queue of capacity queueBytes at off,
// or an error if it does not lie inside the arena.
func (s *Session) Queue(off uint64, queueBytes int) ([]byte, error) {
	n := uint64(256 + queueBytes)
	if off%8 != 0 || off < uint64(s.l.ArenaOffset) || off > uint64(s.l.Size) || uint64(s.l.Size)-off < n {
		return nil, fmt.Errorf("shmsess: a %d-byte queue at %d is not inside the arena [%d, %d)", n, off, s.l.ArenaOffset, s.l.Size)
	}
	return s.mem[off : off+n : off+n], nil
}

// Events is the daemon → client bitmap.
func (s *Session) Events() *Bitmap { return &s.events }

// Lane returns lane i's block (i < Layout().Lanes).
func (s *Session) Lane(i int) *Lane { return &s.lanes[i] }

// Announce tells lane's engine that slot's TX queue has records (after a
// publish that found the engine's consumer-waiting flag armed). It reports
// whether the engine sleeps: the caller must then write the lane's
// doorbell. Client side.
func (s *Session) Announce(lane, slot int) (ring bool) {
	if lane < 0 || lane >= len(s.lanes) {
		return false
	}
	ln := &s.lanes[lane]
	ln.Set(slot)
	return atomic.LoadUint32(ln.sleeping) != 0 && atomic.SwapUint32(ln.sleeping, 0) != 0
}

// Event tells the client to look at slot (after an RX publish or a TX
// release that found the client's waiting flag armed). It reports whether
// the client sleeps: the caller must then write the client eventfd. Daemon
// side.
func (s *Session) Event(slot int) (wake bool) {
	s.events.Set(slot)
	return atomic.LoadUint32(s.clientSleeping) != 0 && atomic.SwapUint32(s.clientSleeping, 0) != 0
}

// ArmClientSleep is the client's step before sleeping on the client
// eventfd: it reports whether events arrived meanwhile (do not sleep then).
func (s *Session) ArmClientSleep() (pending bool) {
	atomic.SwapUint32(s.clientSleeping, 1)
	return s.events.Pending()
}

// DisarmClientSleep withdraws ArmClientSleep.
func (s *Session) DisarmClientSleep() {
	if atomic.LoadUint32(s.clientSleeping) != 0 {
		atomic.StoreUint32(s.clientSleeping, 0)
	}
}
