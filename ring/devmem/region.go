package devmem

import (
	"errors"
	"fmt"
)

// Region is the memory a provider lends the allocator. Offsets are relative to
// the start of the region; the provider maps them to device addresses (UMEM
// addresses, device-memory offsets).
type Region interface {
	// Size is the region's length in bytes. The allocator uses the largest
	// multiple of 8 not above it; 0 disables staging.
	Size() int
	// CopyTo writes b at off. The allocator only calls it with
	// off+len(b) <= Size().
	CopyTo(off int, b []byte) error
}

// Chunked is implemented by regions whose device refuses a packet that
// crosses a chunk boundary, such as an AF_XDP UMEM in aligned-chunk mode
// (the kernel rejects a TX descriptor whose bytes span two chunks). The
// Manager then never places a packet across a multiple of ChunkSize, a
// power of two; a packet larger than a chunk is not staged (oob).
type Chunked interface {
	ChunkSize() int
}

// ErrOutOfRange reports an access outside a MemRegion.
var ErrOutOfRange = errors.New("devmem: access outside the region")

// MemRegion is a Region over ordinary memory the process can address, such as
// the part of an AF_XDP UMEM reserved for staged frames (the NIC reads UMEM
// directly in zero-copy mode, so a plain copy is all staging needs).
type MemRegion struct {
	buf []byte
}

// NewMemRegion returns a Region over buf. The region aliases buf: staged
// packets are written into it, and the caller keeps buf alive and
// device-registered for as long as the region is in use.
func NewMemRegion(buf []byte) *MemRegion {
	return &MemRegion{buf: buf}
}

// Size returns len of the underlying buffer.
func (r *MemRegion) Size() int { return len(r.buf) }

// CopyTo copies b into the region at off.
func (r *MemRegion) CopyTo(off int, b []byte) error {
	if off < 0 || off > len(r.buf) || len(b) > len(r.buf)-off {
		return fmt.Errorf("devmem: copy %d bytes at offset %d into a %d-byte region: %w",
			len(b), off, len(r.buf), ErrOutOfRange)
	}
	copy(r.buf[off:], b)
	return nil
}

// Slice returns the n bytes at off, aliasing the region, so a provider can
// address a staged frame and tests can read it back.
func (r *MemRegion) Slice(off, n int) ([]byte, error) {
	if off < 0 || n < 0 || off > len(r.buf) || n > len(r.buf)-off {
		return nil, fmt.Errorf("devmem: slice %d bytes at offset %d of a %d-byte region: %w",
			n, off, len(r.buf), ErrOutOfRange)
	}
	return r.buf[off : off+n : off+n], nil
}
