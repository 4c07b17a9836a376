// Package qp defines what a raw queue pair ("raw QP") can do: the Provider
// interface that every ring backend implements (afxdp, tap, verbs) and the
// frame and capability types they exchange with the ring engine.
//
// A provider owns its packet buffers (the AF_XDP UMEM, a TAP read buffer pool,
// a verbs memory region). The engine borrows them through Frame values: RX
// frames are handed out by RXBurst and must come back through ReleaseRX; TX
// frames are taken with AllocTX, filled, and either posted with TXBurst or
// returned unused with FreeTX. Completions are reaped by the provider itself
// when AllocTX runs short, or explicitly with Complete.
//
// The package owns no implementation (but TXPool, the send-buffer free list
// that buffer-owning providers share, and the registry of provider openers,
// Register and Open, see registry.go): it is the seam between the engine
// (package ring) and the providers, so that neither imports the other's
// internals. Optional hardware features (rate limiting, device memory, clock)
// are separate small interfaces that a provider implements when it can; the
// engine discovers them with a type assertion and emulates them otherwise.
package qp

import (
	"errors"
	"time"

	"github.com/bypassd/bypassd/ring/clock/tsconv"
	"github.com/bypassd/bypassd/ring/devmem"
)

// Frame is one packet buffer borrowed from a provider.
type Frame struct {
	// Buf is the packet: for RX the received bytes, for TX the whole
	// writable buffer on AllocTX (the engine reslices it to the frame length
	// before TXBurst).
	Buf []byte
	// Handle identifies the buffer to its provider (for AF_XDP, the UMEM
	// address). Opaque to the engine.
	Handle uint64
	// HWTimestamp is the hardware receive timestamp in device ticks, or 0
	// when the provider or driver gives none (a normal case).
	HWTimestamp uint64
	// Tagged is set when the steering told which queue's ring owns the
	// frame's flow (the XDP program's flow tag): Home is that queue. An
	// untagged frame belongs to the ring that received it.
	Tagged bool
	Home   uint32
	// SendQueue is, for TX, the rate-limited send queue the frame goes on
	// (a number the engine gave RateLimiter.SetRateLimit); 0 is the
	// provider's default, unpaced queue. Providers without RateLimiter
	// ignore it.
	SendQueue int
	// MSS, on TX, marks a large TCP packet in a buffer from
	// Segmenter.AllocTSO: the device cuts its payload into segments of MSS
	// bytes and puts a copy of its first HeaderLen bytes (Ethernet, IP and
	// TCP headers) in front of each, with that segment's lengths, sequence
	// number, flags and checksums. 0: Buf is one frame as it goes on the
	// wire.
	MSS, HeaderLen uint16
}

// Caps describes what a provider instance can do. Fields that later features
// fill in are documented with their zero meaning.
type Caps struct {
	// Name of the provider ("afxdp", "tap", "verbs").
	Provider string
	// Mode is a provider-specific description of how it runs, e.g.
	// "native/copy" or "generic/copy" for AF_XDP.
	Mode string
	// ZeroCopy reports whether the NIC reads and writes the buffers directly.
	ZeroCopy bool
	// FrameSize is the capacity of one buffer; the largest frame that can be
	// sent or received in one descriptor.
	FrameSize int
	// MaxFrame is the largest Ethernet frame (headers included, no FCS)
	// one Frame carries in either direction: a buffer less its headroom,
	// or, with MultiBuffer, the chain of buffers an MTU-sized frame
	// needs. The ring refuses an interface whose MTU does not fit.
	MaxFrame int
	// MultiBuffer reports that frames larger than one buffer travel as
	// descriptor chains (AF_XDP XDP_USE_SG); the provider linearizes them
	// on receive and splits them on transmit, so Frames stay one buffer
	// each for the engine.
	MultiBuffer bool
	// RXFrames and TXFrames are the buffer counts reserved for each direction.
	RXFrames, TXFrames int
	// RateLimit describes hardware pacing; nil means the engine paces in
	// software.
	RateLimit *RateLimitCaps
	// DeviceMemory is the number of bytes of staging memory the provider
	// can hand out through DeviceMemory (0: none; the engine never stages).
	DeviceMemory int
	// HWTimestamps reports whether RX frames may carry HWTimestamp.
	HWTimestamps bool
}

// RateLimitCaps are the hardware packet-pacing limits of a device, in kbit/s.
type RateLimitCaps struct {
	MinKbps, MaxKbps uint32
	// Burst reports whether max burst size and typical packet size can be set.
	Burst bool
}

// Stats are provider-level counters, cumulative since Open.
type Stats struct {
	RXPackets, TXPackets uint64
	// RXDropped counts frames the kernel dropped because the RX ring was
	// full or no fill buffers were available.
	RXDropped uint64
	// FillEmpty counts times the provider found no buffer to give the
	// device for reception (fill starvation).
	FillEmpty uint64
	// TXNoBuffer counts AllocTX calls that returned fewer frames than asked
	// (completion starvation).
	TXNoBuffer uint64
	// Kicks counts system calls made to wake the kernel or device.
	Kicks uint64
	// InvalidDescs counts descriptors the kernel rejected (RX and TX).
	InvalidDescs uint64
	// RXBadChains counts received multi-buffer frames dropped because
	// their descriptor chain was malformed or longer than any frame of
	// the interface's MTU (Caps.MultiBuffer only).
	RXBadChains uint64
	// RXChains and TXChains count frames that travelled as descriptor
	// chains (more than one buffer).
	RXChains, TXChains uint64
	// TXTSOPackets counts large TCP packets the device segmented
	// (Segmenter): each went on the wire as several frames.
	TXTSOPackets uint64
}

// Provider is a raw queue pair on one (interface, queue): a receive ring
// and a send ring over buffers the provider owns. Methods are called from the
// single engine thread that owns the provider; only Close may be called from
// another goroutine, and only after that thread has stopped using it.
type Provider interface {
	// Caps reports the instance's capabilities.
	Caps() Caps
	// RXBurst fills frames with received packets and returns how many.
	RXBurst(frames []Frame) int
	// ReleaseRX gives received buffers back for reception.
	ReleaseRX(frames []Frame)
	// AllocTX fills frames with empty send buffers and returns how many were
	// available (reaping completions first if needed).
	AllocTX(frames []Frame) int
	// FreeTX returns allocated send buffers that will not be posted.
	FreeTX(frames []Frame)
	// TXBurst posts filled send buffers and returns how many were accepted;
	// the rest stay owned by the caller (post them later or FreeTX them).
	// An error means the queue is unusable (for example the link is down).
	TXBurst(frames []Frame) (int, error)
	// Complete reaps send completions, making their buffers reusable, and
	// returns how many were reaped.
	Complete() int
	// TXPending reports posted frames not yet completed.
	TXPending() int
	// Wait blocks until packets may have arrived, TX completions are due,
	// or extra becomes readable, or the timeout passes (negative: forever).
	// It reports whether extra became readable. extra < 0 is ignored.
	// The timeout must be honoured to the microsecond, not rounded up to
	// milliseconds: the engine sleeps until the next paced departure.
	Wait(timeout time.Duration, extra int) (extraReady bool, err error)
	// FD returns the file descriptor that the XDP steering map or the
	// kernel associates with this queue (the XSK fd for AF_XDP).
	FD() int
	// Stats returns cumulative counters.
	Stats() Stats
	// Close releases the queue and every buffer; the same queue can be
	// opened again right after it returns.
	Close() error
}

// RateLimit is one pacing setting in the device's terms.
type RateLimit struct {
	Kbps         uint32
	MaxBurst     uint32
	TypicalBytes uint16
}

// RateLimiter is implemented by providers that pace in hardware (verbs:
// ibv_modify_qp_rate_limit on a send queue). Software providers do not
// implement it and the engine's scheduler paces instead.
//
// The engine numbers paced send queues from 1 and calls SetRateLimit when
// an endpoint's rate is set or changed, then tags that endpoint's frames
// with Frame.SendQueue. A zero RateLimit (Kbps 0) removes the limit: the
// queue number is free and may be given out again. An error makes the
// engine pace that endpoint in software on the default queue.
type RateLimiter interface {
	SetRateLimit(sendQueue int, rl RateLimit) error
}

// Segmenter is implemented by providers whose device segments large TCP
// packets itself (TSO, called LSO on RDMA devices). The engine hands such a
// provider one buffer per large packet instead of cutting it into frames in
// software; the packet goes through TXBurst and FreeTX like any frame.
type Segmenter interface {
	// AllocTSO takes a send buffer for one large TCP packet of size bytes
	// (from the Ethernet header on) whose headers take hdr bytes, into f
	// (f.Buf holds at least size bytes). false means not this one: the
	// device has no segmentation now, the packet or its headers are larger
	// than it takes, or no large buffer is free; the engine then cuts the
	// packet in software.
	AllocTSO(f *Frame, size, hdr int) bool
}

// DeviceMemory is implemented by providers that can stage egress frames in
// memory the device reads without a host round trip. The region is released
// with the provider.
type DeviceMemory interface {
	// AllocDeviceMemory reserves size bytes for the staging allocator
	// (package ring/devmem); at most Caps.DeviceMemory bytes, once per
	// provider. released is called on the engine thread, from Complete (and
	// from AllocTX, which reaps), with the region offset of every staged
	// frame whose send completed, in completion order, so that the
	// allocator gets its space back.
	AllocDeviceMemory(size int, released func(off int)) (DeviceRegion, error)
}

// DeviceRegion is staging memory a DeviceMemory provider handed out.
type DeviceRegion interface {
	devmem.Region
	// TXFrame returns the frame that posts the n bytes staged at off with
	// TXBurst. Such a frame never goes to FreeTX: its space comes back
	// through the released callback once sent, or through
	// devmem.Manager.Cancel when it is never posted.
	TXFrame(off, n int) Frame
	// Offset reports whether f is a frame of the region, and its offset.
	Offset(f Frame) (off int, ok bool)
}

// MappedRegion is a DeviceRegion in the process's own memory (an AF_XDP
// UMEM): the Buf of a TXFrame is the region itself, so the engine builds a
// frame where it is staged instead of copying it there.
type MappedRegion interface {
	DeviceRegion
	Mapped() bool
}

// ErrClosed is returned by operations on a closed provider.
var ErrClosed = errors.New("qp: provider closed")

// DeviceClock is implemented by a provider that reads its device's clock
// itself (verbs: ibv_query_rt_values_ex) instead of through a PHC, and
// stamps RX frames (Frame.HWTimestamp) with that clock in nanoseconds. The
// engine converts those stamps to system time with the returned clock.
type DeviceClock interface {
	Clock() (tsconv.Clock, tsconv.Capabilities)
}
