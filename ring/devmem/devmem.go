package devmem

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// Defaults from VMA's on-device-memory semantics (see DESIGN.md, "Device
// memory").
const (
	// DefaultInlineThreshold is the largest packet that is never staged: it
	// fits the send queue's inline buffer, so staging would only add a copy.
	DefaultInlineThreshold = 204
	// DefaultCompletionThreshold is the free space below which the provider
	// is asked to force a completion.
	DefaultCompletionThreshold = 8 << 10
	// Align is the alignment of every staged packet's offset and charged size.
	Align = 8
)

// ErrReleaseOrder reports a Release of an offset that is not a live
// allocation awaiting completion (released twice, or never staged), or a
// Cancel of anything but the newest allocation.
var ErrReleaseOrder = errors.New("devmem: release of a staged packet that is not awaiting completion")

// Config tunes a Manager. Start from DefaultConfig: the zero value means an
// inline threshold of 0 (every non-empty packet is a staging candidate) and no
// forced completions.
type Config struct {
	// InlineThreshold: packets of at most this many bytes are never staged.
	InlineThreshold int
	// CompletionThreshold: NeedCompletion reports true while allocations are
	// live and fewer than this many bytes are free.
	CompletionThreshold int
}

// DefaultConfig returns the VMA defaults: 204-byte inline threshold, 8 KiB
// completion threshold.
func DefaultConfig() Config {
	return Config{
		InlineThreshold:     DefaultInlineThreshold,
		CompletionThreshold: DefaultCompletionThreshold,
	}
}

// Stats is a snapshot of a Manager's counters.
type Stats struct {
	// Capacity is the usable region size in bytes (0 when disabled).
	Capacity int
	// InUse is the number of bytes charged to live allocations, skipped
	// wrap-around bytes included.
	InUse int
	// StagedPackets and StagedBytes count packets copied into the region and
	// their lengths (unaligned).
	StagedPackets uint64
	StagedBytes   uint64
	// InlinePackets counts packets at or under the inline threshold.
	InlinePackets uint64
	// OOBPackets counts staging candidates the region could not hold.
	OOBPackets uint64
	// CopyErrors counts candidates whose copy into the region failed; they
	// were sent from host memory instead.
	CopyErrors uint64
}

// alloc is one live allocation: the packet's aligned size at off, plus the
// tail bytes skipped to place it (charged to it, released with it).
type alloc struct {
	off, size, skip int
	// done: its send completed before an older allocation's.
	done bool
}

// Manager is the circular staging allocator over one Region.
//
// Stage, Release, ReleaseAll, NeedCompletion, Free, Used and Outstanding
// belong to the one goroutine that owns the send queue (the engine's TX
// path); they are not safe for concurrent use. Stats, Capacity and Enabled
// may be called from any goroutine.
type Manager struct {
	region   Region
	capacity int
	inline   int
	complete int
	// chunk is the device's chunk size when the region has one (see
	// Chunked): no allocation crosses a multiple of it. 0: no limit.
	chunk int

	// The live window is [tail, tail+used) modulo capacity; skipped bytes
	// lie inside it, so the head is always (tail+used) % capacity.
	tail int
	used int

	// fifo holds live allocations oldest first, as a ring buffer that grows
	// by doubling (no allocation once it has reached the working-set size).
	fifo  []alloc
	first int
	count int

	inUse      atomic.Int64
	stagedPkts atomic.Uint64
	stagedB    atomic.Uint64
	inlinePkts atomic.Uint64
	oobPkts    atomic.Uint64
	copyErrs   atomic.Uint64
	lastErr    atomic.Pointer[error]
}

// New returns a Manager staging into r. A nil r or one of size 0 yields a
// disabled Manager that never stages and counts nothing.
func New(r Region, cfg Config) (*Manager, error) {
	if cfg.InlineThreshold < 0 {
		return nil, fmt.Errorf("devmem: inline threshold %d is negative; use 0 to make every packet a staging candidate", cfg.InlineThreshold)
	}
	if cfg.CompletionThreshold < 0 {
		return nil, fmt.Errorf("devmem: completion threshold %d is negative; use 0 to never force completions", cfg.CompletionThreshold)
	}
	size := 0
	if r != nil {
		size = r.Size()
	}
	if size < 0 {
		return nil, fmt.Errorf("devmem: region reports a negative size (%d); the provider's region is broken", size)
	}
	m := &Manager{
		region:   r,
		capacity: size &^ (Align - 1),
		inline:   cfg.InlineThreshold,
		complete: cfg.CompletionThreshold,
	}
	if c, ok := r.(Chunked); ok && size > 0 {
		m.chunk = c.ChunkSize()
		if m.chunk < Align || m.chunk&(m.chunk-1) != 0 {
			return nil, fmt.Errorf("devmem: region chunk size %d is not a power of two of at least %d; the provider's region is broken", m.chunk, Align)
		}
	}
	if m.capacity == 0 {
		m.region = nil
	}
	return m, nil
}

// Enabled reports whether the Manager has a region to stage into.
func (m *Manager) Enabled() bool { return m.capacity > 0 }

// Capacity returns the usable region size in bytes (a multiple of Align).
func (m *Manager) Capacity() int { return m.capacity }

// Used returns the bytes charged to live allocations, skipped bytes included.
func (m *Manager) Used() int { return m.used }

// Free returns Capacity() - Used(). Free space may be split in two at the
// wrap, so a packet of Free() bytes does not necessarily fit.
func (m *Manager) Free() int { return m.capacity - m.used }

// Outstanding returns the number of live allocations.
func (m *Manager) Outstanding() int { return m.count }

// Stage decides whether pkt is staged and, if so, copies it into the region
// and returns its offset. When staged is false the caller sends pkt from host
// memory (inline or by reference) and must not call Release for it. Every
// staged packet must be released with Release once its send completes.
func (m *Manager) Stage(pkt []byte) (off int, staged bool) {
	return m.stage(pkt, len(pkt))
}

// Reserve is Stage without the copy, for a region the caller can write
// directly (an AF_XDP UMEM): it decides and counts exactly as Stage does for
// an n-byte packet, and when staged is true the caller writes the packet at
// off itself, then posts and releases it like a staged one.
func (m *Manager) Reserve(n int) (off int, staged bool) {
	return m.stage(nil, n)
}

// stage is Stage and Reserve: pkt is nil for Reserve.
func (m *Manager) stage(pkt []byte, n int) (off int, staged bool) {
	if m.capacity == 0 {
		return 0, false
	}
	if n <= m.inline {
		m.inlinePkts.Add(1)
		return 0, false
	}
	if n > m.capacity || m.chunk > 0 && n > m.chunk {
		m.oobPkts.Add(1)
		return 0, false
	}
	size := (n + Align - 1) &^ (Align - 1)
	off, skip, ok := m.place(size)
	if !ok {
		m.oobPkts.Add(1)
		return 0, false
	}
	// Copy before committing so a failed copy leaves no trace but a counter.
	if pkt != nil {
		if err := m.region.CopyTo(off, pkt); err != nil {
			m.copyFailed(n, off, err)
			return 0, false
		}
	}
	if m.used == 0 {
		// An empty region restarts at 0 so the whole capacity is contiguous.
		m.tail = 0
	}
	m.push(alloc{off: off, size: size, skip: skip})
	m.used += size + skip
	m.inUse.Store(int64(m.used))
	m.stagedPkts.Add(1)
	m.stagedB.Add(uint64(n))
	return off, true
}

// place finds room for size bytes at the head: after the newest allocation
// if it fits before the end of the region (or before the oldest allocation
// once wrapped), else at offset 0 if it fits before the oldest allocation,
// charging the skipped tail bytes. In a chunked region a packet that would
// cross a chunk boundary starts at the next chunk instead, and the bytes
// skipped to get there are charged to it the same way.
func (m *Manager) place(size int) (off, skip int, ok bool) {
	if m.used == 0 {
		return 0, 0, true
	}
	if m.used == m.capacity {
		return 0, 0, false
	}
	head := m.tail + m.used
	if head >= m.capacity {
		// Already wrapped: free space is the single run [head, tail).
		head -= m.capacity
		off := m.inChunk(head, size)
		if off+size <= m.tail {
			return off, off - head, true
		}
		return 0, 0, false
	}
	// Not wrapped: free space is [head, capacity) and [0, tail).
	if off := m.inChunk(head, size); off+size <= m.capacity {
		return off, off - head, true
	}
	if size <= m.tail {
		return 0, m.capacity - head, true
	}
	return 0, 0, false
}

// inChunk returns at, or the next chunk boundary when size bytes at at
// would cross one.
func (m *Manager) inChunk(at, size int) int {
	if m.chunk > 0 && at&(m.chunk-1)+size > m.chunk {
		return at&^(m.chunk-1) + m.chunk
	}
	return at
}

// copyFailed records a failed copy. It is separate from Stage so the error
// variable it takes the address of does not move Stage's locals to the heap.
func (m *Manager) copyFailed(n, off int, err error) {
	m.copyErrs.Add(1)
	wrapped := fmt.Errorf("devmem: stage %d bytes at offset %d: %w", n, off, err)
	m.lastErr.Store(&wrapped)
}

// Release reports that the send of the packet Stage placed at off
// completed. Space comes back strictly from the oldest allocation on: a
// packet completed before an older one (a device with several send queues
// sharing the region, such as paced queues, completes each queue in order
// but interleaves them) is marked done and its space returns with the
// older ones'. An off that is not a live, unreleased allocation is
// refused (ErrReleaseOrder) and changes nothing: the caller lost track of a
// completion.
func (m *Manager) Release(off int) error {
	if m.count == 0 {
		return fmt.Errorf("%w: offset %d released but nothing is staged; release only offsets Stage returned with staged=true, once each", ErrReleaseOrder, off)
	}
	if a := &m.fifo[m.first]; a.off != off || a.done {
		// Not the oldest: mark it, if it is live at all.
		for i := 1; i < m.count; i++ {
			b := &m.fifo[(m.first+i)%len(m.fifo)]
			if b.off == off && !b.done {
				b.done = true
				return nil
			}
		}
		return fmt.Errorf("%w: offset %d released but no staged packet at it awaits completion; release only offsets Stage returned with staged=true, once each", ErrReleaseOrder, off)
	}
	m.fifo[m.first].done = true
	for m.count > 0 && m.fifo[m.first].done {
		a := m.fifo[m.first]
		m.pop()
		m.used -= a.size + a.skip
		m.tail = a.off + a.size
		if m.tail >= m.capacity {
			m.tail -= m.capacity
		}
	}
	if m.used == 0 {
		m.tail = 0
	}
	m.inUse.Store(int64(m.used))
	return nil
}

// Cancel gives back the newest live allocation, which must be the one Stage
// placed at off, for a staged packet that was never posted (dropped while
// the link was down). Its counters stay: the packet was staged.
func (m *Manager) Cancel(off int) error {
	if m.count == 0 {
		return fmt.Errorf("%w: offset %d cancelled but nothing is staged", ErrReleaseOrder, off)
	}
	i := (m.first + m.count - 1) % len(m.fifo)
	a := m.fifo[i]
	if a.off != off || a.done {
		return fmt.Errorf("%w: offset %d cancelled but the newest staged packet is at %d; cancel unposted packets newest first", ErrReleaseOrder, off, a.off)
	}
	m.count--
	m.used -= a.size + a.skip
	if m.used == 0 {
		m.tail = 0
	}
	m.inUse.Store(int64(m.used))
	return nil
}

// ReleaseAll drops every live allocation, for a send queue that was reset or
// torn down and will deliver no more completions.
func (m *Manager) ReleaseAll() {
	m.first, m.count = 0, 0
	m.tail, m.used = 0, 0
	m.inUse.Store(0)
}

// NeedCompletion reports whether the provider should force a completion now:
// allocations are live and free space is below the completion threshold.
func (m *Manager) NeedCompletion() bool {
	return m.used > 0 && m.capacity-m.used < m.complete
}

// LastCopyError returns the most recent error from Region.CopyTo, or nil.
// Safe from any goroutine.
func (m *Manager) LastCopyError() error {
	if p := m.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// Stats returns a snapshot of the counters. Safe from any goroutine; the
// fields are read one by one, so a snapshot taken while packets are staged
// may mix adjacent moments.
func (m *Manager) Stats() Stats {
	return Stats{
		Capacity:      m.capacity,
		InUse:         int(m.inUse.Load()),
		StagedPackets: m.stagedPkts.Load(),
		StagedBytes:   m.stagedB.Load(),
		InlinePackets: m.inlinePkts.Load(),
		OOBPackets:    m.oobPkts.Load(),
		CopyErrors:    m.copyErrs.Load(),
	}
}

func (m *Manager) push(a alloc) {
	if m.count == len(m.fifo) {
		grown := make([]alloc, max(16, 2*len(m.fifo)))
		for i := 0; i < m.count; i++ {
			grown[i] = m.fifo[(m.first+i)%len(m.fifo)]
		}
		m.fifo, m.first = grown, 0
	}
	m.fifo[(m.first+m.count)%len(m.fifo)] = a
	m.count++
}

func (m *Manager) pop() {
	m.first++
	if m.first == len(m.fifo) {
		m.first = 0
	}
	m.count--
}
