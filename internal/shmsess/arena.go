package shmsess

import (
	"cmp"
	"fmt"
	"slices"
)

// Arena hands out slots and queue ranges of one session memory. It is the
// daemon's private bookkeeping (nothing of it is in shared memory) and is
// not safe for concurrent use: a session's goroutine owns it.
//
// Ranges come from a bump pointer; freed ranges are kept per span and given
// to the next request of the same span (sockets of a session mostly share
// one queue size). A request that fits neither fails even if enough freed
// bytes of other spans exist: the budget (--max-queue-memory) is the
// arena's size, so that only happens to a client mixing queue sizes close
// to its budget.
type Arena struct {
	l        Layout
	next     int64 // next unused arena offset (relative to the arena)
	free     map[int64][]int64
	slotNext int
	slotFree []int
	used     int64
}

// NewArena returns the allocator for l.
func NewArena(l Layout) *Arena { return &Arena{l: l, free: map[int64][]int64{}} }

// Alloc returns a free slot and the absolute offset of a range of span
// bytes (a multiple of PageSize), or ok=false when slots or arena are
// exhausted.
func (a *Arena) Alloc(span int64) (slot int, off int64, ok bool) {
	if span <= 0 || span%PageSize != 0 {
		return 0, 0, false
	}
	if len(a.slotFree) == 0 && a.slotNext >= a.l.MaxSlots {
		return 0, 0, false
	}
	if fl := a.free[span]; len(fl) > 0 {
		off = fl[len(fl)-1]
		a.free[span] = fl[:len(fl)-1]
	} else {
		if a.l.ArenaSize-a.next < span {
			return 0, 0, false
		}
		off = a.l.ArenaOffset + a.next
		a.next += span
	}
	if n := len(a.slotFree); n > 0 {
		slot, a.slotFree = a.slotFree[n-1], a.slotFree[:n-1]
	} else {
		slot = a.slotNext
		a.slotNext++
	}
	a.used += span
	return slot, off, true
}

// Free returns a slot and its range (as Alloc gave them).
func (a *Arena) Free(slot int, off, span int64) {
	a.slotFree = append(a.slotFree, slot)
	a.free[span] = append(a.free[span], off)
	a.used -= span
}

// Used returns the bytes of ranges handed out and not freed.
func (a *Arena) Used() int64 { return a.used }

// Range is one socket's slot and queue range in a session memory.
type Range struct {
	Slot      int
	Off, Span int64
}

// RestoreArena rebuilds the allocator of a session memory another daemon
// handed over from the ranges in use (live upgrade). Slots below the
// highest live one are free again; the holes between live ranges become
// free ranges of their own size. It refuses ranges that do not fit l or
// that overlap.
func RestoreArena(l Layout, live []Range) (*Arena, error) {
	a := NewArena(l)
	sorted := slices.Clone(live)
	slices.SortFunc(sorted, func(x, y Range) int { return cmp.Compare(x.Off, y.Off) })
	used := make([]bool, l.MaxSlots)
	end := l.ArenaOffset
	for _, r := range sorted {
		if r.Slot < 0 || r.Slot >= l.MaxSlots || used[r.Slot] {
			return nil, fmt.Errorf("slot %d: outside 0..%d or used twice", r.Slot, l.MaxSlots-1)
		}
		if r.Span <= 0 || r.Span%PageSize != 0 || r.Off < end || r.Off%PageSize != 0 || r.Off+r.Span > l.ArenaOffset+l.ArenaSize {
			return nil, fmt.Errorf("slot %d: range %d+%d outside the arena or overlapping another", r.Slot, r.Off, r.Span)
		}
		used[r.Slot] = true
		if r.Off > end {
			a.free[r.Off-end] = append(a.free[r.Off-end], end)
		}
		end = r.Off + r.Span
		a.used += r.Span
		a.slotNext = max(a.slotNext, r.Slot+1)
	}
	a.next = end - l.ArenaOffset
	for s := a.slotNext - 1; s >= 0; s-- {
		if !used[s] {
			a.slotFree = append(a.slotFree, s)
		}
	}
	return a, nil
}
