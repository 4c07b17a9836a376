// Package afxdp is the default ring provider: an AF_XDP socket bound to one
// (interface, queue) with its UMEM and fill, completion, RX and TX rings.
//
// It implements qp.Provider for the ring engine and registers as "afxdp"
// with qp.Register (path.go): opening a path attaches the XDP steering
// program through package bpf, shared by the rings of an interface
// (program.go), and binds the socket to its XSKMAP slot. It does not build
// or load the program itself (package bpf does) and knows nothing of UDP: it
// moves Ethernet frames.
//
// Why our own implementation and not gVisor's pkg/xdp: that package (at the
// pinned version) has no Close — its mmaps outlive close(2), so the queue stays
// busy and cannot be rebound — cannot request copy or zero-copy mode,
// panics when the frame pool is empty and swallows sendmsg errors. A raw QP
// must be re-openable, must fall back from zero-copy to copy mode, and must
// report starvation as counters, so this package owns its rings.
//
// Memory: the UMEM is split in two pools, one for reception (its frames
// circulate between the fill ring, the RX ring and the engine) and one for
// transmission (a free stack fed by the completion ring), optionally
// followed by chunks reserved for staged egress frames (Config.DeviceMemory,
// see devmem.go), which belong to neither pool. With root (or
// CAP_IPC_LOCK) the UMEM is not charged to RLIMIT_MEMLOCK; without it a large
// UMEM fails with ENOBUFS, which Open explains.
package afxdp

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/bpf"
	"github.com/bypassd/bypassd/ring/qp"
)

// Config describes one AF_XDP socket.
type Config struct {
	Ifindex int
	// IfName is used in error messages only.
	IfName string
	Queue  int
	// FrameSize is the UMEM chunk size: 2048 or 4096 (default 2048). The
	// largest frame one chunk receives is FrameSize-256 (XDP headroom).
	FrameSize int
	// MTU is the interface's MTU. When its largest frame (MTU+18) does not
	// fit one chunk the socket is bound multi-buffer (XDP_USE_SG, Linux
	// 6.6) and frames travel as descriptor chains (see chain.go); 0 means
	// what one chunk holds.
	MTU int
	// Frames is the total number of UMEM frames, a power of two (default
	// 4096); half receive, half send.
	Frames int
	// RingSize is the size of each of the four rings, a power of two
	// (default Frames/2).
	RingSize int
	Copy     qp.CopyMode
	// XDPMode is how the steering program is attached ("native" or
	// "generic"); reported in Caps.Mode.
	XDPMode string
	// DeviceMemory reserves this many bytes of UMEM, rounded up to whole
	// frames, for staged egress frames (AllocDeviceMemory); 0: none.
	DeviceMemory int
	// BusyTimeout bounds how long Open retries while the kernel still holds
	// the queue for a socket closed a moment ago (default 2s).
	BusyTimeout time.Duration
	// RXMetadata: the XDP program writes bpf.RXMeta in front of the frames
	// it redirects (its timestamping variant), so RX frames carry the
	// hardware receive timestamp it holds. Copy mode copies the metadata
	// area into the UMEM too (checked on Linux 6.18).
	RXMetadata bool
}

func (c *Config) setDefaults() error {
	if c.FrameSize == 0 {
		c.FrameSize = 2048
	}
	if c.FrameSize != 2048 && c.FrameSize != 4096 {
		return fmt.Errorf("frame size %d: must be 2048 or 4096", c.FrameSize)
	}
	if c.Frames == 0 {
		c.Frames = 4096
	}
	if c.Frames < 64 || c.Frames&(c.Frames-1) != 0 {
		return fmt.Errorf("frame count %d: must be a power of two >= 64", c.Frames)
	}
	if c.RingSize == 0 {
		c.RingSize = c.Frames / 2
	}
	if c.RingSize < 32 || c.RingSize&(c.RingSize-1) != 0 {
		return fmt.Errorf("ring size %d: must be a power of two >= 32", c.RingSize)
	}
	if c.MTU < 0 {
		return fmt.Errorf("MTU %d: must be positive", c.MTU)
	}
	if c.MTU == 0 {
		c.MTU = MaxSingleBufferMTU(c.FrameSize)
	}
	if NeedsMultiBuffer(c.MTU, c.FrameSize) {
		rx, tx := segsFor(c.MTU+FrameOverhead, c.FrameSize-rxHeadroom), segsFor(c.MTU+FrameOverhead, c.FrameSize)
		if rx > maxSegs || tx > maxSegs {
			return fmt.Errorf("MTU %d needs chains of %d buffers of %d bytes per frame, AF_XDP takes at most %d: use --frame-size 4096 (chains up to MTU %d)",
				c.MTU, max(rx, tx), c.FrameSize, maxSegs, maxSegs*(4096-rxHeadroom)-FrameOverhead)
		}
		if c.RingSize < 2*maxSegs {
			return fmt.Errorf("ring size %d: too small for chains of up to %d descriptors", c.RingSize, maxSegs)
		}
	}
	if c.DeviceMemory < 0 {
		return fmt.Errorf("device memory %d bytes: must be 0 (none) or positive", c.DeviceMemory)
	}
	if c.BusyTimeout == 0 {
		c.BusyTimeout = 2 * time.Second
	}
	if c.IfName == "" {
		c.IfName = fmt.Sprintf("ifindex %d", c.Ifindex)
	}
	return nil
}

// Socket is an open AF_XDP socket; it implements qp.Provider.
type Socket struct {
	cfg  Config
	fd   int
	umem []byte
	// umemFD is the memfd the UMEM is mapped from.
	umemFD   int
	zeroCopy bool

	fill, comp *addrRing
	rx, tx     *descRing

	// Multi-buffer (chain.go): multi is set when frames need chains.
	// rxLim bounds receive chains, rxLinear holds linearized frames (one
	// buffer per burst slot, reused), rxSkip is set while the rest of a
	// dropped chain is still to be skipped. TX buffers are slots of
	// txSegs contiguous chunks from txBase; slotSegs is how many
	// descriptors each posted slot used, so Complete knows its last.
	multi    bool
	rxLim    chainLimits
	rxLinear [][]byte
	rxSkip   bool
	txBase   uint64
	txSlot   uint64
	slotSegs []uint8

	// free holds the unused TX frames of the UMEM.
	free qp.TXPool
	// stageBase is where the staging chunks start (the end of the pools);
	// stage is the region lent out and released gets its completions.
	stageBase uint64
	stage     *stageRegion
	released  func(off int)
	// txPending counts frames posted to the TX ring and not yet completed.
	txPending int
	rxFrames  int

	closed bool

	// Counters read by other goroutines: atomics, updated once per burst.
	rxPackets, txPackets, fillEmpty, txNoBuffer, kicks atomic.Uint64
	// rxMeta counts frames that carried the program's metadata, rxStamped
	// those with a hardware timestamp in it.
	rxMeta, rxStamped atomic.Uint64
	// rxBadChains counts receive chains dropped as malformed or too long.
	rxBadChains atomic.Uint64
	// rxChained and txChained count frames moved as chains.
	rxChained, txChained atomic.Uint64

	pollFds [2]unix.PollFd
}

var _ qp.Provider = (*Socket)(nil)

// Open creates an AF_XDP socket on cfg's interface and queue. The calling
// thread's network namespace decides which interface cfg.Ifindex names.
func Open(cfg Config) (*Socket, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("afxdp %s queue %d: %w", cfg.IfName, cfg.Queue, err)
	}
	if cfg.Queue < 0 {
		return nil, fmt.Errorf("afxdp %s: queue %d: queue ids are >= 0", cfg.IfName, cfg.Queue)
	}
	if NeedsMultiBuffer(cfg.MTU, cfg.FrameSize) && !MultiBufferKernel() {
		return nil, fmt.Errorf("afxdp %s queue %d: MTU %d does not fit a %d-byte frame, and AF_XDP multi-buffer (XDP_USE_SG) needs Linux 6.6+ (this kernel is %s): "+
			"use --frame-size 4096 (MTUs up to %d in one buffer) or lower the MTU", cfg.IfName, cfg.Queue, cfg.MTU, cfg.FrameSize, bpf.KernelRelease(), MaxSingleBufferMTU(4096))
	}
	zc := cfg.Copy != qp.CopyForce
	s, err := open(cfg, zc)
	if err != nil && zc && cfg.Copy == qp.CopyAuto && errors.Is(err, unix.EOPNOTSUPP) {
		s, err = open(cfg, false)
	}
	if err != nil {
		return nil, fmt.Errorf("afxdp %s queue %d: %w", cfg.IfName, cfg.Queue, err)
	}
	return s, nil
}

func open(cfg Config, zeroCopy bool) (_ *Socket, err error) {
	fd, err := unix.Socket(unix.AF_XDP, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.EAFNOSUPPORT) {
			return nil, fmt.Errorf("create AF_XDP socket: %w (the kernel lacks CONFIG_XDP_SOCKETS: AF_XDP rings cannot run on this kernel)", err)
		}
		return nil, fmt.Errorf("create AF_XDP socket: %w (needs CAP_NET_RAW)", err)
	}
	s := &Socket{cfg: cfg, fd: fd, umemFD: -1, zeroCopy: zeroCopy, multi: NeedsMultiBuffer(cfg.MTU, cfg.FrameSize)}
	defer func() {
		if err != nil {
			s.release()
		}
	}()

	s.stageBase = uint64(cfg.Frames * cfg.FrameSize)
	size := (cfg.Frames + stageFrames(cfg.DeviceMemory, cfg.FrameSize)) * cfg.FrameSize
	// The UMEM is a memfd so that a new daemon taking over (Handover)
	// maps the very pages the kernel fills.
	if s.umemFD, err = unix.MemfdCreate("bypassd-umem", unix.MFD_CLOEXEC); err != nil {
		return nil, fmt.Errorf("allocate %d-byte UMEM: memfd: %w", size, err)
	}
	if err = unix.Ftruncate(s.umemFD, int64(size)); err != nil {
		return nil, fmt.Errorf("allocate %d-byte UMEM: %w", size, err)
	}
	s.umem, err = unix.Mmap(s.umemFD, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("allocate %d-byte UMEM: %w", size, err)
	}
	reg := unix.XDPUmemReg{
		Addr: uint64(uintptr(unsafe.Pointer(&s.umem[0]))),
		Len:  uint64(size),
		Size: uint32(cfg.FrameSize),
	}
	if err := setsockopt(fd, unix.XDP_UMEM_REG, unsafe.Pointer(&reg), unsafe.Sizeof(reg)); err != nil {
		if errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("register %d-byte UMEM: %w (locked memory: run as root or give CAP_IPC_LOCK, raise RLIMIT_MEMLOCK (ulimit -l), or use fewer frames)", size, err)
		}
		return nil, fmt.Errorf("register %d-byte UMEM: %w", size, err)
	}
	n := uint32(cfg.RingSize)
	for _, o := range []int{unix.XDP_UMEM_FILL_RING, unix.XDP_UMEM_COMPLETION_RING, unix.XDP_RX_RING, unix.XDP_TX_RING} {
		if err := unix.SetsockoptInt(fd, unix.SOL_XDP, o, int(n)); err != nil {
			return nil, fmt.Errorf("size ring %d to %d: %w", o, n, err)
		}
	}
	if err := s.mapRings(n); err != nil {
		return nil, err
	}

	// Half the frames receive: all of them wait in the fill ring. The fill
	// ring holds at most RingSize entries, so a larger half is capped.
	s.rxFrames = min(cfg.Frames/2, cfg.RingSize)
	fs := uint64(cfg.FrameSize)
	for i := 0; i < s.rxFrames; i++ {
		s.fill.addrs[i] = uint64(i) * fs
	}
	s.fill.cachedProd = uint32(s.rxFrames)
	s.fill.publishProducer(s.fill.cachedProd)
	s.initPools()

	flags := uint16(unix.XDP_USE_NEED_WAKEUP)
	if s.multi {
		flags |= unix.XDP_USE_SG
	}
	if zeroCopy {
		flags |= unix.XDP_ZEROCOPY
	} else {
		flags |= unix.XDP_COPY
	}
	sa := &unix.SockaddrXDP{Flags: flags, Ifindex: uint32(cfg.Ifindex), QueueID: uint32(cfg.Queue)}
	// A socket closed a moment ago may still hold the queue: the kernel
	// releases it lazily, so EBUSY is retried with backoff for a while.
	deadline := time.Now().Add(cfg.BusyTimeout)
	for delay := 5 * time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		err = unix.Bind(fd, sa)
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			break
		}
		time.Sleep(delay)
	}
	if err != nil {
		return nil, bindError(cfg, zeroCopy, err)
	}
	s.pollFds[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
	s.pollFds[1].Fd = -1
	return s, nil
}

// mapRings maps the socket's four rings of n entries each.
func (s *Socket) mapRings(n uint32) error {
	var off unix.XDPMmapOffsets
	optlen := uint32(unsafe.Sizeof(off))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(s.fd), unix.SOL_XDP, unix.XDP_MMAP_OFFSETS,
		uintptr(unsafe.Pointer(&off)), uintptr(unsafe.Pointer(&optlen)), 0); e != 0 {
		return fmt.Errorf("read ring offsets: %w", e)
	}
	rm, err := mapRing(s.fd, unix.XDP_UMEM_PGOFF_FILL_RING, off.Fr, n, 8)
	if err != nil {
		return fmt.Errorf("map fill ring: %w", err)
	}
	s.fill = newAddrRing(rm, off.Fr)
	if rm, err = mapRing(s.fd, unix.XDP_UMEM_PGOFF_COMPLETION_RING, off.Cr, n, 8); err != nil {
		return fmt.Errorf("map completion ring: %w", err)
	}
	s.comp = newAddrRing(rm, off.Cr)
	if rm, err = mapRing(s.fd, unix.XDP_PGOFF_RX_RING, off.Rx, n, unsafe.Sizeof(unix.XDPDesc{})); err != nil {
		return fmt.Errorf("map RX ring: %w", err)
	}
	s.rx = newDescRing(rm, off.Rx)
	if rm, err = mapRing(s.fd, unix.XDP_PGOFF_TX_RING, off.Tx, n, unsafe.Sizeof(unix.XDPDesc{})); err != nil {
		return fmt.Errorf("map TX ring: %w", err)
	}
	s.tx = newDescRing(rm, off.Tx)
	return nil
}

func bindError(cfg Config, zeroCopy bool, err error) error {
	mode := "copy"
	if zeroCopy {
		mode = "zero-copy"
	}
	switch {
	case NeedsMultiBuffer(cfg.MTU, cfg.FrameSize) && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)):
		return fmt.Errorf("bind %s mode with multi-buffer (XDP_USE_SG, for MTU %d over %d-byte frames): %w (the kernel or driver refused chains: needs Linux 6.6+ and, for zero-copy, a driver with multi-buffer support; "+
			"else use --frame-size 4096 for MTUs up to %d or lower the MTU; or queue %d does not exist on %s)", mode, cfg.MTU, cfg.FrameSize, err, MaxSingleBufferMTU(4096), cfg.Queue, cfg.IfName)
	case errors.Is(err, unix.EOPNOTSUPP) && zeroCopy:
		return fmt.Errorf("bind %s mode: %w (the driver has no AF_XDP zero-copy support; allow copy mode)", mode, err)
	case errors.Is(err, unix.EINVAL):
		return fmt.Errorf("bind %s mode: %w (queue %d does not exist on %s: check `ethtool -l %s` for its queue count)", mode, err, cfg.Queue, cfg.IfName, cfg.IfName)
	case errors.Is(err, unix.ENODEV), errors.Is(err, unix.ENXIO):
		return fmt.Errorf("bind %s mode: %w (interface %s is gone or not in this network namespace)", mode, err, cfg.IfName)
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("bind %s mode: %w (queue %d of %s is held by another AF_XDP socket: is another bypassd running?)", mode, err, cfg.Queue, cfg.IfName)
	}
	return fmt.Errorf("bind %s mode: %w", mode, err)
}

func setsockopt(fd, opt int, p unsafe.Pointer, n uintptr) error {
	if _, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), unix.SOL_XDP, uintptr(opt), uintptr(p), n, 0); e != 0 {
		return e
	}
	return nil
}

// Caps implements qp.Provider.
func (s *Socket) Caps() qp.Caps {
	copyMode := "copy"
	if s.zeroCopy {
		copyMode = "zero-copy"
	}
	mode := copyMode
	if s.cfg.XDPMode != "" {
		mode = s.cfg.XDPMode + "/" + copyMode
	}
	return qp.Caps{
		Provider:     "afxdp",
		Mode:         mode,
		ZeroCopy:     s.zeroCopy,
		FrameSize:    s.cfg.FrameSize,
		MaxFrame:     s.maxFrame(),
		MultiBuffer:  s.multi,
		RXFrames:     s.rxFrames,
		TXFrames:     s.cfg.Frames - s.rxFrames,
		DeviceMemory: s.cfg.DeviceMemory,
		// Frames may carry stamps only when the program writes them.
		HWTimestamps: s.cfg.RXMetadata,
	}
}

// FD implements qp.Provider: the XSK file descriptor for the XSKMAP.
func (s *Socket) FD() int { return s.fd }

// RXBurst implements qp.Provider.
func (s *Socket) RXBurst(frames []qp.Frame) int {
	if s.multi {
		return s.rxChains(frames)
	}
	n := s.rx.available(&s.rx.cachedProd, s.rx.cachedCons)
	n = min(n, uint32(len(frames)))
	if n == 0 {
		return 0
	}
	cons := s.rx.cachedCons
	for i := uint32(0); i < n; i++ {
		d := &s.rx.descs[(cons+i)&s.rx.mask]
		addr, l := d.Addr, uint64(d.Len)
		if addr+l > uint64(len(s.umem)) {
			// Never trust a descriptor blindly; the kernel would not
			// produce this, but a bad one must not crash the daemon.
			l = 0
		}
		frames[i] = qp.Frame{Buf: s.umem[addr : addr+l : addr+l], Handle: addr}
	}
	s.readMeta(frames[:n])
	s.rx.cachedCons = cons + n
	s.rx.publishConsumer(s.rx.cachedCons)
	s.rxPackets.Add(uint64(n))
	return int(n)
}

// readMeta takes the flow tags and hardware timestamps out of the
// metadata in front of the frames (bpf.FlowMeta, preceded by bpf.RXMeta
// with RXMetadata) and clears their magics, so that the buffer's next
// frame, if the program writes nothing for it, does not inherit a stale
// value.
func (s *Socket) readMeta(frames []qp.Frame) {
	var meta, stamped uint64
	for i := range frames {
		m, st := s.frameMeta(frames[i].Handle, &frames[i])
		meta += m
		stamped += st
	}
	s.countMeta(meta, stamped)
}

// frameMeta reads (and clears) the metadata in front of the frame that
// starts at UMEM address addr into f, and reports whether it carried a
// timestamp area (meta) and a hardware stamp in it (stamped), as 0 or 1.
func (s *Socket) frameMeta(addr uint64, f *qp.Frame) (meta, stamped uint64) {
	fs := uint64(s.cfg.FrameSize)
	tagAt := addr
	if s.cfg.RXMetadata && addr%fs >= bpf.RXMetaSize {
		m := s.umem[addr-bpf.RXMetaSize : addr]
		if ts, status, ok := bpf.ParseRXMeta(m); ok {
			meta = 1
			clear(m)
			if status == 0 && ts != 0 {
				f.HWTimestamp = ts
				stamped = 1
			}
			tagAt = addr - bpf.RXMetaSize
		}
	}
	if tagAt%fs < bpf.FlowMetaSize {
		return meta, stamped // no room in front of the frame within its chunk
	}
	m := s.umem[tagAt-bpf.FlowMetaSize : tagAt]
	if home, ok := bpf.ParseFlowMeta(m); ok {
		f.Tagged, f.Home = true, home
		clear(m)
	}
	return meta, stamped
}

func (s *Socket) countMeta(meta, stamped uint64) {
	if meta > 0 {
		s.rxMeta.Add(meta)
		s.rxStamped.Add(stamped)
	}
}

// RXMetadataStats reports how many received frames carried the XDP
// program's metadata and how many of those a hardware timestamp.
func (s *Socket) RXMetadataStats() (frames, stamped uint64) {
	return s.rxMeta.Load(), s.rxStamped.Load()
}

// ReleaseRX implements qp.Provider.
func (s *Socket) ReleaseRX(frames []qp.Frame) {
	if len(frames) == 0 {
		return
	}
	// The fill ring has room for every RX frame, so this cannot overflow.
	n := uint32(len(frames))
	free := s.fill.freeSlots(s.fill.cachedProd, &s.fill.cachedCons, n)
	if free < n {
		n = free
	}
	mask := ^uint64(s.cfg.FrameSize - 1)
	prod := s.fill.cachedProd
	k := uint32(0)
	for i := uint32(0); i < n; i++ {
		if frames[i].Handle == linearHandle {
			continue // refilled when it was linearized
		}
		s.fill.addrs[(prod+k)&s.fill.mask] = frames[i].Handle & mask
		k++
	}
	s.fill.cachedProd = prod + k
	s.fill.publishProducer(s.fill.cachedProd)
	if s.zeroCopy && s.fill.needWakeup() {
		s.kickRX()
	}
}

// AllocTX implements qp.Provider.
func (s *Socket) AllocTX(frames []qp.Frame) int {
	if s.free.Len() < len(frames) {
		s.Complete()
	}
	n := s.free.Take(frames)
	if n < len(frames) {
		s.txNoBuffer.Add(1)
	}
	return n
}

// FreeTX implements qp.Provider. A staged frame is not a TX buffer and
// never joins the free list.
func (s *Socket) FreeTX(frames []qp.Frame) {
	for i := range frames {
		if frames[i].Handle < s.stageBase {
			s.free.Put(frames[i].Handle)
		}
	}
}

// TXBurst implements qp.Provider.
func (s *Socket) TXBurst(frames []qp.Frame) (int, error) {
	if s.closed {
		return 0, qp.ErrClosed
	}
	if s.multi {
		return s.txChains(frames)
	}
	n := s.tx.freeSlots(s.tx.cachedProd, &s.tx.cachedCons, uint32(len(frames)))
	n = min(n, uint32(len(frames)))
	prod := s.tx.cachedProd
	for i := uint32(0); i < n; i++ {
		d := &s.tx.descs[(prod+i)&s.tx.mask]
		d.Addr = frames[i].Handle
		d.Len = uint32(len(frames[i].Buf))
		d.Options = 0
	}
	s.tx.cachedProd = prod + n
	s.tx.publishProducer(s.tx.cachedProd)
	s.txPending += int(n)
	s.txPackets.Add(uint64(n))
	return int(n), s.kickTX()
}

// kickTX asks the kernel to process the TX ring. In copy mode the kernel
// sends at most a small batch (32) per call and answers EAGAIN while more
// remain, so it is called until the ring drains or the kernel is busy.
func (s *Socket) kickTX() error {
	if s.zeroCopy && !s.tx.needWakeup() {
		return nil
	}
	for i := 0; i < s.cfg.RingSize/16+2; i++ {
		s.kicks.Add(1)
		// RawSyscall: the call never blocks (MSG_DONTWAIT), and the
		// ordinary path would let the runtime hand this thread's P away
		// during a long copy-mode transmit, parking the engine thread on
		// return until a P is free.
		_, _, e := unix.RawSyscall6(unix.SYS_SENDTO, uintptr(s.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
		switch e {
		case 0:
			return nil
		case unix.EAGAIN:
			if atomic.LoadUint32(s.tx.consumer) == s.tx.cachedProd {
				return nil
			}
			continue
		case unix.EBUSY, unix.ENOBUFS, unix.EINTR:
			// Transient: the frames stay queued; the next kick (from
			// Complete or the next burst) retries.
			return nil
		case unix.ENETDOWN, unix.ENXIO, unix.ENODEV:
			return fmt.Errorf("afxdp %s queue %d: transmit: %w (link down or device gone)", s.cfg.IfName, s.cfg.Queue, e)
		default:
			return fmt.Errorf("afxdp %s queue %d: transmit: %w", s.cfg.IfName, s.cfg.Queue, e)
		}
	}
	return nil
}

func (s *Socket) kickRX() {
	s.kicks.Add(1)
	_, _, _ = unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(s.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
}

// Complete implements qp.Provider.
func (s *Socket) Complete() int {
	if s.closed {
		return 0
	}
	n := s.comp.available(&s.comp.cachedProd, s.comp.cachedCons)
	if n > 0 {
		cons := s.comp.cachedCons
		for i := uint32(0); i < n; i++ {
			addr := s.comp.addrs[(cons+i)&s.comp.mask]
			if addr >= s.stageBase {
				// A staged frame: its space goes back to the
				// allocator, in completion order.
				if s.released != nil {
					s.released(int(addr - s.stageBase))
				}
				continue
			}
			if s.multi {
				s.completeChunk(addr)
				continue
			}
			s.free.Put(addr)
		}
		s.comp.cachedCons = cons + n
		s.comp.publishConsumer(s.comp.cachedCons)
		s.txPending -= int(n)
	}
	// Frames still in the TX ring need another kick in copy mode.
	if s.txPending > 0 && atomic.LoadUint32(s.tx.consumer) != s.tx.cachedProd {
		_ = s.kickTX()
	}
	return int(n)
}

// TXPending implements qp.Provider.
func (s *Socket) TXPending() int { return s.txPending }

// shortWait bounds the sleeps Wait makes without giving up the thread's
// P (see Wait).
const shortWait = time.Millisecond

// Wait implements qp.Provider.
func (s *Socket) Wait(timeout time.Duration, extra int) (bool, error) {
	// ppoll, not poll: the engine sleeps until paced departures and
	// needs microseconds, not poll's whole milliseconds.
	var ts *unix.Timespec
	if timeout >= 0 {
		t := unix.NsecToTimespec(int64(timeout))
		ts = &t
	}
	fds := s.pollFds[:1]
	if extra >= 0 {
		s.pollFds[1] = unix.PollFd{Fd: int32(extra), Events: unix.POLLIN}
		fds = s.pollFds[:2]
	}
	if s.fill.needWakeup() {
		s.fillEmpty.Add(1)
	}
	var n int
	var err error
	if timeout >= 0 && timeout < shortWait {
		// A short sleep until a paced departure keeps the thread's P, as
		// kickTX does: given up, it may not be free again on waking,
		// and the engine would wake on time only to wait for the runtime.
		r, _, e := unix.RawSyscall6(unix.SYS_PPOLL, uintptr(unsafe.Pointer(&fds[0])), uintptr(len(fds)), uintptr(unsafe.Pointer(ts)), 0, 0, 0)
		if n = int(r); e != 0 {
			err = e
		}
	} else {
		n, err = unix.Ppoll(fds, ts, nil)
	}
	if err != nil && err != unix.EINTR {
		return false, fmt.Errorf("afxdp %s queue %d: poll: %w", s.cfg.IfName, s.cfg.Queue, err)
	}
	if s.pollFds[0].Revents&(unix.POLLERR|unix.POLLNVAL) != 0 {
		return false, fmt.Errorf("afxdp %s queue %d: socket error (device gone?)", s.cfg.IfName, s.cfg.Queue)
	}
	if n == 0 && timeout >= time.Millisecond {
		// A quiet spell: make sure the queue still exists. An interface
		// that vanished unbinds the socket without waking poll(2).
		if err := s.alive(); err != nil {
			return false, err
		}
	}
	return extra >= 0 && s.pollFds[1].Revents&unix.POLLIN != 0, nil
}

// alive reports an error if the socket lost its queue (the interface was
// removed): the kernel then answers ENXIO to any receive.
func (s *Socket) alive() error {
	_, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(s.fd), 0, 0, unix.MSG_DONTWAIT, 0, 0)
	if e == unix.ENXIO || e == unix.ENODEV || e == unix.ENETDOWN {
		return fmt.Errorf("afxdp %s queue %d: the queue is gone (interface removed?): %w", s.cfg.IfName, s.cfg.Queue, e)
	}
	return nil
}

// Stats implements qp.Provider.
func (s *Socket) Stats() qp.Stats {
	st := qp.Stats{
		RXPackets:   s.rxPackets.Load(),
		TXPackets:   s.txPackets.Load(),
		FillEmpty:   s.fillEmpty.Load(),
		TXNoBuffer:  s.txNoBuffer.Load(),
		Kicks:       s.kicks.Load(),
		RXBadChains: s.rxBadChains.Load(),
		RXChains:    s.rxChained.Load(),
		TXChains:    s.txChained.Load(),
	}
	var xs unix.XDPStatistics
	optlen := uint32(unsafe.Sizeof(xs))
	if _, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(s.fd), unix.SOL_XDP, unix.XDP_STATISTICS,
		uintptr(unsafe.Pointer(&xs)), uintptr(unsafe.Pointer(&optlen)), 0); e == 0 {
		st.RXDropped = xs.Rx_dropped + xs.Rx_ring_full
		st.FillEmpty += xs.Rx_fill_ring_empty_descs
		st.InvalidDescs = xs.Rx_invalid_descs + xs.Tx_invalid_descs
	}
	return st
}

// Close implements qp.Provider. It unmaps the rings and the UMEM before
// closing the socket: a mapping left behind would keep the kernel's socket
// alive and the queue busy.
func (s *Socket) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	return s.release()
}

func (s *Socket) release() error {
	for _, r := range []*ringMem{ringOf(s.fill), ringOf(s.comp), descOf(s.rx), descOf(s.tx)} {
		if r != nil {
			r.unmap()
		}
	}
	if s.umem != nil {
		_ = unix.Munmap(s.umem)
		s.umem = nil
	}
	if s.umemFD >= 0 {
		_ = unix.Close(s.umemFD)
		s.umemFD = -1
	}
	if s.fd >= 0 {
		err := unix.Close(s.fd)
		s.fd = -1
		if err != nil {
			return fmt.Errorf("afxdp %s queue %d: close: %w", s.cfg.IfName, s.cfg.Queue, err)
		}
	}
	return nil
}

func ringOf(r *addrRing) *ringMem {
	if r == nil {
		return nil
	}
	return &r.ringMem
}

func descOf(r *descRing) *ringMem {
	if r == nil {
		return nil
	}
	return &r.ringMem
}
