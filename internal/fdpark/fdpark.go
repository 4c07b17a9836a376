// Package fdpark holds kernel files (sockets) without file descriptors: a
// file parked here lives in the registered-file table of an io_uring
// instance, which keeps its own reference, so the descriptor it came in
// can be closed. The daemon parks its kernel port reservations here (one
// per bound socket) so that its descriptor count, bounded by
// RLIMIT_NOFILE, grows with clients and not with sockets. Getting a parked
// file back (to read from it, set an option or hand it to another
// process) installs a new descriptor of it with IORING_OP_FIXED_FD_INSTALL
// (Linux 6.8).
//
// It owns the io_uring instances and their tables; it does not know what
// the files are. Without io_uring (an older kernel, a seccomp filter or
// kernel.io_uring_disabled), New fails and the caller keeps descriptors.
package fdpark

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Linux ABI (include/uapi/linux/io_uring.h).
const (
	opFixedFDInstall = 54 // IORING_OP_FIXED_FD_INSTALL
	sqeFixedFile     = 1  // IOSQE_FIXED_FILE
	enterGetEvents   = 1  // IORING_ENTER_GETEVENTS
	featSingleMmap   = 1  // IORING_FEAT_SINGLE_MMAP
	regFilesUpdate   = 6  // IORING_REGISTER_FILES_UPDATE
	regFiles2        = 13 // IORING_REGISTER_FILES2
	rsrcSparse       = 1  // IORING_RSRC_REGISTER_SPARSE
	offSQRing        = 0
	offCQRing        = 0x8000000
	offSQEs          = 0x10000000
	sqeSize          = 64
	cqeSize          = 16
)

type sqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Flags, Dropped, Array, Resv1 uint32
	UserAddr                                                        uint64
}

type cqringOffsets struct {
	Head, Tail, RingMask, RingEntries, Overflow, CQEs, Flags, Resv1 uint32
	UserAddr                                                        uint64
}

type params struct {
	SQEntries, CQEntries, Flags, SQThreadCPU, SQThreadIdle, Features, WQFD uint32
	Resv                                                                   [3]uint32
	SQOff                                                                  sqringOffsets
	CQOff                                                                  cqringOffsets
}

type rsrcRegister struct {
	Nr, Flags   uint32
	Resv2, Data uint64
	Tags        uint64
}

type filesUpdate struct {
	Offset, Resv uint32
	FDs          uint64
}

// table is one io_uring instance and its registered-file table.
type table struct {
	fd         int
	ring, sqes []byte
	p          params
	free       []uint32 // free slots, reused last-in first-out
	next       uint32   // slots below next were handed out at least once
	size       uint32
}

// Park is a set of tables; slots are numbered across them. Safe for
// concurrent use.
type Park struct {
	mu     sync.Mutex
	tables []*table
	per    uint32
	parked atomic.Int64
}

// Slot names a parked file.
type Slot uint32

// New returns a Park whose tables hold per files each (a table is created
// when the previous ones are full; per is bounded by RLIMIT_NOFILE's soft
// limit, which the kernel applies to each table). It fails when io_uring
// or IORING_OP_FIXED_FD_INSTALL is not available.
func New(per int) (*Park, error) {
	if per < 1 {
		return nil, fmt.Errorf("fdpark: %d files per table", per)
	}
	p := &Park{per: uint32(per)}
	t, err := p.newTable()
	if err != nil {
		return nil, err
	}
	p.tables = append(p.tables, t)
	// Probe the install operation with a file of our own.
	probe, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("fdpark: probe: %w", err)
	}
	s, err := p.Put(probe)
	if err == nil {
		var fd int
		if fd, err = p.Get(s); err == nil {
			unix.Close(fd)
		}
		p.Drop(s)
	}
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("fdpark: io_uring cannot give a parked file back (needs Linux 6.8): %w", err)
	}
	return p, nil
}

func (p *Park) newTable() (_ *table, err error) {
	t := &table{fd: -1, size: p.per}
	fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 4, uintptr(unsafe.Pointer(&t.p)), 0)
	if errno != 0 {
		return nil, fmt.Errorf("fdpark: io_uring_setup: %w", errno)
	}
	t.fd = int(fd)
	defer func() {
		if err != nil {
			t.close()
		}
	}()
	if t.p.Features&featSingleMmap == 0 {
		return nil, errors.New("fdpark: io_uring without IORING_FEAT_SINGLE_MMAP")
	}
	sqLen := int(t.p.SQOff.Array + t.p.SQEntries*4)
	cqLen := int(t.p.CQOff.CQEs + t.p.CQEntries*cqeSize)
	if t.ring, err = unix.Mmap(t.fd, offSQRing, max(sqLen, cqLen), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return nil, fmt.Errorf("fdpark: map the rings: %w", err)
	}
	if t.sqes, err = unix.Mmap(t.fd, offSQEs, int(t.p.SQEntries)*sqeSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return nil, fmt.Errorf("fdpark: map the submission entries: %w", err)
	}
	reg := rsrcRegister{Nr: t.size, Flags: rsrcSparse}
	if _, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(t.fd), regFiles2, uintptr(unsafe.Pointer(&reg)), unsafe.Sizeof(reg), 0, 0); errno != 0 {
		return nil, fmt.Errorf("fdpark: register a table of %d files: %w", t.size, errno)
	}
	return t, nil
}

func (t *table) close() {
	if t.sqes != nil {
		_ = unix.Munmap(t.sqes)
	}
	if t.ring != nil {
		_ = unix.Munmap(t.ring)
	}
	if t.fd >= 0 {
		unix.Close(t.fd) // drops every parked file with the table
	}
}

// update stores fd (or -1: empty) in slot i.
func (t *table) update(i uint32, fd int32) error {
	fds := [1]int32{fd}
	u := filesUpdate{Offset: i, FDs: uint64(uintptr(unsafe.Pointer(&fds[0])))}
	n, _, errno := unix.Syscall6(unix.SYS_IO_URING_REGISTER, uintptr(t.fd), regFilesUpdate, uintptr(unsafe.Pointer(&u)), 1, 0, 0)
	if errno != 0 {
		return errno
	}
	if n != 1 {
		return fmt.Errorf("updated %d slots, want 1", n)
	}
	return nil
}

func (t *table) u32(off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&t.ring[off])) }

// install submits IORING_OP_FIXED_FD_INSTALL for slot i and returns the
// new descriptor (close-on-exec).
func (t *table) install(i uint32) (int, error) {
	sq, cq := &t.p.SQOff, &t.p.CQOff
	tail := atomic.LoadUint32(t.u32(sq.Tail))
	idx := tail & *t.u32(sq.RingMask)
	sqe := t.sqes[idx*sqeSize : (idx+1)*sqeSize]
	clear(sqe)
	sqe[0] = opFixedFDInstall
	sqe[1] = sqeFixedFile
	*(*int32)(unsafe.Pointer(&sqe[4])) = int32(i)
	*t.u32(sq.Array + 4*idx) = idx
	atomic.StoreUint32(t.u32(sq.Tail), tail+1)
	for {
		_, _, errno := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(t.fd), 1, 1, enterGetEvents, 0, 0)
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return -1, fmt.Errorf("io_uring_enter: %w", errno)
		}
		break
	}
	head := atomic.LoadUint32(t.u32(cq.Head))
	if atomic.LoadUint32(t.u32(cq.Tail)) == head {
		return -1, errors.New("no completion")
	}
	off := cq.CQEs + (head&*t.u32(cq.RingMask))*cqeSize
	res := *(*int32)(unsafe.Pointer(&t.ring[off+8]))
	atomic.StoreUint32(t.u32(cq.Head), head+1)
	if res < 0 {
		return -1, unix.Errno(-res)
	}
	return int(res), nil
}

// Put parks the file of fd and closes fd (also on error).
func (p *Park) Put(fd int) (Slot, error) {
	defer unix.Close(fd)
	p.mu.Lock()
	defer p.mu.Unlock()
	var t *table
	var ti int
	for i, c := range p.tables {
		if len(c.free) > 0 || c.next < c.size {
			t, ti = c, i
			break
		}
	}
	if t == nil {
		var err error
		if t, err = p.newTable(); err != nil {
			return 0, err
		}
		p.tables = append(p.tables, t)
		ti = len(p.tables) - 1
	}
	var i uint32
	fromFree := len(t.free) > 0
	if fromFree {
		i = t.free[len(t.free)-1]
	} else {
		i = t.next
	}
	if err := t.update(i, int32(fd)); err != nil {
		return 0, fmt.Errorf("fdpark: park descriptor %d: %w", fd, err)
	}
	if fromFree {
		t.free = t.free[:len(t.free)-1]
	} else {
		t.next++
	}
	p.parked.Add(1)
	return Slot(uint32(ti)*p.per + i), nil
}

func (p *Park) at(s Slot) (*table, uint32, error) {
	ti, i := uint32(s)/p.per, uint32(s)%p.per
	if int(ti) >= len(p.tables) {
		return nil, 0, fmt.Errorf("fdpark: no slot %d", s)
	}
	return p.tables[ti], i, nil
}

// Get returns a new descriptor of a parked file (the caller's to close);
// the file stays parked.
func (p *Park) Get(s Slot) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, i, err := p.at(s)
	if err != nil {
		return -1, err
	}
	fd, err := t.install(i)
	if err != nil {
		return -1, fmt.Errorf("fdpark: descriptor of slot %d: %w", s, err)
	}
	return fd, nil
}

// Drop releases a parked file: the table's reference goes, and with it the
// file unless someone else holds a descriptor of it.
func (p *Park) Drop(s Slot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, i, err := p.at(s)
	if err != nil {
		return
	}
	if t.update(i, -1) == nil {
		t.free = append(t.free, i)
		p.parked.Add(-1)
	}
}

// Len returns how many files are parked.
func (p *Park) Len() int { return int(p.parked.Load()) }

// Tables returns how many io_uring instances (one descriptor each) hold
// them.
func (p *Park) Tables() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.tables)
}

// Close releases every parked file and the tables.
func (p *Park) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range p.tables {
		t.close()
	}
	p.tables = nil
	p.parked.Store(0)
}
