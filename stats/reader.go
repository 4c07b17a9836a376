package stats

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Errors of Open and Read (wrapped with the path and advice).
var (
	// ErrFormat: the file is not a stats file, or its header is
	// inconsistent.
	ErrFormat = errors.New("not a bypassd stats file")
	// ErrVersion: the file has another layout version.
	ErrVersion = errors.New("stats file layout version mismatch")
	// ErrBusy: the writer kept the file in an update for too long (it is
	// hung or died in the middle of one).
	ErrBusy = errors.New("stats file never settled")
)

// Reader reads snapshots from one stats file. It maps the file read-only
// and never writes to it. A Reader is not safe for concurrent use.
type Reader struct {
	path string
	mem  []byte
	// words views mem as 64-bit words; buf receives the copied snapshot.
	words []uint64
	buf   []uint64
	hdr   Header // the fixed part
	l     layout
	// Timeout bounds how long Read waits for the writer to finish an
	// update (default 1 s).
	Timeout time.Duration
}

// Open maps the stats file at path and checks its header: the magic, the
// layout version (ErrVersion when it is not Version) and that every block
// lies inside the file (ErrFormat).
func Open(path string) (_ *Reader, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, wrapOpenError(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stats: %s: %w", path, err)
	}
	size := st.Size()
	if size < HeaderSize || size > 1<<40 {
		return nil, fmt.Errorf("stats: %s: %w (%d bytes)", path, ErrFormat, size)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("stats: %s: mmap: %w", path, err)
	}
	r := &Reader{path: path, mem: mem, words: wordsOf(mem)}
	defer func() {
		if err != nil {
			_ = r.Close()
		}
	}()
	if err := r.readFixedHeader(); err != nil {
		return nil, fmt.Errorf("stats: %s: %w", path, err)
	}
	return r, nil
}

// wrapOpenError adds what to do to an error opening a stats file.
func wrapOpenError(err error) error {
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("stats: %w (stats files are readable by root and by the group of bypassd's control socket: run as root or join that group)", err)
	}
	return fmt.Errorf("stats: %w", err)
}

// readFixedHeader decodes and checks bytes 0..127.
func (r *Reader) readFixedHeader() error {
	var h [dynamicStart]byte
	for i := 0; i < dynamicStart/8; i++ {
		// Words hold the file's bytes in memory order.
		binary.NativeEndian.PutUint64(h[8*i:], atomic.LoadUint64(&r.words[i]))
	}
	if m := le.Uint32(h[offMagic:]); m != Magic {
		return fmt.Errorf("%w (magic %#x, want %#x)", ErrFormat, m, Magic)
	}
	if v := le.Uint32(h[offVersion:]); v != Version {
		return fmt.Errorf("%w: the file has layout version %d, this program reads version %d "+
			"(use the bypass-stats that came with the running bypassd)", ErrVersion, v, Version)
	}
	if hs := le.Uint32(h[offHeaderSize:]); hs != HeaderSize {
		return fmt.Errorf("%w: header size %d, want %d", ErrFormat, hs, HeaderSize)
	}
	kind := Kind(le.Uint32(h[offKind:]))
	l, err := newLayout(kind, int(le.Uint32(h[offRingSlots:])), int(le.Uint32(h[offSocketSlots:])))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrFormat, err)
	}
	got := layout{
		kind:        kind,
		summaryOff:  int(le.Uint32(h[offSummaryOff:])),
		summarySize: int(le.Uint32(h[offSummarySize:])),
		ringOff:     int(le.Uint32(h[offRingOff:])),
		ringSlots:   l.ringSlots,
		socketOff:   int(le.Uint32(h[offSocketOff:])),
		socketSlots: l.socketSlots,
		size:        int(le.Uint64(h[offFileSize:]) & (1<<62 - 1)),
	}
	if got != l || le.Uint32(h[offRingSize:]) != RingBlockSize || le.Uint32(h[offSocketSize:]) != SocketBlockSize {
		return fmt.Errorf("%w: block offsets or sizes do not match layout version %d", ErrFormat, Version)
	}
	if l.size > len(r.mem) {
		return fmt.Errorf("%w: header says %d bytes, the file has %d", ErrFormat, l.size, len(r.mem))
	}
	r.l = l
	r.hdr = Header{
		Kind:        kind,
		WriterPID:   int(le.Uint32(h[offWriterPID:])),
		PID:         int(le.Uint32(h[offPID:])),
		UID:         le.Uint32(h[offUID:]),
		Started:     getTime(h[offStarted:]),
		Command:     getString(h[offCommand : offCommand+lenCommand]),
		Program:     getString(h[offProgram : offProgram+lenProgram]),
		RingSlots:   l.ringSlots,
		SocketSlots: l.socketSlots,
	}
	return nil
}

// Path returns the file's path.
func (r *Reader) Path() string { return r.path }

// Header returns the fixed part of the header (the changing fields are in
// each Snapshot's).
func (r *Reader) Header() Header { return r.hdr }

// WriterAlive reports whether the process that writes the file still
// exists. A file whose writer is gone is stale: its counters no longer
// move.
func (r *Reader) WriterAlive() bool { return processAlive(r.hdr.WriterPID) }

// Generation returns the current publication count (0: nothing published
// yet) without copying the snapshot.
func (r *Reader) Generation() uint64 { return atomic.LoadUint64(&r.words[offSeq/8]) / 2 }

// Read returns a consistent copy of the current snapshot. It retries while
// the writer is in the middle of an update (never blocking the writer) and
// returns ErrBusy if the update does not finish within Timeout.
func (r *Reader) Read() (*Snapshot, error) { return r.read(true) }

// ReadSummary is Read without the ring and socket blocks (Rings and
// Sockets nil): the header and the summary block only, whatever the
// number of sockets. A tool that lists many clients reads this.
func (r *Reader) ReadSummary() (*Snapshot, error) { return r.read(false) }

func (r *Reader) read(blocks bool) (*Snapshot, error) {
	if r.mem == nil {
		return nil, fmt.Errorf("stats: %s: reader closed", r.path)
	}
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = time.Second
	}
	var deadline time.Time
	var first uint64
	for attempt := 0; ; attempt++ {
		s1 := atomic.LoadUint64(&r.words[offSeq/8])
		if attempt == 0 {
			first = s1
		}
		if s1%2 == 0 {
			rings, socks := r.copyOut(blocks)
			if atomic.LoadUint64(&r.words[offSeq/8]) == s1 {
				s := r.decode(s1, rings, socks)
				if !blocks {
					s.Rings, s.Sockets = nil, nil
				}
				return s, nil
			}
		}
		// The writer's update takes microseconds: spin a little, then
		// sleep briefly, until the deadline.
		if attempt == 0 {
			deadline = time.Now().Add(timeout)
		} else if time.Now().After(deadline) {
			if s1 == first {
				return nil, fmt.Errorf("stats: %s: %w: the writer (bypassd pid %d) kept it in an update for %v (is it hung?)",
					r.path, ErrBusy, r.hdr.WriterPID, timeout)
			}
			return nil, fmt.Errorf("stats: %s: %w: the writer (bypassd pid %d) rewrote it faster than it could be read for %v (is its stats interval far too short?)",
				r.path, ErrBusy, r.hdr.WriterPID, timeout)
		}
		if attempt > 100 {
			time.Sleep(50 * time.Microsecond)
		}
	}
}

// copyOut copies the dynamic header, the summary block and the used ring
// and socket blocks (none without blocks) into r.buf, in file order with
// the unused slots left out, and returns how many ring and socket blocks
// it copied.
func (r *Reader) copyOut(blocks bool) (rings, socks int) {
	l := &r.l
	var used [8]byte // rings used at 168, sockets used at 172: one word
	binary.NativeEndian.PutUint64(used[:], atomic.LoadUint64(&r.words[offRingsUsed/8]))
	rings = int(le.Uint32(used[offRingsUsed-offRingsUsed:]))
	socks = int(le.Uint32(used[offSocketsUsed-offRingsUsed:]))
	rings, socks = min(rings, l.ringSlots), min(socks, l.socketSlots)
	if !blocks {
		rings, socks = 0, 0
	}
	need := (HeaderSize-dynamicStart+l.summarySize+rings*RingBlockSize+socks*SocketBlockSize)/8 + 1
	if cap(r.buf) < need {
		r.buf = make([]uint64, need)
	}
	buf := r.buf[:0]
	buf = r.load(buf, dynamicStart, HeaderSize)
	buf = r.load(buf, l.summaryOff, l.summaryOff+l.summarySize)
	buf = r.load(buf, l.ringOff, l.ringOff+rings*RingBlockSize)
	buf = r.load(buf, l.socketOff, l.socketOff+socks*SocketBlockSize)
	r.buf = buf
	return rings, socks
}

func (r *Reader) load(dst []uint64, from, to int) []uint64 {
	for i := from / 8; i < to/8; i++ {
		dst = append(dst, atomic.LoadUint64(&r.words[i]))
	}
	return dst
}

// decode turns the copied words into a Snapshot.
func (r *Reader) decode(seq uint64, rings, socks int) *Snapshot {
	b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(r.buf))), len(r.buf)*8)
	l := &r.l
	s := &Snapshot{Header: r.hdr}
	h := &s.Header
	hd := b[:HeaderSize-dynamicStart]
	h.Generation = seq / 2
	h.Updated = getTime(hd[offUpdated-dynamicStart:])
	h.Interval = time.Duration(le.Uint64(hd[offInterval-dynamicStart:]) & (1<<63 - 1))
	h.Resets = le.Uint64(hd[offResets-dynamicStart:])
	h.ResetTime = getTime(hd[offResetTime-dynamicStart:])
	h.SocketsTotal = int(le.Uint32(hd[offSocketsTotal-dynamicStart:]))
	b = b[len(hd):]
	if l.kind == KindClient {
		s.Client = &Client{}
		decodeClient(b, s.Client)
	} else {
		s.Daemon = &Daemon{}
		decodeDaemon(b, s.Daemon)
	}
	b = b[l.summarySize:]
	s.Rings = make([]Ring, rings)
	for i := range s.Rings {
		decodeRing(b[i*RingBlockSize:], &s.Rings[i])
	}
	b = b[rings*RingBlockSize:]
	s.Sockets = make([]Socket, socks)
	for i := range s.Sockets {
		decodeSocket(b[i*SocketBlockSize:], &s.Sockets[i])
	}
	return s
}

// Close unmaps the file.
func (r *Reader) Close() error {
	if r.mem == nil {
		return nil
	}
	err := unix.Munmap(r.mem)
	r.mem, r.words = nil, nil
	if err != nil {
		return fmt.Errorf("stats: %s: unmap: %w", r.path, err)
	}
	return nil
}

// ReadFile opens path, reads one snapshot and closes it.
func ReadFile(path string) (*Snapshot, error) {
	r, err := Open(path)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	return r.Read()
}
