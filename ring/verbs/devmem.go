//go:build verbs

package verbs

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring/devmem"
)

// dmGranule: allocations are rounded up to it (mlx5 hands out device memory
// in 64-byte units).
const dmGranule = 64

// DeviceRegion is on-device memory (ibv_alloc_dm) registered as a
// zero-based memory region, lent to the staging allocator. It implements
// devmem.Region: CopyTo writes with ibv_memcpy_to_dm.
type DeviceRegion struct {
	dm   cDM
	mr   cMR
	lkey uint32
	size int
}

var _ devmem.Region = (*DeviceRegion)(nil)

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

// Handle returns the frame handle that makes TXBurst send the len(Buf)
// bytes staged at off from device memory instead of host memory.
func (r *DeviceRegion) Handle(off int) uint64 { return dmHandle | uint64(off) }

func (r *DeviceRegion) release() error {
	return errors.Join(cDeregMR(r.mr), cFreeDM(r.dm))
}

// AllocDeviceMemory implements qp.DeviceMemory: size bytes (rounded up to
// 64) of the device's memory, once per provider, released with it.
func (p *Provider) AllocDeviceMemory(size int) (devmem.Region, error) {
	name := fmt.Sprintf("verbs %s/%d: device memory", p.cfg.Interface, p.cfg.Queue)
	if p.closed {
		return nil, fmt.Errorf("%s: provider closed", name)
	}
	if p.dm != nil {
		return nil, fmt.Errorf("%s: already allocated (%d bytes): one region per ring: %w", name, p.dm.size, unix.EEXIST)
	}
	if size <= 0 {
		return nil, fmt.Errorf("%s: size %d must be positive: %w", name, size, unix.EINVAL)
	}
	size = (size + dmGranule - 1) / dmGranule * dmGranule
	if p.caps.DeviceMemory == 0 {
		return nil, fmt.Errorf("%s: %s has none (max_dm_size 0): set the device memory size to 0: %w", name, p.bind.Device, unix.EOPNOTSUPP)
	}
	if uint64(size) > p.caps.DeviceMemory {
		return nil, fmt.Errorf("%s: %d bytes asked, %s has %d in all (shared by every ring and process): %w",
			name, size, p.bind.Device, p.caps.DeviceMemory, unix.ENOMEM)
	}
	dm, mr, lkey, err := cAllocDM(p.ctx, p.pd, size)
	if err != nil {
		return nil, translate(fmt.Sprintf("%s: allocate %d bytes", name, size), err)
	}
	p.dm = &DeviceRegion{dm: dm, mr: mr, lkey: lkey, size: size}
	return p.dm, nil
}
