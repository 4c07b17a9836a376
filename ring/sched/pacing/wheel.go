package pacing

import "math/bits"

// Wheel geometry: 2^14 slots of 2^10 ns (1.024 µs) cover 16.8 ms, the gap
// between 1500-byte frames at 0.7 Mbit/s. Departures further out wait in
// an overflow list that is re-filed when the wheel comes close to them.
const (
	slotShift = 10
	numSlots  = 1 << 14
	slotMask  = numSlots - 1
	numWords  = numSlots / 64
	numSum    = numWords / 64
)

// Item is an entry of a Wheel, embedded in (or pointed to by) what it
// schedules. An Item is in at most one wheel at a time.
type Item[T any] struct {
	Value      T
	due        int64
	next, prev *Item[T]
	// where: notQueued, inFar, or the slot index.
	where int32
}

const (
	notQueued = -1
	inFar     = -2
)

// NewItem returns an unqueued item holding v.
func NewItem[T any](v T) *Item[T] { return &Item[T]{Value: v, where: notQueued} }

// Queued reports whether the item is in a wheel.
func (it *Item[T]) Queued() bool { return it.where != notQueued }

// Due returns the time the item was scheduled for.
func (it *Item[T]) Due() int64 { return it.due }

// Wheel is a Carousel-style timing wheel: items are filed in the slot of
// their due time, so Insert and Remove are O(1), and Advance visits only
// non-empty slots (a two-level bitmap skips empty ones, 64 at a time).
// Times are nanoseconds on any monotonic clock that does not go below the
// time given to NewWheel. Not safe for concurrent use.
type Wheel[T any] struct {
	slots [numSlots]*Item[T]
	words [numWords]uint64
	sum   [numSum]uint64
	// cur is the absolute slot number (time >> slotShift) Advance has
	// reached; every filed item is due in cur .. cur+numSlots-1.
	cur int64
	n   int
	// far holds items due beyond the horizon; farMin is a lower bound of
	// their due times.
	far    *Item[T]
	farN   int
	farMin int64
}

// NewWheel returns an empty wheel whose clock starts at now.
func NewWheel[T any](now int64) *Wheel[T] {
	return &Wheel[T]{cur: now >> slotShift}
}

// Len returns how many items are queued.
func (w *Wheel[T]) Len() int { return w.n + w.farN }

// Insert schedules it at due, moving it if it was queued already. A due
// time in the past is filed in the current slot: it fires on the next
// Advance.
func (w *Wheel[T]) Insert(it *Item[T], due int64) {
	if it.where != notQueued {
		w.Remove(it)
	}
	it.due = due
	abs := max(due>>slotShift, w.cur)
	if abs-w.cur >= numSlots {
		it.prev, it.next = nil, w.far
		if w.far != nil {
			w.far.prev = it
		}
		w.far = it
		it.where = inFar
		if w.farN == 0 || due < w.farMin {
			w.farMin = due
		}
		w.farN++
		return
	}
	s := int32(abs & slotMask)
	head := w.slots[s]
	it.prev, it.next = nil, head
	if head != nil {
		head.prev = it
	} else {
		w.words[s>>6] |= 1 << (s & 63)
		w.sum[s>>12] |= 1 << ((s >> 6) & 63)
	}
	w.slots[s] = it
	it.where = s
	w.n++
}

// Remove unschedules it; an unqueued item is left alone.
func (w *Wheel[T]) Remove(it *Item[T]) {
	switch it.where {
	case notQueued:
		return
	case inFar:
		if it.prev != nil {
			it.prev.next = it.next
		} else {
			w.far = it.next
		}
		if it.next != nil {
			it.next.prev = it.prev
		}
		w.farN--
	default:
		s := it.where
		if it.prev != nil {
			it.prev.next = it.next
		} else {
			w.slots[s] = it.next
			if it.next == nil {
				w.clearBit(s)
			}
		}
		if it.next != nil {
			it.next.prev = it.prev
		}
		w.n--
	}
	it.next, it.prev, it.where = nil, nil, notQueued
}

func (w *Wheel[T]) clearBit(s int32) {
	w.words[s>>6] &^= 1 << (s & 63)
	if w.words[s>>6] == 0 {
		w.sum[s>>12] &^= 1 << ((s >> 6) & 63)
	}
}

// nextSet returns the first non-empty slot index >= from, or -1.
func (w *Wheel[T]) nextSet(from int) int {
	if from >= numSlots {
		return -1
	}
	wi := from >> 6
	if m := w.words[wi] & (^uint64(0) << (from & 63)); m != 0 {
		return wi<<6 + bits.TrailingZeros64(m)
	}
	wi++
	for si := wi >> 6; si < numSum && wi < numWords; si++ {
		m := w.sum[si]
		if si == wi>>6 {
			m &= ^uint64(0) << (wi & 63)
		}
		if m != 0 {
			wi = si<<6 + bits.TrailingZeros64(m)
			return wi<<6 + bits.TrailingZeros64(w.words[wi])
		}
	}
	return -1
}

// Advance moves the wheel's clock to now and calls fire for every item
// due at or before now, after unqueueing it. fire must not change the
// wheel; collect and re-insert afterwards.
func (w *Wheel[T]) Advance(now int64, fire func(*Item[T])) {
	target := now >> slotShift
	if target < w.cur {
		return
	}
	if w.n > 0 {
		// Slots cur..target, at most one turn of the wheel, in time
		// order: first from cur's index to the end of the array, then
		// from the start.
		span := min(target-w.cur+1, numSlots)
		start := int(w.cur & slotMask)
		end := start + int(span) // exclusive, may pass numSlots
		w.fireRange(start, min(end, numSlots), now, fire)
		if end > numSlots && w.n > 0 {
			w.fireRange(0, end-numSlots, now, fire)
		}
	}
	w.cur = target
	if w.farN > 0 && w.farMin>>slotShift < w.cur+numSlots {
		w.refile(now, fire)
	}
}

func (w *Wheel[T]) fireRange(from, to int, now int64, fire func(*Item[T])) {
	for s := w.nextSet(from); s >= 0 && s < to; s = w.nextSet(s + 1) {
		for it := w.slots[s]; it != nil; {
			next := it.next
			if it.due <= now {
				w.Remove(it)
				fire(it)
			}
			it = next
		}
	}
}

// refile moves overflow items that came within the horizon into slots
// (firing those already due).
func (w *Wheel[T]) refile(now int64, fire func(*Item[T])) {
	w.farMin = 0
	first := true
	for it := w.far; it != nil; {
		next := it.next
		switch {
		case it.due <= now:
			w.Remove(it)
			fire(it)
		case it.due>>slotShift-w.cur < numSlots:
			w.Remove(it)
			w.Insert(it, it.due)
		default:
			if first || it.due < w.farMin {
				w.farMin, first = it.due, false
			}
		}
		it = next
	}
}

// Next returns the earliest due time of the queued items; ok is false
// when the wheel is empty.
func (w *Wheel[T]) Next() (due int64, ok bool) {
	if w.n > 0 {
		start := int(w.cur & slotMask)
		s := w.nextSet(start)
		if s < 0 {
			s = w.nextSet(0)
		}
		due, ok = w.slots[s].due, true
		for it := w.slots[s].next; it != nil; it = it.next {
			due = min(due, it.due)
		}
		return due, ok
	}
	if w.farN > 0 {
		return w.farMin, true
	}
	return 0, false
}
