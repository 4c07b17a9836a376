// Package shmsess is the session memory of control protocol version 2: one
// memfd per client session holding the queues of all its sockets (carved
// from an arena), the per-socket ready bits (three-level bitmaps: the
// events bitmap, daemon → client, and one announce bitmap per lane, client
// → daemon) and the sleep flags that decide when an eventfd is written.
//
// This package owns: the byte layout (Layout, Init, Attach), the bitmaps'
// set and drain algorithms (Bitmap), the sleep-flag protocol on both sides
// (Session.Announce, Session.Event, the Arm/Disarm methods) and the daemon's
// allocator of slots and queue ranges (Arena). It does not own the queues'
// own layout (internal/shmq), how the memfd and eventfds travel
// (internal/ctlproto), or what a woken side does (ring engine, socket
// package).
//
// docs/shm-queue.md ("Session memory") specifies the same byte by byte for
// other implementations (the C preload library); TestLayoutExample checks
// its worked example.
package shmsess

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"
)

// Layout constants.
const (
	Magic      uint32 = 0x53445042 // "BPDS" in little-endian byte order
	Version    uint32 = 2          // the control protocol version that defined it
	HeaderSize        = 4096
	// MaxSlots is the most sockets a session can have: 64 mid words of 64
	// leaf words of 64 bits.
	MaxSlots = 64 * 64 * 64
	// MaxLanes bounds the lanes (rings) a session announces on; the HELLO
	// reply carries one doorbell descriptor per lane.
	MaxLanes = 64
	// PageSize is the granularity of the arena and of queue placement. It
	// is fixed by the layout, not read from the host.
	PageSize = 4096
	// LaneHeaderSize is the lane block's sleep-flag line before its bitmap.
	LaneHeaderSize = 64
)

// Header field offsets.
const (
	offMagic          = 0
	offVersion        = 4
	offSize           = 8
	offHeaderSize     = 16
	offMaxSlots       = 20
	offLanes          = 24
	offEventsOffset   = 32
	offLanesOffset    = 40
	offLaneStride     = 48
	offArenaOffset    = 56
	offArenaSize      = 64
	offClientSleeping = 128
)

// ErrCorrupt is wrapped by Attach for a header that does not describe a
// valid session memory of the expected shape.
var ErrCorrupt = errors.New("shmsess: session memory header invalid")

func align(n, a int64) int64 { return (n + a - 1) / a * a }

// Layout is where everything sits in a session memory of MaxSlots slots
// and Lanes lanes. Every field follows from those two and ArenaSize.
type Layout struct {
	MaxSlots, Lanes int
	// Words and Mids are the leaf and mid words of each bitmap.
	Words, Mids  int
	BitmapSize   int64
	EventsOffset int64
	LanesOffset  int64
	LaneStride   int64
	ArenaOffset  int64
	ArenaSize    int64
	Size         int64
}

// NewLayout computes the layout for maxSlots sockets, lanes lanes and an
// arena of at least arenaBytes (rounded up to PageSize).
func NewLayout(maxSlots, lanes int, arenaBytes int64) (Layout, error) {
	if maxSlots < 1 || maxSlots > MaxSlots {
		return Layout{}, fmt.Errorf("shmsess: %d slots: must be 1..%d", maxSlots, MaxSlots)
	}
	if lanes < 1 || lanes > MaxLanes {
		return Layout{}, fmt.Errorf("shmsess: %d lanes: must be 1..%d (one per ring)", lanes, MaxLanes)
	}
	if arenaBytes < PageSize || arenaBytes > 1<<46 {
		return Layout{}, fmt.Errorf("shmsess: arena of %d bytes: must be %d bytes to 64 TiB", arenaBytes, PageSize)
	}
	l := Layout{MaxSlots: maxSlots, Lanes: lanes}
	l.Words = (maxSlots + 63) / 64
	l.Mids = (l.Words + 63) / 64
	l.BitmapSize = 64 + align(int64(8*l.Mids), 64) + align(int64(8*l.Words), 64)
	l.EventsOffset = HeaderSize
	l.LanesOffset = align(l.EventsOffset+l.BitmapSize, PageSize)
	l.LaneStride = align(LaneHeaderSize+l.BitmapSize, 64)
	l.ArenaOffset = align(l.LanesOffset+int64(lanes)*l.LaneStride, PageSize)
	l.ArenaSize = align(arenaBytes, PageSize)
	l.Size = l.ArenaOffset + l.ArenaSize
	return l, nil
}

// QueueSpan is the arena bytes one queue of capacity queueBytes takes: its
// 256-byte header and data area, rounded up to a page (each queue starts on
// a page boundary).
func QueueSpan(queueBytes int) int64 { return align(int64(256+queueBytes), PageSize) }

// SocketSpan is what one socket (a TX and an RX queue) takes from the
// arena and from the client's queue memory budget.
func SocketSpan(queueBytes int) int64 { return 2 * QueueSpan(queueBytes) }

var hostLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// writeHeader formats the header of mem (at least HeaderSize bytes) for l,
// magic last.
func writeHeader(mem []byte, l Layout) {
	clear(mem[:HeaderSize])
	le := binary.LittleEndian
	le.PutUint32(mem[offVersion:], Version)
	le.PutUint64(mem[offSize:], uint64(l.Size))
	le.PutUint32(mem[offHeaderSize:], HeaderSize)
	le.PutUint32(mem[offMaxSlots:], uint32(l.MaxSlots))
	le.PutUint32(mem[offLanes:], uint32(l.Lanes))
	le.PutUint64(mem[offEventsOffset:], uint64(l.EventsOffset))
	le.PutUint64(mem[offLanesOffset:], uint64(l.LanesOffset))
	le.PutUint64(mem[offLaneStride:], uint64(l.LaneStride))
	le.PutUint64(mem[offArenaOffset:], uint64(l.ArenaOffset))
	le.PutUint64(mem[offArenaSize:], uint64(l.ArenaSize))
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&mem[offMagic])), Magic)
}

// readLayout validates the header of mem against the expected slots and
// lanes (from the HELLO reply) and the mapping's size.
func readLayout(mem []byte, maxSlots, lanes int) (Layout, error) {
	if !hostLittleEndian {
		return Layout{}, errors.New("shmsess: the session layout is little-endian and this host is big-endian; unsupported")
	}
	if len(mem) < HeaderSize {
		return Layout{}, fmt.Errorf("shmsess: %d bytes mapped, less than the %d-byte header: %w", len(mem), HeaderSize, ErrCorrupt)
	}
	le := binary.LittleEndian
	if m := atomic.LoadUint32((*uint32)(unsafe.Pointer(&mem[offMagic]))); m != Magic {
		return Layout{}, fmt.Errorf("shmsess: bad magic %#08x (want %#08x): not a session memory: %w", m, Magic, ErrCorrupt)
	}
	if v := le.Uint32(mem[offVersion:]); v != Version {
		return Layout{}, fmt.Errorf("shmsess: session memory version %d, this build speaks %d; run matching daemon and client versions: %w", v, Version, ErrCorrupt)
	}
	if h := le.Uint32(mem[offHeaderSize:]); h != HeaderSize {
		return Layout{}, fmt.Errorf("shmsess: header size %d, want %d: %w", h, HeaderSize, ErrCorrupt)
	}
	if s, n := le.Uint32(mem[offMaxSlots:]), le.Uint32(mem[offLanes:]); int(s) != maxSlots || int(n) != lanes {
		return Layout{}, fmt.Errorf("shmsess: header says %d slots and %d lanes, the HELLO reply %d and %d: %w", s, n, maxSlots, lanes, ErrCorrupt)
	}
	arena := le.Uint64(mem[offArenaSize:])
	if arena > 1<<46 || arena%PageSize != 0 {
		return Layout{}, fmt.Errorf("shmsess: arena size %d is not a page multiple up to 64 TiB: %w", arena, ErrCorrupt)
	}
	l, err := NewLayout(maxSlots, lanes, int64(arena))
	if err != nil {
		return Layout{}, fmt.Errorf("%w: %w", err, ErrCorrupt)
	}
	got := [...]uint64{le.Uint64(mem[offSize:]), le.Uint64(mem[offEventsOffset:]), le.Uint64(mem[offLanesOffset:]),
		le.Uint64(mem[offLaneStride:]), le.Uint64(mem[offArenaOffset:])}
	want := [...]int64{l.Size, l.EventsOffset, l.LanesOffset, l.LaneStride, l.ArenaOffset}
	for i := range got {
		if got[i] != uint64(want[i]) {
			return Layout{}, fmt.Errorf("shmsess: header field %d is %d, the layout of %d slots, %d lanes and a %d-byte arena needs %d; daemon and client disagree on the layout: %w",
				i, got[i], maxSlots, lanes, arena, want[i], ErrCorrupt)
		}
	}
	if int64(len(mem)) != l.Size {
		return Layout{}, fmt.Errorf("shmsess: header says %d bytes, %d are mapped: %w", l.Size, len(mem), ErrCorrupt)
	}
	return l, nil
}
