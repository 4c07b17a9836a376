package afxdp

import (
	"errors"
	"fmt"

	"github.com/bypassd/bypassd/ring/devmem"
	"github.com/bypassd/bypassd/ring/qp"
)

// Staging region. Config.DeviceMemory reserves whole UMEM chunks after the
// RX and TX pools; they are registered with the UMEM (so a zero-copy NIC
// reads them directly) but belong to neither pool: they never enter the
// fill ring or the TX free list. AllocDeviceMemory lends them to the
// engine's staging allocator, and Complete hands their completions back to
// it instead of to the free list.
//
// The UMEM stays in aligned-chunk mode, where the kernel refuses a TX
// descriptor whose bytes cross a chunk boundary (xp_aligned_validate_desc:
// offset within the chunk + length must not exceed the chunk size). On the
// 6.18 kernel of our lab such a descriptor is counted in tx_invalid_descs
// and not sent, though its address does come back through the completion
// ring (TestChunkCrossingRefused pins this). The region
// therefore reports its chunk size (devmem.Chunked) and the allocator never
// places a frame across one. Unaligned-chunk mode would lift that limit but
// changes how RX descriptors encode addresses for the whole UMEM, and in
// zero-copy mode it still refuses frames crossing non-contiguous pages. The
// price of staying aligned is the skipped tail of each chunk: small for
// small frames, 606 of every 2,048 bytes with 1,442-byte frames (one per
// chunk), which only means a larger --dev-mem-tx for the same burst.

// stageRegion is the reserved part of the UMEM, as a devmem region.
type stageRegion struct {
	*devmem.MemRegion
	umem  []byte
	base  uint64
	size  int
	chunk int
}

var _ qp.MappedRegion = (*stageRegion)(nil)
var _ devmem.Chunked = (*stageRegion)(nil)

// Mapped implements qp.MappedRegion: the region is UMEM, in this
// process's memory.
func (r *stageRegion) Mapped() bool { return true }

// ChunkSize implements devmem.Chunked: the UMEM chunk (frame) size.
func (r *stageRegion) ChunkSize() int { return r.chunk }

// TXFrame implements qp.DeviceRegion.
func (r *stageRegion) TXFrame(off, n int) qp.Frame {
	a := r.base + uint64(off)
	return qp.Frame{Buf: r.umem[a : a+uint64(n) : a+uint64(n)], Handle: a}
}

// Offset implements qp.DeviceRegion.
func (r *stageRegion) Offset(f qp.Frame) (int, bool) {
	if f.Handle < r.base || f.Handle >= r.base+uint64(r.size) {
		return 0, false
	}
	return int(f.Handle - r.base), true
}

// stageFrames is how many whole chunks hold n bytes of staging memory.
func stageFrames(n, frameSize int) int {
	return (n + frameSize - 1) / frameSize
}

// AllocDeviceMemory implements qp.DeviceMemory: it lends size bytes of the
// reserved UMEM chunks (Config.DeviceMemory) to the staging allocator.
func (s *Socket) AllocDeviceMemory(size int, released func(off int)) (qp.DeviceRegion, error) {
	switch {
	case s.closed:
		return nil, qp.ErrClosed
	case released == nil:
		return nil, errors.New("afxdp: device memory needs a release callback for completed staged frames")
	case s.stage != nil:
		return nil, fmt.Errorf("afxdp %s queue %d: the staging region is already allocated (one per socket)", s.cfg.IfName, s.cfg.Queue)
	case size <= 0 || size > s.cfg.DeviceMemory:
		return nil, fmt.Errorf("afxdp %s queue %d: %d bytes of staging memory asked, %d reserved at open (raise Config.DeviceMemory)",
			s.cfg.IfName, s.cfg.Queue, size, s.cfg.DeviceMemory)
	}
	base := s.stageBase
	s.stage = &stageRegion{
		MemRegion: devmem.NewMemRegion(s.umem[base : base+uint64(size) : base+uint64(size)]),
		umem:      s.umem, base: base, size: size, chunk: s.cfg.FrameSize,
	}
	s.released = released
	return s.stage, nil
}
