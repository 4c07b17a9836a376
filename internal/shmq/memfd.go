package shmq

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// RequiredSeals are the seals CreateMemfd applies and MapMemfd insists on:
// the size can never change (a shrink would SIGBUS whoever has it mapped)
// and no seal can be added or removed later.
const RequiredSeals = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// ErrNotSealed is returned (wrapped) by MapMemfd for a memfd without
// RequiredSeals.
var ErrNotSealed = errors.New("shmq: memfd is not sealed against resizing")

// CreateMemfd creates a memfd of size bytes (MFD_CLOEXEC|MFD_ALLOW_SEALING),
// maps it shared read-write and seals it with RequiredSeals. The caller owns
// fd (close it with unix.Close once it has been sent to the peer or is no
// longer needed; the mapping survives) and mem (release it with Unmap).
func CreateMemfd(name string, size int) (fd int, mem []byte, err error) {
	if size <= 0 {
		return -1, nil, fmt.Errorf("shmq: create memfd %q: size %d must be positive (use Size() per queue)", name, size)
	}
	fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, nil, fmt.Errorf("shmq: create memfd %q: %w", name, err)
	}
	fail := func(e error) (int, []byte, error) {
		if mem != nil {
			_ = unix.Munmap(mem)
		}
		unix.Close(fd)
		return -1, nil, e
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return fail(fmt.Errorf("shmq: create memfd %q: set size %d: %w (check available shared memory / RLIMIT_FSIZE)", name, size, err))
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, RequiredSeals); err != nil {
		return fail(fmt.Errorf("shmq: create memfd %q: add seals: %w", name, err))
	}
	mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		mem = nil
		return fail(fmt.Errorf("shmq: create memfd %q: mmap %d bytes: %w", name, size, err))
	}
	return fd, mem, nil
}

// MapMemfd maps a memfd received from the peer, shared read-write. It
// refuses anything but a memfd carrying RequiredSeals (ErrNotSealed): an
// unsealed one could be shrunk by the peer, making every access SIGBUS.
// If size > 0 the memfd must be exactly size bytes; size == 0 accepts its
// current (sealed, hence fixed) size. fd stays owned by the caller and may be
// closed after mapping. Release the mapping with Unmap.
func MapMemfd(fd int, size int) (mem []byte, err error) {
	if fd < 0 {
		return nil, fmt.Errorf("shmq: map memfd: invalid fd %d", fd)
	}
	if size < 0 {
		return nil, fmt.Errorf("shmq: map memfd %d: negative expected size %d", fd, size)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		if errors.Is(err, unix.EINVAL) {
			return nil, fmt.Errorf("shmq: map memfd %d: not a memfd (F_GET_SEALS: %w); the peer must send the queue memfd", fd, err)
		}
		return nil, fmt.Errorf("shmq: map memfd %d: read seals: %w", fd, err)
	}
	if seals&RequiredSeals != RequiredSeals {
		return nil, fmt.Errorf("shmq: map memfd %d: seals %#x lack %#x; create it with CreateMemfd: %w", fd, seals, RequiredSeals&^seals, ErrNotSealed)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shmq: map memfd %d: stat: %w", fd, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("shmq: map memfd %d: not a regular memfd (mode %#o)", fd, st.Mode)
	}
	if st.Size <= 0 || uint64(st.Size) > uint64(maxInt) {
		return nil, fmt.Errorf("shmq: map memfd %d: unusable size %d", fd, st.Size)
	}
	if size > 0 && st.Size != int64(size) {
		return nil, fmt.Errorf("shmq: map memfd %d: size %d, expected %d; daemon and client disagree on the queue layout", fd, st.Size, size)
	}
	mem, err = unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shmq: map memfd %d: mmap %d bytes: %w (a read-only or write-sealed memfd cannot be used)", fd, st.Size, err)
	}
	return mem, nil
}

const maxInt = int(^uint(0) >> 1)

// Unmap releases a mapping returned by CreateMemfd or MapMemfd. No Queue
// over it may be used afterwards.
func Unmap(mem []byte) error {
	if len(mem) == 0 {
		return errors.New("shmq: unmap: empty mapping")
	}
	if err := unix.Munmap(mem); err != nil {
		return fmt.Errorf("shmq: unmap %d bytes: %w (not a mapping from CreateMemfd/MapMemfd, or unmapped twice)", len(mem), err)
	}
	return nil
}
