package stats

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// FileSpec describes a stats file to create: the header's fixed part and
// the block capacity.
type FileSpec struct {
	Kind Kind
	// PID is the process the file describes and UID its user.
	PID int
	UID uint32
	// Command (from /proc/PID/comm) and Program (the HELLO name).
	Command, Program string
	// Started is when the client connected (the daemon: started).
	Started time.Time
	// RingSlots and SocketSlots are how many ring and socket blocks the
	// file has room for (at most MaxRingSlots and MaxSocketSlots).
	RingSlots, SocketSlots int
	// Mode is the file's permission bits (0: 0644); GID its group (< 0:
	// the creator's).
	Mode os.FileMode
	GID  int
}

// layout is where a file's parts are.
type layout struct {
	kind                    Kind
	summaryOff, summarySize int
	ringOff, ringSlots      int
	socketOff, socketSlots  int
	size                    int
}

func newLayout(kind Kind, ringSlots, socketSlots int) (layout, error) {
	l := layout{kind: kind, ringSlots: ringSlots, socketSlots: socketSlots, summaryOff: HeaderSize}
	switch kind {
	case KindClient:
		l.summarySize = ClientBlockSize
	case KindDaemon:
		l.summarySize = DaemonBlockSize
	default:
		return l, fmt.Errorf("kind %d is neither client (1) nor daemon (2)", kind)
	}
	if ringSlots < 0 || ringSlots > MaxRingSlots {
		return l, fmt.Errorf("%d ring slots: want 0..%d", ringSlots, MaxRingSlots)
	}
	if socketSlots < 0 || socketSlots > MaxSocketSlots {
		return l, fmt.Errorf("%d socket slots: want 0..%d", socketSlots, MaxSocketSlots)
	}
	l.ringOff = l.summaryOff + l.summarySize
	l.socketOff = l.ringOff + ringSlots*RingBlockSize
	l.size = l.socketOff + socketSlots*SocketBlockSize
	return l, nil
}

// Writer publishes snapshots into one stats file. Publish and Close may be
// called from any goroutine; they are serialized.
type Writer struct {
	path     string
	dev, ino uint64

	mu      sync.Mutex
	mem     []byte
	words   []uint64
	scratch []uint64 // one block, encoded before it is copied
	l       layout
	seq     uint64
	closed  bool
}

// Create creates the stats file at path (replacing a stale one) with the
// header's fixed part written and no snapshot yet (generation 0). The file
// is built under a temporary name and renamed into place, so a reader never
// sees it half-initialized.
func Create(path string, spec FileSpec) (_ *Writer, err error) {
	l, err := newLayout(spec.Kind, spec.RingSlots, spec.SocketSlots)
	if err != nil {
		return nil, fmt.Errorf("stats: create %s: %w", path, err)
	}
	mode := spec.Mode
	if mode == 0 {
		mode = 0o644
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+tmpSuffix+"*")
	if err != nil {
		return nil, fmt.Errorf("stats: create %s: %w (check that the stats directory exists and is writable)", path, err)
	}
	tmp := f.Name()
	defer func() {
		_ = f.Close()
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if err := f.Truncate(int64(l.size)); err != nil {
		return nil, fmt.Errorf("stats: create %s: size %d: %w", path, l.size, err)
	}
	if err := f.Chmod(mode & os.ModePerm); err != nil {
		return nil, fmt.Errorf("stats: create %s: chmod: %w", path, err)
	}
	if spec.GID >= 0 {
		if err := f.Chown(-1, spec.GID); err != nil {
			return nil, fmt.Errorf("stats: create %s: give it group %d: %w", path, spec.GID, err)
		}
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, l.size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("stats: create %s: mmap %d bytes: %w", path, l.size, err)
	}
	w := &Writer{path: path, mem: mem, words: wordsOf(mem), l: l, scratch: make([]uint64, RingBlockSize/8)}
	defer func() {
		if err != nil {
			_ = unix.Munmap(mem)
		}
	}()
	w.writeFixedHeader(spec)
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("stats: create %s: %w", path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		_ = os.Remove(path)
		return nil, fmt.Errorf("stats: create %s: stat: %w", path, err)
	}
	w.dev, w.ino = st.Dev, st.Ino
	return w, nil
}

// tmpSuffix marks files being created (Clean removes old ones).
const tmpSuffix = ".tmp"

// wordsOf views page-aligned memory as 64-bit words.
func wordsOf(mem []byte) []uint64 {
	if len(mem) < 8 {
		return nil
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(&mem[0])), len(mem)/8)
}

func (w *Writer) writeFixedHeader(spec FileSpec) {
	h := w.mem[:HeaderSize]
	l := &w.l
	le.PutUint32(h[offVersion:], Version)
	le.PutUint32(h[offHeaderSize:], HeaderSize)
	le.PutUint32(h[offKind:], uint32(spec.Kind))
	le.PutUint64(h[offFileSize:], uint64(l.size))
	le.PutUint32(h[offWriterPID:], clampU32(os.Getpid()))
	le.PutUint32(h[offPID:], clampU32(spec.PID))
	le.PutUint32(h[offUID:], spec.UID)
	putTime(h[offStarted:], spec.Started)
	le.PutUint32(h[offSummaryOff:], uint32(l.summaryOff))
	le.PutUint32(h[offSummarySize:], uint32(l.summarySize))
	le.PutUint32(h[offRingOff:], uint32(l.ringOff))
	le.PutUint32(h[offRingSize:], RingBlockSize)
	le.PutUint32(h[offRingSlots:], uint32(l.ringSlots))
	le.PutUint32(h[offSocketOff:], uint32(l.socketOff))
	le.PutUint32(h[offSocketSize:], SocketBlockSize)
	le.PutUint32(h[offSocketSlots:], uint32(l.socketSlots))
	putString(h[offCommand:offCommand+lenCommand], spec.Command)
	putString(h[offProgram:offProgram+lenProgram], spec.Program)
	// Magic last: a file with a magic has a complete header.
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&h[offMagic])), Magic)
}

// Path returns the file's path.
func (w *Writer) Path() string { return w.path }

// ErrWriterClosed is returned by Publish after Close.
var ErrWriterClosed = errors.New("stats: writer closed")

// Publish writes s as the file's new snapshot under the sequence counter.
// Of s.Header it uses the changing fields (Interval, Resets, ResetTime,
// SocketsTotal); Updated is set to now. The summary block matching the
// file's kind must be set. Rings and sockets beyond the file's slots are
// left out (SocketsTotal still tells how many there are).
func (w *Writer) Publish(s *Snapshot) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrWriterClosed
	}
	l := &w.l
	if (l.kind == KindClient && s.Client == nil) || (l.kind == KindDaemon && s.Daemon == nil) {
		return fmt.Errorf("stats: publish %s: a %v file needs its summary block", w.path, l.kind)
	}
	rings := s.Rings[:min(len(s.Rings), l.ringSlots)]
	socks := s.Sockets[:min(len(s.Sockets), l.socketSlots)]
	buf := unsafe.Slice((*byte)(unsafe.Pointer(&w.scratch[0])), len(w.scratch)*8)

	w.seq++ // odd: a write is in progress
	atomic.StoreUint64(&w.words[offSeq/8], w.seq)

	hd := buf[:HeaderSize-dynamicStart]
	clear(hd)
	putTime(hd[offUpdated-dynamicStart:], time.Now())
	le.PutUint64(hd[offInterval-dynamicStart:], uint64(max(s.Header.Interval, 0)))
	le.PutUint64(hd[offResets-dynamicStart:], s.Header.Resets)
	putTime(hd[offResetTime-dynamicStart:], s.Header.ResetTime)
	le.PutUint32(hd[offRingsUsed-dynamicStart:], uint32(len(rings)))
	le.PutUint32(hd[offSocketsUsed-dynamicStart:], uint32(len(socks)))
	le.PutUint32(hd[offSocketsTotal-dynamicStart:], clampU32(max(s.Header.SocketsTotal, len(s.Sockets))))
	// The sequence word itself (the first of the dynamic part) is skipped.
	w.store(offSeq+8, buf[8:len(hd)])

	if l.kind == KindClient {
		encodeClient(buf, s.Client)
	} else {
		encodeDaemon(buf, s.Daemon)
	}
	w.store(l.summaryOff, buf[:l.summarySize])
	for i := range rings {
		encodeRing(buf, &rings[i])
		w.store(l.ringOff+i*RingBlockSize, buf[:RingBlockSize])
	}
	for i := range socks {
		encodeSocket(buf, &socks[i])
		w.store(l.socketOff+i*SocketBlockSize, buf[:SocketBlockSize])
	}

	w.seq++ // even: consistent again
	atomic.StoreUint64(&w.words[offSeq/8], w.seq)
	return nil
}

// Touch republishes the last snapshot as taken now: only Updated changes
// (under the sequence counter). A publisher whose sources did not move
// calls it instead of Publish, at O(1) cost however many sockets the file
// holds.
func (w *Writer) Touch() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return ErrWriterClosed
	}
	var b [8]byte
	putTime(b[:], time.Now())
	w.seq++
	atomic.StoreUint64(&w.words[offSeq/8], w.seq)
	w.store(offUpdated, b[:])
	w.seq++
	atomic.StoreUint64(&w.words[offSeq/8], w.seq)
	return nil
}

// store copies b (a multiple of 8 bytes) to offset off of the file with
// atomic 64-bit stores, so a reader never sees half a word.
func (w *Writer) store(off int, b []byte) {
	dst := w.words[off/8 : off/8+len(b)/8]
	src := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/8)
	for i := range src {
		atomic.StoreUint64(&dst[i], src[i])
	}
}

// Close unmaps the file and removes it, unless another writer has replaced
// it meanwhile. It is idempotent.
func (w *Writer) Close() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil
	}
	w.closed = true
	var errs []error
	if err := unix.Munmap(w.mem); err != nil {
		errs = append(errs, fmt.Errorf("unmap: %w", err))
	}
	w.mem, w.words = nil, nil
	var st unix.Stat_t
	if err := unix.Stat(w.path, &st); err == nil && st.Dev == w.dev && st.Ino == w.ino {
		if err := os.Remove(w.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("stats: close %s: %w", w.path, err)
	}
	return nil
}
