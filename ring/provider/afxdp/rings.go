package afxdp

import (
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ringMem is the shared part of one mmapped AF_XDP ring: the producer and
// consumer indexes, the flags word and the descriptor array. Indexes are
// free-running uint32 counters; the slot of index i is i & mask.
//
// Memory ordering: the kernel side uses smp_load_acquire/smp_store_release on
// the indexes. Go's sync/atomic operations are sequentially consistent,
// which is at least as strong: a producer fills descriptors and then
// atomically stores the producer index; a consumer atomically loads the
// producer index and only then reads descriptors.
type ringMem struct {
	mem      []byte
	producer *uint32
	consumer *uint32
	flags    *uint32
	mask     uint32
	size     uint32
}

func mapRing(fd int, pgoff int64, off unix.XDPRingOffset, n uint32, descSize uintptr) (ringMem, error) {
	length := int(off.Desc) + int(n)*int(descSize)
	mem, err := unix.Mmap(fd, pgoff, length, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return ringMem{}, err
	}
	base := unsafe.Pointer(&mem[0])
	return ringMem{
		mem:      mem,
		producer: (*uint32)(unsafe.Add(base, off.Producer)),
		consumer: (*uint32)(unsafe.Add(base, off.Consumer)),
		flags:    (*uint32)(unsafe.Add(base, off.Flags)),
		mask:     n - 1,
		size:     n,
	}, nil
}

func (r *ringMem) unmap() {
	if r.mem != nil {
		_ = unix.Munmap(r.mem)
		r.mem = nil
	}
}

func (r *ringMem) needWakeup() bool {
	return atomic.LoadUint32(r.flags)&unix.XDP_RING_NEED_WAKEUP != 0
}

// descRing is an RX or TX ring of xdp_desc entries.
type descRing struct {
	ringMem
	descs []unix.XDPDesc
	// cached copies of the indexes, to touch shared cache lines only when
	// the cached view runs out.
	cachedProd, cachedCons uint32
}

// addrRing is a fill or completion ring of UMEM addresses.
type addrRing struct {
	ringMem
	addrs                  []uint64
	cachedProd, cachedCons uint32
}

func newDescRing(rm ringMem, off unix.XDPRingOffset) *descRing {
	p := unsafe.Add(unsafe.Pointer(&rm.mem[0]), off.Desc)
	return &descRing{ringMem: rm, descs: unsafe.Slice((*unix.XDPDesc)(p), rm.size)}
}

func newAddrRing(rm ringMem, off unix.XDPRingOffset) *addrRing {
	p := unsafe.Add(unsafe.Pointer(&rm.mem[0]), off.Desc)
	return &addrRing{ringMem: rm, addrs: unsafe.Slice((*uint64)(p), rm.size)}
}

// Producer side (TX and fill rings: we produce, the kernel consumes).

// freeSlots returns how many entries can be produced, refreshing the cached
// consumer index only when the cached view shows fewer than want.
func (r *ringMem) freeSlots(cachedProd uint32, cachedCons *uint32, want uint32) uint32 {
	free := r.size - (cachedProd - *cachedCons)
	if free >= want {
		return free
	}
	*cachedCons = atomic.LoadUint32(r.consumer)
	return r.size - (cachedProd - *cachedCons)
}

// available returns how many entries can be consumed (RX and completion
// rings: the kernel produces, we consume).
func (r *ringMem) available(cachedProd *uint32, cachedCons uint32) uint32 {
	n := *cachedProd - cachedCons
	if n == 0 {
		*cachedProd = atomic.LoadUint32(r.producer)
		n = *cachedProd - cachedCons
	}
	return n
}

func (r *ringMem) publishProducer(v uint32) { atomic.StoreUint32(r.producer, v) }
func (r *ringMem) publishConsumer(v uint32) { atomic.StoreUint32(r.consumer, v) }
