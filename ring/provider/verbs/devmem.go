//go:build verbs

package verbs

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring/devmem"
	"github.com/bypassd/bypassd/ring/qp"
)

// dmGranule: allocations are rounded up to it (mlx5 hands out device memory
// in 64-byte units).
const dmGranule = 64

// DeviceRegion is on-device memory (ibv_alloc_dm) registered as a
// zero-based memory region, lent to the staging allocator. It implements
// qp.DeviceRegion: CopyTo writes with ibv_memcpy_to_dm, and TXFrame gives
// the frame TXBurst sends from device memory.
type DeviceRegion struct {
	dm   cDM
	mr   cMR
	lkey uint32
	size int
	// zeros backs the Buf of TXFrame frames: their bytes live on the
	// device, the host side only carries the length.
	zeros []byte
	// released gets the offset of every staged frame whose send completed.
	released func(off int)
}

var _ qp.DeviceRegion = (*DeviceRegion)(nil)

// Size implements devmem.Region.
func (r *DeviceRegion) Size() int { return r.size }

// CopyTo implements devmem.Region.
func (r *DeviceRegion) CopyTo(off int, b []byte) error {
	if off < 0 || off > r.size || len(b) > r.size-off {
		return fmt.Errorf("verbs: copy %d bytes at offset %d into %d bytes of device memory: %w",
			len(b), off, r.size, devmem.ErrOutOfRange)
	}
	if err := cMemcpyToDM(r.dm, off, b); err != nil {
		return translate("copy to device memory", err)
	}
	return nil
}

// TXFrame implements qp.DeviceRegion: the frame sends the n bytes staged at
// off from device memory. Its Buf has length n but does not hold the bytes
// (they are on the device, not mapped into the process).
func (r *DeviceRegion) TXFrame(off, n int) qp.Frame {
	return qp.Frame{Buf: r.zeros[:n:n], Handle: dmHandle | uint64(off)}
}

// Offset implements qp.DeviceRegion.
func (r *DeviceRegion) Offset(f qp.Frame) (int, bool) {
	if f.Handle&dmHandle == 0 {
		return 0, false
	}
	off := f.Handle &^ dmHandle
	if off >= uint64(r.size) {
		return 0, false
	}
	return int(off), true
}

func (r *DeviceRegion) release() error {
	return errors.Join(cDeregMR(r.mr), cFreeDM(r.dm))
}

// AllocDeviceMemory implements qp.DeviceMemory: size bytes of the device's
// memory (rounded up to 64, and at most what the device has), once per
// provider, released with it. released gets the offset of each staged frame
// as its send completes: in posting order per send queue, interleaved across
// queues (the staging allocator takes that).
func (p *Provider) AllocDeviceMemory(size int, released func(off int)) (qp.DeviceRegion, error) {
	name := fmt.Sprintf("verbs %s/%d: device memory", p.cfg.Interface, p.cfg.Queue)
	if p.closed {
		return nil, fmt.Errorf("%s: provider closed", name)
	}
	if p.dm != nil {
		return nil, fmt.Errorf("%s: already allocated (%d bytes): one region per ring: %w", name, p.dm.size, unix.EEXIST)
	}
	if released == nil {
		return nil, fmt.Errorf("%s: a release callback for completed staged frames is required: %w", name, unix.EINVAL)
	}
	if size <= 0 {
		return nil, fmt.Errorf("%s: size %d must be positive: %w", name, size, unix.EINVAL)
	}
	if p.caps.DeviceMemory == 0 {
		return nil, fmt.Errorf("%s: %s has none (max_dm_size 0): set the device memory size to 0: %w", name, p.bind.Device, unix.EOPNOTSUPP)
	}
	size = int(min(uint64(size), p.caps.DeviceMemory))
	size = (size + dmGranule - 1) / dmGranule * dmGranule
	dm, mr, lkey, err := cAllocDM(p.ctx, p.pd, size)
	if err != nil {
		return nil, translate(fmt.Sprintf("%s: allocate %d bytes (the device has %d in all, shared by every ring and process)",
			name, size, p.caps.DeviceMemory), err)
	}
	p.dm = &DeviceRegion{dm: dm, mr: mr, lkey: lkey, size: size, zeros: make([]byte, p.cfg.FrameSize), released: released}
	return p.dm, nil
}
