package bpf

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/bypassd/bypassd/internal/netlab"
	"golang.org/x/sys/unix"
)

// testXSK is the smallest AF_XDP receiver that proves frames were steered
// into it: a copy-mode socket on queue 0 with a fill ring and an RX ring
// (the completion ring exists only because bind requires it). Real socket
// handling lives in package ring; this is test scaffolding.
type testXSK struct {
	fd      int
	umem    []byte
	fillMap []byte
	rxMap   []byte
	compMap []byte
	rxProd  *uint32
	rxCons  *uint32
	rxDescs []unix.XDPDesc
}

const (
	xskFrames    = 64
	xskFrameSize = 4096
	xskRingSize  = 64 // power of two, >= xskFrames
)

func xskSockopt(fd, opt int, p unsafe.Pointer, size uintptr) error {
	_, _, errno := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), size, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// newTestXSK creates the socket inside ns (ifindex is resolved there) and
// binds it to queue 0 of ifindex. Everything is released by t.Cleanup.
func newTestXSK(t *testing.T, ns *netlab.NS, ifindex int) *testXSK {
	t.Helper()
	x := &testXSK{fd: -1}
	t.Cleanup(x.close)
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("socket(AF_XDP): %w", err)
		}
		x.fd = fd
		x.umem, err = unix.Mmap(-1, 0, xskFrames*xskFrameSize, unix.PROT_READ|unix.PROT_WRITE,
			unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
		if err != nil {
			return fmt.Errorf("mmap umem: %w", err)
		}
		reg := unix.XDPUmemReg{
			Addr: uint64(uintptr(unsafe.Pointer(&x.umem[0]))),
			Len:  uint64(len(x.umem)),
			Size: xskFrameSize,
		}
		if err := xskSockopt(fd, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
			return fmt.Errorf("XDP_UMEM_REG: %w", err)
		}
		for _, opt := range []int{unix.XDP_UMEM_FILL_RING, unix.XDP_UMEM_COMPLETION_RING, unix.XDP_RX_RING} {
			if err := unix.SetsockoptInt(fd, unix.SOL_XDP, opt, xskRingSize); err != nil {
				return fmt.Errorf("ring size option %d: %w", opt, err)
			}
		}
		var off unix.XDPMmapOffsets
		size := uint32(unsafe.Sizeof(off))
		if _, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_XDP, unix.XDP_MMAP_OFFSETS,
			uintptr(unsafe.Pointer(&off)), uintptr(unsafe.Pointer(&size)), 0); errno != 0 {
			return fmt.Errorf("XDP_MMAP_OFFSETS: %w", errno)
		}
		mmap := func(pgoff int64, length uint64) ([]byte, error) {
			return unix.Mmap(fd, pgoff, int(length), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		}
		if x.fillMap, err = mmap(unix.XDP_UMEM_PGOFF_FILL_RING, off.Fr.Desc+xskRingSize*8); err != nil {
			return fmt.Errorf("mmap fill ring: %w", err)
		}
		if x.compMap, err = mmap(unix.XDP_UMEM_PGOFF_COMPLETION_RING, off.Cr.Desc+xskRingSize*8); err != nil {
			return fmt.Errorf("mmap completion ring: %w", err)
		}
		if x.rxMap, err = mmap(unix.XDP_PGOFF_RX_RING, off.Rx.Desc+xskRingSize*uint64(unsafe.Sizeof(unix.XDPDesc{}))); err != nil {
			return fmt.Errorf("mmap rx ring: %w", err)
		}
		// Hand every frame to the kernel before binding.
		fill := unsafe.Slice((*uint64)(unsafe.Pointer(&x.fillMap[off.Fr.Desc])), xskRingSize)
		for i := range xskFrames {
			fill[i] = uint64(i * xskFrameSize)
		}
		atomic.StoreUint32((*uint32)(unsafe.Pointer(&x.fillMap[off.Fr.Producer])), xskFrames)

		x.rxProd = (*uint32)(unsafe.Pointer(&x.rxMap[off.Rx.Producer]))
		x.rxCons = (*uint32)(unsafe.Pointer(&x.rxMap[off.Rx.Consumer]))
		x.rxDescs = unsafe.Slice((*unix.XDPDesc)(unsafe.Pointer(&x.rxMap[off.Rx.Desc])), xskRingSize)

		sa := &unix.SockaddrXDP{Flags: unix.XDP_COPY, Ifindex: uint32(ifindex), QueueID: 0}
		if err := unix.Bind(fd, sa); err != nil {
			return fmt.Errorf("bind to ifindex %d queue 0: %w", ifindex, err)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("test AF_XDP socket: %v", err)
	}
	return x
}

// frames returns copies of every frame received so far.
func (x *testXSK) frames() [][]byte {
	var out [][]byte
	prod := atomic.LoadUint32(x.rxProd)
	cons := atomic.LoadUint32(x.rxCons)
	for ; cons != prod; cons++ {
		d := x.rxDescs[cons%xskRingSize]
		out = append(out, bytes.Clone(x.umem[d.Addr:d.Addr+uint64(d.Len)]))
	}
	atomic.StoreUint32(x.rxCons, cons)
	return out
}

// waitFrames collects frames until n arrived. The deadline only keeps a
// broken kernel path from hanging the test.
func (x *testXSK) waitFrames(t *testing.T, n int) [][]byte {
	t.Helper()
	var got [][]byte
	deadline := time.Now().Add(5 * time.Second)
	for {
		got = append(got, x.frames()...)
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("AF_XDP socket received %d frames, want %d", len(got), n)
		}
		fds := []unix.PollFd{{Fd: int32(x.fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, 50); err != nil && err != unix.EINTR {
			t.Fatalf("poll AF_XDP socket: %v", err)
		}
	}
}

func (x *testXSK) close() {
	for _, m := range [][]byte{x.rxMap, x.compMap, x.fillMap} {
		if m != nil {
			_ = unix.Munmap(m)
		}
	}
	x.rxMap, x.compMap, x.fillMap = nil, nil, nil
	if x.fd >= 0 {
		_ = unix.Close(x.fd)
		x.fd = -1
	}
	if x.umem != nil {
		_ = unix.Munmap(x.umem)
		x.umem = nil
	}
}
