package shmq

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Layout constants (see the package documentation for the byte table).
const (
	Magic       uint32 = 0x51445042 // "BPDQ" in little-endian byte order
	Version     uint32 = 1
	HeaderSize         = 256
	MinCapacity        = 4096
	MaxCapacity        = 1 << 30
	// RecordHeaderSize is the length+type prefix of every record.
	RecordHeaderSize = 8
	// TypePad is the record type reserved for padding records; Commit
	// refuses it.
	TypePad uint32 = 0xFFFFFFFF
)

// Header field offsets.
const (
	offMagic       = 0
	offVersion     = 4
	offCapacity    = 8
	offHeaderSize  = 16
	offProducer    = 64
	offDropped     = 72
	offConsumer    = 128
	offConsError   = 136
	offConsWaiting = 192
	offProdWaiting = 196
)

// Errors. ErrEmpty and ErrFull are the normal "try again later" results and
// are returned unwrapped so hot paths can compare them with ==.
var (
	ErrEmpty   = errors.New("shmq: queue empty")
	ErrFull    = errors.New("shmq: queue full")
	ErrTooBig  = errors.New("shmq: record larger than the queue's MaxPayload")
	ErrCorrupt = errors.New("shmq: queue memory corrupt (the peer wrote invalid data); close this queue")
)

var hostLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// Size returns the bytes of memory needed for a queue with the given data
// capacity, or 0 if capacity is not a power of two in [MinCapacity,
// MaxCapacity].
func Size(capacity int) int {
	if !validCapacity(uint64(capacity)) || capacity < 0 {
		return 0
	}
	return HeaderSize + capacity
}

func validCapacity(c uint64) bool {
	return c >= MinCapacity && c <= MaxCapacity && c&(c-1) == 0
}

// MaxPayloadFor returns the largest payload a queue of this capacity
// accepts: capacity/2 minus the record header.
func MaxPayloadFor(capacity int) int { return capacity/2 - RecordHeaderSize }

func align8(n uint64) uint64 { return (n + 7) &^ 7 }

// Queue is one side's view of a queue in shared memory. The producer methods
// (Reserve, Commit, Push, Publish, Writable, ArmWriteWait, DisarmWriteWait,
// AddDropped) may be called by one goroutine while the consumer methods (Peek,
// Advance, Release, Readable, ArmReadWait, DisarmReadWait) are called by
// another, so one *Queue can serve both ends in-process; two processes each
// use their own *Queue over the same memory. Len, Free, Dropped and the
// accessors are safe from any goroutine. The memory must stay mapped as long
// as the Queue is used.
type Queue struct {
	mem        []byte // exactly Size(capacity) bytes
	data       []byte // mem[HeaderSize:]
	capacity   uint64
	mask       uint64
	maxPayload int

	prodIdx     *uint64
	consIdx     *uint64
	dropped     *uint64
	consWaiting *uint32
	prodWaiting *uint32

	// The read-mostly fields above, the producer state and the consumer
	// state each have cache lines of their own: the Queue is 256 bytes,
	// a size class whose objects are 256-byte aligned, with p at 128 and
	// c at 192 (TestQueueLayout). Padding each to a full line of its own
	// cost another 160 bytes per queue: daemon memory for every socket.
	_ [16]byte
	p producerState
	_ [16]byte
	c consumerState
	_ [8]byte
}

type producerState struct {
	idx        uint64 // next write index (includes committed, unpublished records)
	published  uint64 // last value stored to the shared producer index
	cachedCons uint64 // last validated consumer index
	resOff     uint64 // data offset of the reserved record
	resN       int    // reserved payload length, -1 when nothing is reserved
	corrupt    bool
}

type consumerState struct {
	idx        uint64 // next read index (includes advanced, unreleased records)
	released   uint64 // last value stored to the shared consumer index
	cachedProd uint64 // last validated producer index
	peekTotal  uint64 // size of the peeked record, 0 if none
	peekOff    uint64
	peekLen    uint32
	peekTyp    uint32
	corrupt    bool
}

// Init formats mem as an empty queue with the given data capacity and
// returns the creator's view. mem must hold at least Size(capacity) bytes and
// start 8-byte aligned; only the first Size(capacity) bytes are used.
// Init must not be called while a peer uses the memory.
func Init(mem []byte, capacity int) (*Queue, error) {
	if err := checkMem(mem); err != nil {
		return nil, fmt.Errorf("shmq: init: %w", err)
	}
	size := Size(capacity)
	if size == 0 {
		return nil, fmt.Errorf("shmq: init: capacity %d is not a power of two in [%d, %d]; pick e.g. 262144", capacity, MinCapacity, MaxCapacity)
	}
	if len(mem) < size {
		return nil, fmt.Errorf("shmq: init: memory is %d bytes, a queue of capacity %d needs Size()=%d", len(mem), capacity, size)
	}
	mem = mem[:size:size]
	clear(mem[:HeaderSize])
	le := binary.LittleEndian
	le.PutUint32(mem[offVersion:], Version)
	le.PutUint64(mem[offCapacity:], uint64(capacity))
	le.PutUint32(mem[offHeaderSize:], HeaderSize)
	// Magic last and atomically: a header with a valid magic is complete.
	atomic.StoreUint32(u32at(mem, offMagic), Magic)
	return newQueue(mem, uint64(capacity), 0, 0), nil
}

// HeaderImage returns the 256-byte header of an empty queue of the given
// capacity, as Init writes it, for a creator that writes it into shared
// memory some other way (pwrite on the memfd, so that its own mapping
// does not fault the page in). consumerWaiting presets the consumer's
// waiting flag, so that the producer's first Publish reports a waiting
// consumer (protocol version 2 arms TX queues this way).
func HeaderImage(capacity int, consumerWaiting bool) ([]byte, error) {
	if Size(capacity) == 0 {
		return nil, fmt.Errorf("shmq: header: capacity %d is not a power of two in [%d, %d]", capacity, MinCapacity, MaxCapacity)
	}
	b := make([]byte, HeaderSize)
	le := binary.LittleEndian
	le.PutUint32(b[offMagic:], Magic)
	le.PutUint32(b[offVersion:], Version)
	le.PutUint64(b[offCapacity:], uint64(capacity))
	le.PutUint32(b[offHeaderSize:], HeaderSize)
	if consumerWaiting {
		le.PutUint32(b[offConsWaiting:], 1)
	}
	return b, nil
}

// AttachFresh returns a view of a queue its caller just formatted (Init or
// HeaderImage) without reading the memory, so that creating the view does
// not fault its pages in: the indexes are taken to be 0, which the first
// index load of the peer's side then validates as usual. mem must hold
// Size(capacity) bytes, 8-byte aligned.
func AttachFresh(mem []byte, capacity int) (*Queue, error) {
	if err := checkMem(mem); err != nil {
		return nil, fmt.Errorf("shmq: attach: %w", err)
	}
	size := Size(capacity)
	if size == 0 || len(mem) < size {
		return nil, fmt.Errorf("shmq: attach: %d bytes cannot hold a queue of capacity %d", len(mem), capacity)
	}
	return newQueue(mem[:size:size], uint64(capacity), 0, 0), nil
}

// Attach validates a queue formatted by Init (normally by the peer) and
// returns this side's view. It checks magic, version, header size, the
// capacity against len(mem) (mem must hold at least Size(capacity) bytes;
// only that prefix is used, so the caller finds whatever follows at
// q.MemSize()) and the current indexes. Header errors wrap ErrCorrupt.
func Attach(mem []byte) (*Queue, error) {
	if err := checkMem(mem); err != nil {
		return nil, fmt.Errorf("shmq: attach: %w", err)
	}
	if len(mem) < HeaderSize {
		return nil, fmt.Errorf("shmq: attach: memory is %d bytes, smaller than the %d-byte header: %w", len(mem), HeaderSize, ErrCorrupt)
	}
	le := binary.LittleEndian
	if m := atomic.LoadUint32(u32at(mem, offMagic)); m != Magic {
		return nil, fmt.Errorf("shmq: attach: bad magic %#08x (want %#08x); the memory is not a queue or was not initialised: %w", m, Magic, ErrCorrupt)
	}
	if v := le.Uint32(mem[offVersion:]); v != Version {
		return nil, fmt.Errorf("shmq: attach: layout version %d, this build speaks %d; run matching daemon and client versions: %w", v, Version, ErrCorrupt)
	}
	if h := le.Uint32(mem[offHeaderSize:]); h != HeaderSize {
		return nil, fmt.Errorf("shmq: attach: header size %d, want %d: %w", h, HeaderSize, ErrCorrupt)
	}
	capacity := le.Uint64(mem[offCapacity:])
	if !validCapacity(capacity) {
		return nil, fmt.Errorf("shmq: attach: capacity %d is not a power of two in [%d, %d]: %w", capacity, MinCapacity, MaxCapacity, ErrCorrupt)
	}
	size := HeaderSize + capacity
	if uint64(len(mem)) < size {
		return nil, fmt.Errorf("shmq: attach: header says capacity %d (%d bytes) but only %d bytes are mapped: %w", capacity, size, len(mem), ErrCorrupt)
	}
	mem = mem[:size:size]
	// Consumer index first: when one side is live (e.g. a restarted daemon
	// re-attaching while the application keeps going), the index it does
	// not own can only have moved towards the one loaded second, so a
	// consistent pair never looks corrupt.
	cons := atomic.LoadUint64(u64at(mem, offConsumer))
	prod := atomic.LoadUint64(u64at(mem, offProducer))
	if prod%8 != 0 || cons%8 != 0 || prod-cons > capacity {
		return nil, fmt.Errorf("shmq: attach: inconsistent indexes producer=%d consumer=%d capacity=%d: %w", prod, cons, capacity, ErrCorrupt)
	}
	return newQueue(mem, capacity, prod, cons), nil
}

func checkMem(mem []byte) error {
	if !hostLittleEndian {
		return errors.New("the queue layout is little-endian and this host is big-endian; unsupported")
	}
	if len(mem) == 0 {
		return errors.New("empty memory")
	}
	// 64-bit atomics need natural alignment (and would split cache lines otherwise).
	if uintptr(unsafe.Pointer(&mem[0]))%8 != 0 {
		return errors.New("memory is not 8-byte aligned; use an mmap'ed region or a []byte carved from a []uint64")
	}
	return nil
}

func u64at(mem []byte, off int) *uint64 { return (*uint64)(unsafe.Pointer(&mem[off])) }
func u32at(mem []byte, off int) *uint32 { return (*uint32)(unsafe.Pointer(&mem[off])) }

func newQueue(mem []byte, capacity, prod, cons uint64) *Queue {
	q := &Queue{
		mem:         mem,
		data:        mem[HeaderSize:],
		capacity:    capacity,
		mask:        capacity - 1,
		maxPayload:  int(capacity/2 - RecordHeaderSize),
		prodIdx:     u64at(mem, offProducer),
		consIdx:     u64at(mem, offConsumer),
		dropped:     u64at(mem, offDropped),
		consWaiting: u32at(mem, offConsWaiting),
		prodWaiting: u32at(mem, offProdWaiting),
	}
	q.p = producerState{idx: prod, published: prod, cachedCons: cons, resN: -1}
	q.c = consumerState{idx: cons, released: cons, cachedProd: prod}
	return q
}

// Resync re-reads both shared indexes into this side's state, as Attach
// does: for a queue attached ahead of time whose previous user on this
// side (an old daemon handing over) went on until now. Nothing may be
// reserved or peeked.
func (q *Queue) Resync() error {
	cons := atomic.LoadUint64(q.consIdx)
	prod := atomic.LoadUint64(q.prodIdx)
	if prod%8 != 0 || cons%8 != 0 || prod-cons > q.capacity {
		return fmt.Errorf("shmq: resync: inconsistent indexes producer=%d consumer=%d capacity=%d: %w", prod, cons, q.capacity, ErrCorrupt)
	}
	q.p = producerState{idx: prod, published: prod, cachedCons: cons, resN: -1}
	q.c = consumerState{idx: cons, released: cons, cachedProd: prod}
	return nil
}

// Capacity returns the data area size in bytes.
func (q *Queue) Capacity() int { return int(q.capacity) }

// MaxPayload returns the largest payload Reserve accepts (Capacity()/2 - 8).
func (q *Queue) MaxPayload() int { return q.maxPayload }

// MemSize returns the bytes of memory the queue occupies (Size(Capacity())).
func (q *Queue) MemSize() int { return len(q.mem) }

// Len returns the published, unreleased bytes (records, headers and
// padding) as currently seen in shared memory, clamped to [0, Capacity()].
func (q *Queue) Len() int {
	cons := atomic.LoadUint64(q.consIdx)
	prod := atomic.LoadUint64(q.prodIdx)
	if d := prod - cons; d <= q.capacity {
		return int(d)
	}
	// Garbage from the peer, or a torn pair of loads; report "full" rather
	// than a nonsense number.
	return int(q.capacity)
}

// Occupancy returns the bytes waiting in the queue at mem (formatted, of
// the given capacity) without a Queue view: a reader that samples many
// queues now and then (the stats publisher) keeps no per-queue state.
// Garbage indexes read as full, as in Len.
func Occupancy(mem []byte, capacity int) int {
	if len(mem) < HeaderSize {
		return 0
	}
	cons := atomic.LoadUint64(u64at(mem, offConsumer))
	prod := atomic.LoadUint64(u64at(mem, offProducer))
	if d := prod - cons; d <= uint64(capacity) {
		return int(d)
	}
	return capacity
}

// Free returns Capacity() - Len().
func (q *Queue) Free() int { return int(q.capacity) - q.Len() }

// Dropped returns the producer's count of records dropped because the queue
// was full (as written in shared memory, so peer-controlled).
func (q *Queue) Dropped() uint64 { return atomic.LoadUint64(q.dropped) }

// ConsumerError is the error number the consumer stored when it stopped
// taking records for good (SetConsumerError), 0 while it takes them.
// Safe from any goroutine.
func (q *Queue) ConsumerError() uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&q.mem[offConsError])))
}

// SetConsumerError tells the producer that the consumer takes no more
// records, why as an error number (a stream socket's daemon side after
// the connection failed: the client's next write fails with it). Consumer
// side.
func (q *Queue) SetConsumerError(errno uint32) {
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&q.mem[offConsError])), errno)
}

// AddDropped adds n to the shared dropped counter. Producer side.
func (q *Queue) AddDropped(n uint64) { atomic.AddUint64(q.dropped, n) }

// ---- producer side ----

// refreshCons loads and validates the consumer index. It may only move
// forward from the cached value and never past what was published.
func (q *Queue) refreshCons() bool {
	cons := atomic.LoadUint64(q.consIdx)
	p := &q.p
	if cons%8 != 0 || cons-p.cachedCons > p.published-p.cachedCons {
		p.corrupt = true
		return false
	}
	p.cachedCons = cons
	return true
}

// placement returns where a record of total bytes goes: the padding needed
// before it (0 if it fits before the end) and the total space needed.
func (q *Queue) placement(total uint64) (pad, need uint64) {
	off := q.p.idx & q.mask
	if off+total > q.capacity {
		pad = q.capacity - off
	}
	return pad, pad + total
}

// Reserve returns space for one record with an n-byte payload. The record
// is invisible to the consumer until Commit and Publish. Only one record can
// be reserved at a time; a second Reserve before Commit replaces the first.
// It returns ErrTooBig if n is negative or exceeds MaxPayload, ErrFull if the
// consumer has not freed enough space (count a drop with AddDropped, or wait
// with Policy.WaitWritable), and ErrCorrupt if the consumer index is invalid.
func (q *Queue) Reserve(n int) ([]byte, error) {
	p := &q.p
	if p.corrupt {
		return nil, ErrCorrupt
	}
	if n < 0 || n > q.maxPayload {
		return nil, ErrTooBig
	}
	total := RecordHeaderSize + align8(uint64(n))
	pad, need := q.placement(total)
	if need > q.capacity-(p.idx-p.cachedCons) {
		if !q.refreshCons() {
			return nil, ErrCorrupt
		}
		if need > q.capacity-(p.idx-p.cachedCons) {
			return nil, ErrFull
		}
	}
	off := p.idx & q.mask
	if pad > 0 {
		le := binary.LittleEndian
		le.PutUint32(q.data[off:], uint32(pad-RecordHeaderSize))
		le.PutUint32(q.data[off+4:], TypePad)
		p.idx += pad
		off = 0
	}
	p.resOff = off
	p.resN = n
	start := off + RecordHeaderSize
	return q.data[start : start+uint64(n) : start+uint64(n)], nil
}

// Commit finishes the reserved record with its final payload length n (at
// most the reserved length) and type typ (anything but TypePad). The record
// becomes visible at the next Publish.
func (q *Queue) Commit(n int, typ uint32) error {
	p := &q.p
	if p.resN < 0 {
		return errors.New("shmq: commit without a successful Reserve")
	}
	if n < 0 || n > p.resN {
		return fmt.Errorf("shmq: commit of %d bytes but %d were reserved", n, p.resN)
	}
	if typ == TypePad {
		return fmt.Errorf("shmq: record type %#x is reserved for padding", TypePad)
	}
	le := binary.LittleEndian
	le.PutUint32(q.data[p.resOff:], uint32(n))
	le.PutUint32(q.data[p.resOff+4:], typ)
	p.idx += RecordHeaderSize + align8(uint64(n))
	p.resN = -1
	return nil
}

// Push copies payload into a new record of type typ (Reserve + copy +
// Commit). The record becomes visible at the next Publish.
func (q *Queue) Push(typ uint32, payload []byte) error {
	if typ == TypePad {
		return fmt.Errorf("shmq: record type %#x is reserved for padding", TypePad)
	}
	b, err := q.Reserve(len(payload))
	if err != nil {
		return err
	}
	copy(b, payload)
	return q.Commit(len(payload), typ)
}

// Publish makes all committed records visible to the consumer. It returns
// true if the consumer had announced it is going to sleep: the caller must
// then Wake the consumer's Waiter.
func (q *Queue) Publish() bool {
	p := &q.p
	if p.idx == p.published {
		return false
	}
	// Dekker: store index, then load flag. Swap, not Store: it is a full
	// barrier on every build, while race-detector builds implement Store as
	// a release store that a later load may overtake (golang/go#58020; seen
	// here as a lost wake-up between two processes).
	atomic.SwapUint64(q.prodIdx, p.idx)
	p.published = p.idx
	// Load first so the common case does not write the shared line.
	if atomic.LoadUint32(q.consWaiting) != 0 {
		return atomic.SwapUint32(q.consWaiting, 0) != 0
	}
	return false
}

// Pending returns the bytes committed but not yet published. Producer side.
func (q *Queue) Pending() int { return int(q.p.idx - q.p.published) }

// Writable reports whether Reserve(n) would not return ErrFull right now
// (it returns true on ErrTooBig and corruption so the caller learns about
// them from Reserve). Producer side.
func (q *Queue) Writable(n int) bool {
	p := &q.p
	if p.corrupt || n < 0 || n > q.maxPayload {
		return true
	}
	_, need := q.placement(RecordHeaderSize + align8(uint64(n)))
	if need <= q.capacity-(p.idx-p.cachedCons) {
		return true
	}
	if !q.refreshCons() {
		return true
	}
	return need <= q.capacity-(p.idx-p.cachedCons)
}

// ArmWriteWait announces that the producer is about to sleep until space
// for an n-byte record is available, then re-checks. If it returns true,
// the space is (or may be) there: do not sleep (DisarmWriteWait is
// optional). Otherwise sleep on the producer's Waiter; the consumer's
// Release reports when to wake it.
func (q *Queue) ArmWriteWait(n int) bool {
	atomic.SwapUint32(q.prodWaiting, 1) // Dekker: store flag, then load index (Swap: see Publish)
	return q.Writable(n)
}

// DisarmWriteWait withdraws ArmWriteWait (the producer no longer sleeps).
func (q *Queue) DisarmWriteWait() { atomic.StoreUint32(q.prodWaiting, 0) }

// ---- consumer side ----

// refreshProd loads and validates the producer index: it must be aligned,
// at most Capacity() ahead of the consumer and never move backwards.
func (q *Queue) refreshProd() bool {
	prod := atomic.LoadUint64(q.prodIdx)
	c := &q.c
	d := prod - c.idx
	if prod%8 != 0 || d > q.capacity || d < c.cachedProd-c.idx {
		c.corrupt = true
		return false
	}
	c.cachedProd = prod
	return true
}

// Peek returns the next record without consuming it: its payload (a view
// into shared memory, valid until Release; copy it before parsing if the
// producer is untrusted) and its type. It returns ErrEmpty when nothing is
// published and ErrCorrupt (sticky) when the producer wrote garbage. Peek
// again without Advance returns the same record.
func (q *Queue) Peek() ([]byte, uint32, error) {
	c := &q.c
	if c.peekTotal != 0 {
		s := c.peekOff + RecordHeaderSize
		return q.data[s : s+uint64(c.peekLen) : s+uint64(c.peekLen)], c.peekTyp, nil
	}
	if c.corrupt {
		return nil, 0, ErrCorrupt
	}
	le := binary.LittleEndian
	// At most two rounds: a padding record never starts at offset 0, so the
	// record after one is at offset 0 and is not padding.
	for range 2 {
		avail := c.cachedProd - c.idx
		if avail == 0 {
			if !q.refreshProd() {
				return nil, 0, ErrCorrupt
			}
			if avail = c.cachedProd - c.idx; avail == 0 {
				return nil, 0, ErrEmpty
			}
		}
		off := c.idx & q.mask
		if avail < RecordHeaderSize {
			return q.corruptRecord()
		}
		n := le.Uint32(q.data[off:])
		typ := le.Uint32(q.data[off+4:])
		if typ == TypePad {
			span := q.capacity - off
			if off == 0 || uint64(n) != span-RecordHeaderSize || span > avail {
				return q.corruptRecord()
			}
			c.idx += span
			continue
		}
		if int64(n) > int64(q.maxPayload) {
			return q.corruptRecord()
		}
		total := RecordHeaderSize + align8(uint64(n))
		if off+total > q.capacity || total > avail {
			return q.corruptRecord()
		}
		c.peekTotal, c.peekOff, c.peekLen, c.peekTyp = total, off, n, typ
		s := off + RecordHeaderSize
		return q.data[s : s+uint64(n) : s+uint64(n)], typ, nil
	}
	return q.corruptRecord()
}

func (q *Queue) corruptRecord() ([]byte, uint32, error) {
	q.c.corrupt = true
	return nil, 0, ErrCorrupt
}

// Advance consumes the record returned by the last Peek. The space is
// returned to the producer at the next Release. Without a pending Peek it
// does nothing.
func (q *Queue) Advance() {
	c := &q.c
	c.idx += c.peekTotal
	c.peekTotal = 0
}

// Release publishes the consumer index, returning the space of all advanced
// records (and skipped padding) to the producer. It returns true if the
// producer had announced it is waiting for space: the caller must then Wake
// the producer's Waiter.
func (q *Queue) Release() bool {
	c := &q.c
	if c.idx == c.released {
		return false
	}
	atomic.SwapUint64(q.consIdx, c.idx) // Dekker: store index, then load flag (Swap: see Publish)
	c.released = c.idx
	if atomic.LoadUint32(q.prodWaiting) != 0 {
		return atomic.SwapUint32(q.prodWaiting, 0) != 0
	}
	return false
}

// Readable reports whether Peek would not return ErrEmpty (a record is
// available, or the queue is corrupt). Consumer side.
func (q *Queue) Readable() bool {
	c := &q.c
	if c.peekTotal != 0 || c.corrupt || c.cachedProd != c.idx {
		return true
	}
	return atomic.LoadUint64(q.prodIdx) != c.idx
}

// ArmReadWait announces that the consumer is about to sleep until a record
// arrives, then re-checks. If it returns true a record is (or may be)
// there: do not sleep (DisarmReadWait is optional). Otherwise sleep on the
// consumer's Waiter; the producer's Publish reports when to wake it.
func (q *Queue) ArmReadWait() bool {
	atomic.SwapUint32(q.consWaiting, 1) // Dekker: store flag, then load index (Swap: see Publish)
	return q.Readable()
}

// DisarmReadWait withdraws ArmReadWait (the consumer no longer sleeps).
func (q *Queue) DisarmReadWait() { atomic.StoreUint32(q.consWaiting, 0) }
