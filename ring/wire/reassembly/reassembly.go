// Package reassembly puts IPv4 and IPv6 fragments back together for the ring
// engine's UDP fast path.
//
// It owns the per-datagram fragment queues: copying fragment data out of
// recycled frame buffers, detecting completion, overlaps and inconsistent
// lengths, timing out stale datagrams and bounding memory by evicting the
// oldest incomplete datagram. It does not parse frames (package ring/wire/packet
// yields the Key, offset, MF flag and data), verify checksums, or send ICMP
// "fragment reassembly time exceeded" messages.
//
// Policy, chosen to be simple and safe against fragment attacks:
//   - Overlapping fragments drop the whole datagram, for IPv6 as RFC 5722
//     requires, and for IPv4 as well (as Linux does since 4.19). A
//     fragment that repeats bytes already received with identical content is
//     a duplicate and is ignored.
//   - A datagram that would exceed the IP limit (65535 bytes of IPv6 payload;
//     65535 bytes of IPv4 packet with a 20-byte header) is dropped (TooBig).
//   - Fragments with inconsistent lengths (a second, different final
//     fragment; data beyond the final fragment's end) drop the datagram.
//     Malformed fragments (offset not a multiple of 8, no data, a non-final
//     fragment whose length is not a multiple of 8) are rejected alone.
//   - The timer of a datagram starts at its first fragment and is not
//     refreshed, like Linux's ipfrag_time.
package reassembly

import (
	"bytes"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
	"time"
)

// Defaults, in the spirit of Linux's ipfrag_high_thresh and ipfrag_time.
const (
	DefaultMaxBytes     = 4 << 20
	DefaultMaxDatagrams = 1024
	DefaultTimeout      = 30 * time.Second

	// maxIPv4Data is the most upper-layer data an IPv4 datagram can carry
	// with a minimal 20-byte header; maxIPv6Data the most an IPv6 payload
	// can carry without jumbograms.
	maxIPv4Data = 65535 - 20
	maxIPv6Data = 65535
)

// Config bounds a Reassembler. Zero fields take the defaults.
type Config struct {
	// MaxBytes bounds the reassembly buffers held by incomplete datagrams
	// (default 4 MiB). Values below 64 KiB are raised to 64 KiB so one
	// maximal datagram always fits.
	MaxBytes int
	// MaxDatagrams bounds the incomplete datagrams in flight (default 1024).
	MaxDatagrams int
	// Timeout is how long a datagram may wait for its missing fragments,
	// counted from its first fragment (default 30 s, like Linux).
	Timeout time.Duration
}

// Stats are plain counters since New; the ring copies them into its stats.
type Stats struct {
	Reassembled uint64 // datagrams completed
	Timeouts    uint64 // datagrams dropped because Timeout passed
	Evicted     uint64 // datagrams dropped to stay within MaxBytes or MaxDatagrams
	Overlaps    uint64 // datagrams dropped because fragments overlapped
	Invalid     uint64 // malformed fragments, and datagrams dropped for inconsistent lengths
	TooBig      uint64 // datagrams dropped for exceeding the IP size limit
}

// Key identifies the datagram a fragment belongs to (RFC 791: source,
// destination, protocol, identification; RFC 8200: source, destination,
// identification).
type Key struct {
	Src, Dst netip.Addr
	ID       uint32
	Proto    uint8
}

// Errors returned by Add. All are static; the fragment (and where stated the
// datagram) has been dropped and counted, and there is nothing to retry.
var (
	// ErrInvalid: a malformed fragment or inconsistent lengths.
	ErrInvalid = errors.New("reassembly: invalid fragment")
	// ErrOverlap: fragments overlapped with different data; the datagram was dropped.
	ErrOverlap = errors.New("reassembly: overlapping fragments, datagram dropped (RFC 5722)")
	// ErrTooBig: the datagram would exceed the IP size limit; it was dropped.
	ErrTooBig = errors.New("reassembly: fragment ends beyond the 65535-byte IP limit, datagram dropped")

	errOffset     = fmt.Errorf("%w: offset negative or not a multiple of 8", ErrInvalid)
	errEmpty      = fmt.Errorf("%w: no data", ErrInvalid)
	errUnaligned  = fmt.Errorf("%w: non-final fragment length not a multiple of 8", ErrInvalid)
	errLastLength = fmt.Errorf("%w: final fragment disagrees with the datagram's other fragments, datagram dropped", ErrInvalid)
	errPastEnd    = fmt.Errorf("%w: fragment ends beyond the final fragment, datagram dropped", ErrInvalid)
)

// Buffers come in power-of-two size classes from 2 KiB (one fragment at
// Ethernet MTU) to 64 KiB (the largest datagram).
const (
	minShift   = 11
	maxShift   = 16
	numClasses = maxShift - minShift + 1
)

func classFor(n int) int {
	if n <= 1<<minShift {
		return 0
	}
	return bits.Len(uint(n-1)) - minShift
}

// span is a received byte range [start, end). An entry keeps its spans
// sorted, disjoint and merged when adjacent, so "fully inside one span" means
// "every byte already received".
type span struct{ start, end int }

type entry struct {
	key     Key
	created time.Time
	buf     []byte // len == buffer size class; bytes outside spans are garbage
	spans   []span
	inline  [8]span // backing store for spans, so a typical datagram needs no allocation
	total   int     // datagram length once the final fragment arrived, else -1
	maxEnd  int
	got     int // bytes received (spans never overlap)

	prev, next *entry // creation order, oldest first
}

// Reassembler reassembles fragments for one ring engine thread. It is not
// safe for concurrent use.
type Reassembler struct {
	cfg      Config
	flows    map[Key]*entry
	head     *entry // oldest
	tail     *entry // newest
	n        int
	buffered int

	// Free buffers and entries, so steady-state reassembly does not
	// allocate. Free buffers are bounded by freeLimit bytes.
	free        [numClasses][][]byte
	freeBytes   int
	freeLimit   int
	freeEntries []*entry

	// pending is the buffer of the datagram Add returned last; the caller
	// may read it until the next Add or Expire.
	pending []byte

	stats Stats
}

// New returns a Reassembler bounded by cfg (zero fields take defaults).
func New(cfg Config) *Reassembler {
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	cfg.MaxBytes = max(cfg.MaxBytes, 1<<maxShift)
	if cfg.MaxDatagrams <= 0 {
		cfg.MaxDatagrams = DefaultMaxDatagrams
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	return &Reassembler{
		cfg:       cfg,
		flows:     make(map[Key]*entry),
		freeLimit: max(cfg.MaxBytes/4, 2<<maxShift),
	}
}

// Config returns the effective configuration (defaults applied).
func (r *Reassembler) Config() Config { return r.cfg }

// Stats returns the counters.
func (r *Reassembler) Stats() Stats { return r.stats }

// Buffered returns the bytes of reassembly buffers held by incomplete
// datagrams, which MaxBytes bounds. Buffers are allocated in power-of-two
// classes (2 KiB..64 KiB), so this is at least the data received. Not counted:
// the buffer of the datagram Add returned last (until the next call) and idle
// pooled buffers (at most max(MaxBytes/4, 128 KiB)).
func (r *Reassembler) Buffered() int { return r.buffered }

// Len returns the number of incomplete datagrams held.
func (r *Reassembler) Len() int { return r.n }

// Add files one fragment: k identifies the datagram, off is the fragment's
// byte offset, more its MF flag, data its bytes after the IP (and IPv6
// fragment) header. data is copied, so the caller may recycle the frame
// right after. When the fragment completes the datagram, Add returns the
// whole upper-layer payload (for UDP: header and data) and done; the slice is
// valid until the next call to Add or Expire.
//
// now is the caller's clock (time.Now or a cached reading); it must not run
// backwards. Add also drops datagrams whose Timeout has passed, oldest first.
// A non-nil error means the fragment was rejected (and counted); see the
// package documentation for the policy.
func (r *Reassembler) Add(k Key, off int, more bool, data []byte, now time.Time) (datagram []byte, done bool, err error) {
	r.releasePending()
	r.expire(now)

	if off < 0 || off%8 != 0 {
		r.stats.Invalid++
		return nil, false, errOffset
	}
	if len(data) == 0 {
		r.stats.Invalid++
		return nil, false, errEmpty
	}
	if more && len(data)%8 != 0 {
		r.stats.Invalid++
		return nil, false, errUnaligned
	}
	end := off + len(data)
	limit := maxIPv6Data
	if k.Src.Unmap().Is4() {
		limit = maxIPv4Data
	}
	e := r.flows[k]
	if end > limit {
		r.stats.TooBig++
		if e != nil {
			r.drop(e)
		}
		return nil, false, ErrTooBig
	}
	if e == nil {
		for r.n >= r.cfg.MaxDatagrams && r.head != nil {
			r.stats.Evicted++
			r.drop(r.head)
		}
		e = r.newEntry(k, now)
	}

	// Length consistency with the final fragment (RFC 791 / RFC 8200: the
	// final fragment fixes the datagram's length).
	if !more {
		if (e.total >= 0 && end != e.total) || end < e.maxEnd {
			r.stats.Invalid++
			r.drop(e)
			return nil, false, errLastLength
		}
	} else if e.total >= 0 && end > e.total {
		r.stats.Invalid++
		r.drop(e)
		return nil, false, errPastEnd
	}

	// Find the first span ending after off; only it can intersect [off, end).
	i, _ := slices.BinarySearchFunc(e.spans, off, func(s span, off int) int {
		if s.end <= off {
			return -1
		}
		return 1
	})
	if i < len(e.spans) && e.spans[i].start < end {
		s := e.spans[i]
		if s.start <= off && end <= s.end && bytes.Equal(e.buf[off:end], data) {
			// Duplicate: nothing new, but a repeated final fragment
			// still tells us the length.
			if !more {
				e.total = end
			}
			return r.complete(e)
		}
		r.stats.Overlaps++
		r.drop(e)
		return nil, false, ErrOverlap
	}

	if !more {
		e.total = end
	}
	// Once the length is known, size the buffer for the whole datagram so
	// it grows at most once more.
	need := max(end, e.total)
	if need > len(e.buf) {
		r.grow(e, need)
	}
	copy(e.buf[off:end], data)
	e.got += len(data)
	e.maxEnd = max(e.maxEnd, end)

	left := i > 0 && e.spans[i-1].end == off
	right := i < len(e.spans) && e.spans[i].start == end
	switch {
	case left && right:
		e.spans[i-1].end = e.spans[i].end
		e.spans = slices.Delete(e.spans, i, i+1)
	case left:
		e.spans[i-1].end = end
	case right:
		e.spans[i].start = off
	default:
		e.spans = slices.Insert(e.spans, i, span{off, end})
	}
	return r.complete(e)
}

// complete hands out e's datagram if every byte up to the final fragment's
// end has arrived.
func (r *Reassembler) complete(e *entry) ([]byte, bool, error) {
	if e.total < 0 || e.got != e.total {
		return nil, false, nil
	}
	buf := e.buf
	e.buf = nil
	r.buffered -= len(buf)
	r.pending = buf
	r.stats.Reassembled++
	total := e.total
	r.drop(e)
	return buf[:total:total], true, nil
}

// Expire drops the datagrams whose Timeout has passed at now and returns how
// many it dropped. Call it periodically (e.g. once a second) so stale
// fragments do not hold memory while no new fragments arrive.
func (r *Reassembler) Expire(now time.Time) int {
	r.releasePending()
	return r.expire(now)
}

// expire drops timed-out datagrams from the oldest end of the list; entries
// are in creation order, so it stops at the first one still in time.
func (r *Reassembler) expire(now time.Time) int {
	n := 0
	for r.head != nil && now.Sub(r.head.created) >= r.cfg.Timeout {
		r.stats.Timeouts++
		r.drop(r.head)
		n++
	}
	return n
}

func (r *Reassembler) releasePending() {
	if r.pending != nil {
		r.putBuf(r.pending)
		r.pending = nil
	}
}

// grow gives e a buffer of at least need bytes, evicting the oldest other
// datagrams first if the new size would exceed MaxBytes.
func (r *Reassembler) grow(e *entry, need int) {
	c := classFor(need)
	delta := 1<<(c+minShift) - len(e.buf)
	for r.buffered+delta > r.cfg.MaxBytes {
		v := r.head
		if v == e {
			v = e.next
		}
		if v == nil {
			// Only e is left; MaxBytes >= 64 KiB makes this unreachable,
			// but never evict the datagram being extended.
			break
		}
		r.stats.Evicted++
		r.drop(v)
	}
	nb := r.getBuf(c)
	copy(nb, e.buf[:min(e.maxEnd, len(e.buf))])
	if e.buf != nil {
		r.putBuf(e.buf)
	}
	e.buf = nb
	r.buffered += delta
}

func (r *Reassembler) getBuf(c int) []byte {
	if l := r.free[c]; len(l) > 0 {
		b := l[len(l)-1]
		l[len(l)-1] = nil
		r.free[c] = l[:len(l)-1]
		r.freeBytes -= len(b)
		return b
	}
	return make([]byte, 1<<(c+minShift))
}

func (r *Reassembler) putBuf(b []byte) {
	b = b[:cap(b)]
	if r.freeBytes+len(b) > r.freeLimit {
		return // let the GC have it; idle memory stays bounded
	}
	c := classFor(len(b))
	r.free[c] = append(r.free[c], b)
	r.freeBytes += len(b)
}

func (r *Reassembler) newEntry(k Key, now time.Time) *entry {
	var e *entry
	if n := len(r.freeEntries); n > 0 {
		e = r.freeEntries[n-1]
		r.freeEntries[n-1] = nil
		r.freeEntries = r.freeEntries[:n-1]
	} else {
		e = new(entry)
		e.spans = e.inline[:0]
	}
	e.key, e.created, e.total, e.maxEnd, e.got = k, now, -1, 0, 0
	e.prev, e.next = r.tail, nil
	if r.tail != nil {
		r.tail.next = e
	} else {
		r.head = e
	}
	r.tail = e
	r.flows[k] = e
	r.n++
	return e
}

// drop forgets e and recycles its buffer and the entry itself.
func (r *Reassembler) drop(e *entry) {
	delete(r.flows, e.key)
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		r.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		r.tail = e.prev
	}
	r.n--
	if e.buf != nil {
		r.buffered -= len(e.buf)
		r.putBuf(e.buf)
	}
	*e = entry{spans: e.spans[:0]}
	// A span list that grew for a datagram of many tiny fragments is not
	// kept; the next datagram starts on the inline array again.
	if cap(e.spans) > 64 {
		e.spans = nil
	}
	if e.spans == nil {
		e.spans = e.inline[:0]
	}
	if len(r.freeEntries) < r.cfg.MaxDatagrams {
		r.freeEntries = append(r.freeEntries, e)
	}
}
