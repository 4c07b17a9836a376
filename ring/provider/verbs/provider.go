//go:build verbs

package verbs

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring/devmem"
	"github.com/bypassd/bypassd/ring/qp"
)

// Built reports whether this binary contains the verbs provider.
const Built = true

// Config describes one verbs ring.
type Config struct {
	// Interface is the network interface (in the calling thread's network
	// namespace) whose RDMA device and port carry the ring.
	Interface string
	// Queue is the ring's queue number; for verbs it only names the ring in
	// messages (a raw packet QP is not tied to a kernel queue).
	Queue int
	// Device and Port override the sysfs lookup of the interface's RDMA
	// device and port.
	Device string
	Port   int
	// Frames is the number of packet buffers, half for reception, half for
	// transmission (default 4096); FrameSize their size (default 2048),
	// raised to what a frame of MTU needs (RecvBufferSize).
	Frames, FrameSize int
	// MTU is the interface MTU (0: not checked); see mtu.go.
	MTU int
	// MaxPacedQueues bounds the extra send QPs SetRateLimit creates, one
	// per paced send queue (default 64; each holds PacedDepth sends).
	MaxPacedQueues int
	// Inline is the largest frame sent inline in the work request
	// (default 204, devmem's inline threshold; the device may grant less).
	Inline int
	// NoTimestamps leaves completion timestamps off even when the device
	// has them.
	NoTimestamps bool
}

func (c *Config) setDefaults() error {
	if c.Frames == 0 {
		c.Frames = 4096
	}
	if c.Frames < 64 || c.Frames > 1<<20 {
		return fmt.Errorf("frame count %d: must be 64..1048576", c.Frames)
	}
	if c.FrameSize == 0 {
		c.FrameSize = 2048
	}
	if c.FrameSize < 256 || c.FrameSize > maxFrameSize || c.FrameSize&(c.FrameSize-1) != 0 {
		return fmt.Errorf("frame size %d: must be a power of two from 256 to %d", c.FrameSize, maxFrameSize)
	}
	if c.MTU > 0 {
		var err error
		if c.FrameSize, err = RecvBufferSize(c.MTU, c.FrameSize); err != nil {
			return err
		}
	}
	if c.MaxPacedQueues == 0 {
		c.MaxPacedQueues = 64
	}
	if c.MaxPacedQueues < 0 || c.MaxPacedQueues > 512 {
		return fmt.Errorf("paced send queues %d: must be 0..512", c.MaxPacedQueues)
	}
	if c.Inline == 0 {
		c.Inline = devmem.DefaultInlineThreshold
	}
	if c.Inline < 0 || c.Inline > 1024 {
		return fmt.Errorf("inline size %d: must be 0..1024", c.Inline)
	}
	return nil
}

// dmHandle marks a frame handle as an offset in the device memory region
// rather than in the host buffer pool (see DeviceRegion.TXFrame).
const dmHandle = 1 << 63

// signalEvery: a send work request asks for a completion at least this often
// (and always at the end of a burst). Completions free every earlier request
// of the same QP, so fewer of them save CQ bandwidth.
const signalEvery = 16

// wrSeqBits: a send wr_id is the send queue index above this many bits of a
// per-queue sequence number.
const wrSeqBits = 48

// completion mirrors struct bpd_wc.
type completion struct {
	WRID   uint64
	TS     uint64
	Status uint32
	Len    uint32
}

// sendWR mirrors struct bpd_send.
type sendWR struct {
	Addr   uint64
	WRID   uint64
	Len    uint32
	LKey   uint32
	Flags  uint32
	MSS    uint16
	HdrLen uint16
}

// Large sends (hardware TSO, qp.Segmenter): tsoBuffers buffers of
// tsoBufSize bytes after the frames of the pool, each holding the largest
// packet the TCP stack hands the engine (64 KiB of IP) behind its Ethernet
// header; the QPs take headers of up to tsoMaxHeader bytes (Ethernet, a
// VLAN tag, IPv6 and TCP with full options: 118).
const (
	tsoBuffers   = 32
	tsoBufSize   = 68 << 10
	tsoMaxHeader = 128
)

// postedFrame is a send in flight: its sequence number and buffer.
type postedFrame struct {
	seq    uint64
	handle uint64
}

// sendQueue is one send QP: the main QP (index 0) or a paced one.
type sendQueue struct {
	qp cQP
	// depth is how many sends may be in flight on it.
	depth       int
	inflight    []postedFrame // in post order; the head is the oldest
	seq         uint64
	sinceSignal int
}

// Provider is a raw packet QP on one RDMA port; it implements qp.Provider,
// qp.RateLimiter and qp.DeviceMemory, steers flows with ibv_create_flow
// (Steering) and exposes the device clock (Clock).
type Provider struct {
	cfg   Config
	bind  Binding
	caps  DeviceCaps
	mac   net.HardwareAddr
	sizes queueSizes

	// ctxMu guards ctx against Close while the clock is sampled from the
	// converter's goroutine.
	ctxMu  sync.RWMutex
	ctx    cContext
	pd     cPD
	ch     cChannel
	scq    cCQ
	rcq    cCQ
	mr     cMR
	lkey   uint32
	pool   []byte
	base   uintptr
	inline int
	ts     bool

	sq      []*sendQueue
	pending int // frames in flight over all send queues
	free    qp.TXPool
	// tso is the largest large send the QPs take (0: none; see tsoLimit);
	// the buffers for them start at handle tsoBase, the free ones are
	// tsoFree.
	tso      int
	tsoBase  uint64
	tsoFree  []uint64
	rxPosted int

	// Completions taken by Wait's race check, consumed first by RXBurst and
	// Complete.
	rxStash, txStash []completion
	wc               []completion
	wrs              []sendWR
	repost           []uint64

	flowMu sync.Mutex
	flows  map[qp.Flow]cFlow

	dm *DeviceRegion

	fatal  error
	closed bool
	// broken publishes fatal to other goroutines (Steering.Healthy).
	broken atomic.Pointer[error]

	rxPackets, txPackets, rxErrors, txErrors, noRXBuffer, txNoBuffer, posts, tsoPackets atomic.Uint64

	pollFds [3]unix.PollFd
}

var (
	_ qp.Provider     = (*Provider)(nil)
	_ qp.RateLimiter  = (*Provider)(nil)
	_ qp.DeviceMemory = (*Provider)(nil)
	_ qp.Segmenter    = (*Provider)(nil)
)

// tsoLimit is the largest large send the provider posts on a device with
// caps c, 0 when the engine must segment in software: the device's TSO
// size for raw packet QPs, up to a buffer, and only with checksum offload
// (IBV_RAW_PACKET_CAP_IP_CSUM), since each segment's IP and TCP checksums
// are the device's to compute.
func tsoLimit(c DeviceCaps) int {
	if c.MaxTSO == 0 || !slices.Contains(c.RawPacketCaps, "ip_csum") {
		return 0
	}
	return int(min(c.MaxTSO, tsoBufSize))
}

// Query opens the device of b, reads its capabilities and those of b's port,
// and closes it.
func Query(b Binding) (DeviceCaps, error) {
	ctx, err := openDevice(b.Device)
	if err != nil {
		return DeviceCaps{}, err
	}
	defer cClose(ctx)
	raw, err := cQuery(ctx, uint8(b.Port))
	if err != nil {
		return DeviceCaps{}, translate("query device "+b.Device, err)
	}
	c := parseCaps(b, raw)
	if !raw.PortQueried {
		return c, fmt.Errorf("RDMA device %s has no port %d (it has %d)", b.Device, b.Port, raw.PhysPortCnt)
	}
	return c, nil
}

// openDevice opens an RDMA device by name; a name that is not there is
// reported with the names that are.
func openDevice(name string) (cContext, error) {
	ctx, err := cOpen(name)
	if err == nil {
		return ctx, nil
	}
	if errors.Is(err, unix.ENODEV) {
		names, lerr := cDeviceNames()
		if lerr == nil {
			have := "none"
			if len(names) > 0 {
				have = fmt.Sprint(names)
			}
			return nil, fmt.Errorf("open RDMA device %s: %w (devices present: %s)", name, ErrNoRDMADevice, have)
		}
	}
	return nil, translate("open RDMA device "+name, err)
}

// Open creates the ring's raw packet QP on cfg's interface: it opens the
// RDMA device, creates the completion queues, registers the buffer pool,
// walks the QP to RTS and posts every receive buffer. Steering is added
// per flow afterwards (Steering().AddFlow); until then the QP receives
// nothing.
func Open(cfg Config) (_ *Provider, err error) {
	name := fmt.Sprintf("verbs %s/%d", cfg.Interface, cfg.Queue)
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	p := &Provider{cfg: cfg, flows: map[qp.Flow]cFlow{}}
	defer func() {
		if err != nil {
			p.release()
			err = fmt.Errorf("%s: %w", name, err)
		}
	}()
	p.bind = Binding{Interface: cfg.Interface, Device: cfg.Device, Port: cfg.Port}
	if cfg.Device == "" {
		if p.bind, err = Lookup(cfg.Interface); err != nil {
			return nil, err
		}
	}
	if p.bind.Port < 1 || p.bind.Port > 255 {
		return nil, fmt.Errorf("RDMA port %d: ports count from 1", p.bind.Port)
	}
	ifc, err := net.InterfaceByName(cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w (check `ip link` in this network namespace)", cfg.Interface, err)
	}
	p.mac = ifc.HardwareAddr
	if p.ctx, err = openDevice(p.bind.Device); err != nil {
		return nil, err
	}
	raw, err := cQuery(p.ctx, uint8(p.bind.Port))
	if err != nil {
		return nil, translate("query device "+p.bind.Device, err)
	}
	p.caps = parseCaps(p.bind, raw)
	if !raw.PortQueried {
		return nil, fmt.Errorf("RDMA device %s has no port %d (it has %d)", p.bind.Device, p.bind.Port, raw.PhysPortCnt)
	}
	if !p.caps.RawPacket {
		return nil, fmt.Errorf("RDMA device %s port %d has link layer %s: raw Ethernet QPs need an Ethernet port (use --provider=afxdp)",
			p.bind.Device, p.bind.Port, p.caps.LinkLayer)
	}
	if err = CheckPortMTU(cfg.Interface, cfg.MTU, p.caps); err != nil {
		return nil, err
	}
	if p.sizes, err = sizeQueues(cfg, p.caps); err != nil {
		return nil, err
	}
	if p.pd, err = cAllocPD(p.ctx); err != nil {
		return nil, translate("allocate protection domain", err)
	}
	if p.ch, err = cCreateChannel(p.ctx); err != nil {
		return nil, translate("create completion channel", err)
	}
	if err = p.createCQs(); err != nil {
		return nil, err
	}
	n := p.sizes.RXFrames + p.sizes.TXFrames
	size := n * cfg.FrameSize
	if p.tso = tsoLimit(p.caps); p.tso > 0 {
		p.tsoBase = uint64(size)
		size += tsoBuffers * tsoBufSize
	}
	if p.pool, err = unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE); err != nil {
		return nil, fmt.Errorf("allocate %d-byte buffer pool: %w", size, err)
	}
	p.base = uintptr(unsafe.Pointer(&p.pool[0]))
	if p.mr, p.lkey, err = cRegMR(p.pd, p.pool); err != nil {
		return nil, translate(fmt.Sprintf("register %d-byte buffer pool", len(p.pool)), err)
	}
	main, err := p.newSendQueue(p.sizes.SendWR, p.sizes.RecvWR)
	if err != nil {
		return nil, err
	}
	p.sq = append(p.sq, main)
	for i := range tsoBuffers * min(p.tso, 1) {
		p.tsoFree = append(p.tsoFree, p.tsoBase+uint64(i*tsoBufSize))
	}
	fs := uint64(cfg.FrameSize)
	p.repost = make([]uint64, 0, p.sizes.RXFrames)
	for i := 0; i < p.sizes.RXFrames; i++ {
		p.repost = append(p.repost, uint64(i)*fs)
	}
	if err = p.postRecv(); err != nil {
		return nil, err
	}
	p.free = qp.NewTXPool(p.pool, cfg.FrameSize, p.sizes.TXFrames)
	for i := n - 1; i >= p.sizes.RXFrames; i-- {
		p.free.Put(uint64(i) * fs)
	}
	p.wc = make([]completion, 64)
	p.pollFds[0] = unix.PollFd{Fd: int32(cChannelFD(p.ch)), Events: unix.POLLIN}
	p.pollFds[1] = unix.PollFd{Fd: int32(cAsyncFD(p.ctx)), Events: unix.POLLIN}
	p.pollFds[2].Fd = -1
	return p, nil
}

// createCQs creates the send and receive CQs, with completion timestamps
// when the device has them; a device that refuses timestamped CQs gets
// plain ones.
func (p *Provider) createCQs() (err error) {
	flags := uint64(wcExWithByteLen)
	// Without the clock rate the ticks cannot become nanoseconds.
	p.ts = p.caps.CompletionTimestamps && p.caps.ClockKHz != 0 && !p.cfg.NoTimestamps
	if p.ts {
		flags |= wcExWithCompletionTimestamp
	}
	p.rcq, err = cCreateCQ(p.ctx, p.ch, p.sizes.RecvCQE, flags)
	if err != nil && p.ts && (errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)) {
		p.ts = false
		flags = wcExWithByteLen
		p.rcq, err = cCreateCQ(p.ctx, p.ch, p.sizes.RecvCQE, flags)
	}
	if err != nil {
		return translate(fmt.Sprintf("create %d-entry receive completion queue", p.sizes.RecvCQE), err)
	}
	if p.scq, err = cCreateCQ(p.ctx, p.ch, p.sizes.SendCQE, flags); err != nil {
		return translate(fmt.Sprintf("create %d-entry send completion queue", p.sizes.SendCQE), err)
	}
	return nil
}

// newSendQueue creates a raw packet QP on the shared CQs (sq send and rq
// receive entries; rq 0 for a send-only paced queue) and walks it to RTS.
// The first one fixes the inline size and large sends all of them use.
func (p *Provider) newSendQueue(sq, rq int) (*sendQueue, error) {
	want := p.cfg.Inline
	if len(p.sq) > 0 {
		want = p.inline
	}
	tsoHeader := tsoMaxHeader * min(p.tso, 1)
	q, inline, err := cCreateQP(p.pd, p.scq, p.rcq, sq, rq, want, tsoHeader)
	if err != nil && tsoHeader > 0 && len(p.sq) == 0 && (errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)) {
		// A device that reports TSO but refuses the header size:
		// the engine segments in software.
		p.tso, tsoHeader = 0, 0
		q, inline, err = cCreateQP(p.pd, p.scq, p.rcq, sq, rq, want, 0)
	}
	if err != nil && want > 0 && errors.Is(err, unix.EINVAL) {
		// Some devices take no inline data on raw packet QPs.
		want = 0
		q, inline, err = cCreateQP(p.pd, p.scq, p.rcq, sq, rq, 0, tsoHeader)
	}
	if err != nil {
		return nil, translate(fmt.Sprintf("create raw packet QP (%d send, %d receive entries)", sq, rq), err)
	}
	if len(p.sq) == 0 {
		p.inline = min(inline, want)
	}
	if err := walkQP(uint8(p.bind.Port), func(st qpStep) error { return cModifyQP(q, st) }); err != nil {
		_ = cDestroyQP(q)
		return nil, err
	}
	return &sendQueue{qp: q, depth: sq}, nil
}

// Caps implements qp.Provider.
func (p *Provider) Caps() qp.Caps {
	return qp.Caps{
		Provider:     "verbs",
		Mode:         p.mode(),
		ZeroCopy:     true,
		FrameSize:    p.cfg.FrameSize,
		MaxFrame:     p.cfg.FrameSize,
		RXFrames:     p.sizes.RXFrames,
		TXFrames:     p.sizes.TXFrames,
		RateLimit:    p.caps.RateLimitCaps(),
		DeviceMemory: int(min(p.caps.DeviceMemory, 1<<30)),
		HWTimestamps: p.ts,
	}
}

// mode names the device and port, and says whether the device segments
// large TCP packets (hardware TSO, up to how many bytes).
func (p *Provider) mode() string {
	m := fmt.Sprintf("raw-packet %s:%d", p.bind.Device, p.bind.Port)
	if p.tso > 0 {
		m += fmt.Sprintf(", tso %d", p.tso)
	}
	return m
}

// FD implements qp.Provider: the completion channel, readable when a
// completion event is due. Verbs rings are not steered through an XSKMAP.
func (p *Provider) FD() int { return int(p.pollFds[0].Fd) }

// RXBurst implements qp.Provider. Frames carry the completion timestamp,
// in nanoseconds of the device clock, when the CQ has timestamps (see
// Clock).
func (p *Provider) RXBurst(frames []qp.Frame) int {
	if p.closed || p.fatal != nil || len(frames) == 0 {
		return 0
	}
	got := 0
	if len(p.rxStash) > 0 {
		// What Wait found: hand that out first, and poll the CQ next time.
		k := min(len(p.rxStash), len(frames))
		got = p.takeRX(p.rxStash[:k], frames)
		p.rxStash = p.rxStash[:copy(p.rxStash, p.rxStash[k:])]
	} else {
		for got < len(frames) {
			k, err := cPoll(p.rcq, p.wc[:min(len(p.wc), len(frames)-got)], p.ts)
			if err != nil {
				p.fail(translate("poll receive completions", err))
				break
			}
			if k == 0 {
				break
			}
			got += p.takeRX(p.wc[:k], frames[got:])
		}
	}
	if len(p.repost) > 0 {
		if err := p.postRecv(); err != nil {
			p.fail(err)
		}
	}
	p.rxPackets.Add(uint64(got))
	return got
}

// takeRX turns receive completions into frames; failed ones go straight
// back to the receive queue. It returns how many frames it filled; frames
// has room for every completion in batch.
func (p *Provider) takeRX(batch []completion, frames []qp.Frame) int {
	n := 0
	fs := uint64(p.cfg.FrameSize)
	limit := uint64(p.sizes.RXFrames) * fs
	for _, c := range batch {
		p.rxPosted--
		off := c.WRID
		if off >= limit || off%fs != 0 {
			// Not one of ours: never trust a completion blindly.
			p.rxErrors.Add(1)
			continue
		}
		if c.Status != wcSuccess || uint64(c.Len) > fs {
			p.rxErrors.Add(1)
			if c.Status == wcFlushError {
				p.fail(fmt.Errorf("receive queue flushed: the QP left RTS (port or device error)"))
			}
			p.repost = append(p.repost, off)
			continue
		}
		frames[n] = qp.Frame{Buf: p.pool[off : off+uint64(c.Len) : off+fs], Handle: off, HWTimestamp: ticksToNs(c.TS, p.caps.ClockKHz)}
		n++
	}
	return n
}

// ReleaseRX implements qp.Provider: the buffers are posted for reception
// again.
func (p *Provider) ReleaseRX(frames []qp.Frame) {
	if p.closed {
		return
	}
	fs := uint64(p.cfg.FrameSize)
	for i := range frames {
		p.repost = append(p.repost, frames[i].Handle&^(fs-1))
	}
	if err := p.postRecv(); err != nil {
		p.fail(err)
	}
}

func (p *Provider) postRecv() error {
	if p.fatal != nil {
		return nil
	}
	k, err := cPostRecv(p.sq[0].qp, p.lkey, p.base, p.repost, p.cfg.FrameSize)
	p.rxPosted += k
	p.repost = p.repost[:copy(p.repost, p.repost[k:])]
	if err != nil {
		return translate("post receive buffers", err)
	}
	return nil
}

// AllocTX implements qp.Provider.
func (p *Provider) AllocTX(frames []qp.Frame) int {
	if p.free.Len() < len(frames) {
		p.Complete()
	}
	n := p.free.Take(frames)
	if n < len(frames) {
		p.txNoBuffer.Add(1)
	}
	return n
}

// AllocTSO implements qp.Segmenter: a buffer for one large send, when the
// device segments (tsoLimit) and the packet fits.
func (p *Provider) AllocTSO(f *qp.Frame, size, hdr int) bool {
	if p.tso == 0 || size > p.tso || hdr > tsoMaxHeader || hdr >= size {
		return false
	}
	if len(p.tsoFree) == 0 {
		p.Complete()
		if len(p.tsoFree) == 0 {
			p.txNoBuffer.Add(1)
			return false
		}
	}
	h := p.tsoFree[len(p.tsoFree)-1]
	p.tsoFree = p.tsoFree[:len(p.tsoFree)-1]
	*f = qp.Frame{Buf: p.pool[h : h+tsoBufSize : h+tsoBufSize], Handle: h}
	return true
}

// FreeTX implements qp.Provider.
func (p *Provider) FreeTX(frames []qp.Frame) {
	for i := range frames {
		if frames[i].Handle&dmHandle == 0 {
			p.putTX(frames[i].Handle)
		}
	}
}

// putTX returns a host send buffer to its free list.
func (p *Provider) putTX(h uint64) {
	if p.tsoBase != 0 && h >= p.tsoBase {
		p.tsoFree = append(p.tsoFree, h)
		return
	}
	p.free.Put(h)
}

// TXBurst implements qp.Provider. Each frame goes on the send queue its
// SendQueue names (0: the main queue; k: the paced QP SetRateLimit opened
// for k; a queue never opened: the main queue), in runs of consecutive
// frames of one queue. The frames accepted are always a prefix: a run that
// does not fit ends the burst. A frame from DeviceRegion.TXFrame is sent
// from device memory.
func (p *Provider) TXBurst(frames []qp.Frame) (int, error) {
	if p.closed {
		return 0, qp.ErrClosed
	}
	if p.fatal != nil {
		return 0, p.fatal
	}
	done := 0
	for done < len(frames) {
		q, n := p.nextRun(frames[done:])
		k, err := p.post(q, frames[done:done+n])
		if err != nil || k < n {
			return done + k, err
		}
		done += n
	}
	return done, nil
}

// nextRun returns the send queue of frames[0] and how many frames from the
// start go on that queue.
func (p *Provider) nextRun(frames []qp.Frame) (q, n int) {
	q = p.queueOf(frames[0])
	n = 1
	for n < len(frames) && p.queueOf(frames[n]) == q {
		n++
	}
	return q, n
}

// queueOf is the send queue a frame goes on.
func (p *Provider) queueOf(f qp.Frame) int {
	if f.SendQueue > 0 && f.SendQueue < len(p.sq) {
		return f.SendQueue
	}
	return 0
}

// post posts frames on send queue q, as many as it has room for.
func (p *Provider) post(q int, frames []qp.Frame) (int, error) {
	s := p.sq[q]
	n := min(len(frames), s.depth-len(s.inflight))
	if n <= 0 {
		return 0, nil
	}
	k, err := cPostSend(s.qp, p.buildSends(q, frames[:n]))
	p.posts.Add(1)
	for i := 0; i < k; i++ {
		s.inflight = append(s.inflight, postedFrame{seq: s.seq, handle: frames[i].Handle})
		s.seq++
		if frames[i].MSS > 0 {
			p.tsoPackets.Add(1)
		}
	}
	p.pending += k
	p.txPackets.Add(uint64(k))
	if err != nil {
		err = translate(fmt.Sprintf("verbs %s/%d: post on send queue %d", p.cfg.Interface, p.cfg.Queue, q), err)
		p.fail(err)
		return k, err
	}
	return k, nil
}

// buildSends turns frames into send work requests for queue q: host frames
// from the registered pool (inline when small enough), staged ones from
// device memory, large TCP packets (Frame.MSS) as large sends with the
// device computing checksums, a completion asked for every signalEvery
// requests and at the end of the burst, wr_id = queue and sequence number.
func (p *Provider) buildSends(q int, frames []qp.Frame) []sendWR {
	s := p.sq[q]
	p.wrs = p.wrs[:0]
	for i := range frames {
		f := &frames[i]
		w := sendWR{Len: uint32(len(f.Buf)), WRID: uint64(q)<<wrSeqBits | (s.seq+uint64(i))&(1<<wrSeqBits-1)}
		if f.Handle&dmHandle != 0 && p.dm != nil {
			// Zero-based device memory MR: the address is the offset.
			w.Addr, w.LKey = f.Handle&^dmHandle, p.dm.lkey
		} else {
			w.Addr, w.LKey = uint64(p.base)+f.Handle, p.lkey
			switch {
			case f.MSS > 0:
				w.MSS, w.HdrLen = f.MSS, f.HeaderLen
				w.Flags |= sendIPCsum
			case len(f.Buf) <= p.inline:
				w.Flags |= sendInline
			}
		}
		s.sinceSignal++
		if s.sinceSignal >= signalEvery || i == len(frames)-1 {
			w.Flags |= sendSignaled
			s.sinceSignal = 0
		}
		p.wrs = append(p.wrs, w)
	}
	return p.wrs
}

// Complete implements qp.Provider.
func (p *Provider) Complete() int {
	if p.closed || p.pending == 0 {
		return 0
	}
	done := 0
	for {
		var batch []completion
		if len(p.txStash) > 0 {
			batch = p.txStash
			p.txStash = p.txStash[:0]
		} else {
			k, err := cPoll(p.scq, p.wc, p.ts)
			if err != nil {
				p.fail(translate("poll send completions", err))
				return done
			}
			if k == 0 {
				return done
			}
			batch = p.wc[:k]
		}
		done += p.takeTX(batch)
	}
}

// takeTX retires, for each send completion, its request and every earlier
// one of the same queue (only some requests ask for a completion).
func (p *Provider) takeTX(batch []completion) int {
	done := 0
	for _, c := range batch {
		q := int(c.WRID >> wrSeqBits)
		if q >= len(p.sq) {
			p.txErrors.Add(1)
			continue
		}
		if c.Status != wcSuccess {
			p.txErrors.Add(1)
			if c.Status != wcFlushError {
				p.fail(fmt.Errorf("send queue %d: completion status %d: the QP went to the error state", q, c.Status))
			}
		}
		s := p.sq[q]
		seq := c.WRID & (1<<wrSeqBits - 1)
		i := 0
		for i < len(s.inflight) && (seq-s.inflight[i].seq)&(1<<wrSeqBits-1) < 1<<(wrSeqBits-1) {
			if h := s.inflight[i].handle; h&dmHandle == 0 {
				p.putTX(h)
			} else if p.dm != nil {
				p.dm.released(int(h &^ dmHandle))
			}
			i++
		}
		s.inflight = s.inflight[:copy(s.inflight, s.inflight[i:])]
		p.pending -= i
		done += i
	}
	return done
}

// TXPending implements qp.Provider.
func (p *Provider) TXPending() int { return p.pending }

// Wait implements qp.Provider: it arms both CQs, and sleeps on the
// completion channel, the device's async events and extra.
func (p *Provider) Wait(timeout time.Duration, extra int) (bool, error) {
	if p.closed {
		return false, qp.ErrClosed
	}
	if p.fatal != nil {
		return false, p.fatal
	}
	for _, cq := range []cCQ{p.rcq, p.scq} {
		if err := cArmCQ(cq); err != nil {
			p.fail(translate("arm completion queue", err))
			return false, p.fatal
		}
	}
	// A completion that arrived before the CQs were armed raises no event:
	// look once more, keeping what is found for RXBurst and Complete.
	if len(p.rxStash) == 0 {
		k, err := cPoll(p.rcq, p.wc, p.ts)
		if err != nil {
			p.fail(translate("poll receive completions", err))
			return false, p.fatal
		}
		p.rxStash = append(p.rxStash, p.wc[:k]...)
	}
	if len(p.txStash) == 0 && p.pending > 0 {
		k, err := cPoll(p.scq, p.wc, p.ts)
		if err != nil {
			p.fail(translate("poll send completions", err))
			return false, p.fatal
		}
		p.txStash = append(p.txStash, p.wc[:k]...)
	}
	if len(p.rxStash) > 0 || len(p.txStash) > 0 {
		return false, nil
	}
	// ppoll: the engine sleeps until paced departures, to the microsecond.
	var ts *unix.Timespec
	if timeout >= 0 {
		t := unix.NsecToTimespec(int64(timeout))
		ts = &t
	}
	fds := p.pollFds[:2]
	if extra >= 0 {
		p.pollFds[2] = unix.PollFd{Fd: int32(extra), Events: unix.POLLIN}
		fds = p.pollFds[:3]
	}
	if p.rxPosted == 0 {
		p.noRXBuffer.Add(1)
	}
	if _, err := unix.Ppoll(fds, ts, nil); err != nil && err != unix.EINTR {
		return false, fmt.Errorf("verbs %s/%d: poll: %w", p.cfg.Interface, p.cfg.Queue, err)
	}
	if p.pollFds[0].Revents&unix.POLLIN != 0 {
		if _, err := cDrainEvents(p.ch); err != nil {
			p.fail(translate("read completion events", err))
		}
	}
	if p.pollFds[1].Revents&unix.POLLIN != 0 {
		p.asyncEvents()
	}
	if p.fatal != nil {
		return false, p.fatal
	}
	return extra >= 0 && p.pollFds[2].Revents&unix.POLLIN != 0, nil
}

// asyncEvents reads (and acknowledges) the device's pending async events:
// fatal ones stop the ring; others, such as a port going down and up
// again, need nothing (frames wait for the link like on any NIC).
func (p *Provider) asyncEvents() {
	for {
		t, err := cAsyncEvent(p.ctx)
		if err != nil {
			p.fail(translate("read async events", err))
			return
		}
		if t < 0 {
			return
		}
		switch t {
		case eventQPFatal, eventCQError:
			p.fail(fmt.Errorf("the device reported a fatal queue error (async event %d): reopen the ring", t))
		case eventDeviceFatal:
			p.fail(fmt.Errorf("RDMA device %s reported a fatal error (firmware or PCI fault): %w", p.bind.Device, unix.ENODEV))
		}
	}
}

// fail records the first error that makes the queue unusable; later calls
// report it.
func (p *Provider) fail(err error) {
	if p.fatal == nil {
		p.fatal = fmt.Errorf("verbs %s/%d: %w", p.cfg.Interface, p.cfg.Queue, err)
		p.broken.Store(&p.fatal)
	}
}

// Stats implements qp.Provider. Kicks counts post calls (each rings the
// send doorbell); InvalidDescs counts failed completions; TXTSOPackets
// counts large sends.
func (p *Provider) Stats() qp.Stats {
	return qp.Stats{
		RXPackets:    p.rxPackets.Load(),
		TXPackets:    p.txPackets.Load(),
		FillEmpty:    p.noRXBuffer.Load(),
		TXNoBuffer:   p.txNoBuffer.Load(),
		Kicks:        p.posts.Load(),
		InvalidDescs: p.rxErrors.Load() + p.txErrors.Load(),
		TXTSOPackets: p.tsoPackets.Load(),
	}
}

// SetRateLimit implements qp.RateLimiter: send queue 0 is the main QP, and
// queue k > 0 is a QP of its own, created on first use (up to
// MaxPacedQueues), so that each paced socket is shaped by the device alone.
// A rate of 0 removes the limit.
func (p *Provider) SetRateLimit(sendQueue int, rl qp.RateLimit) error {
	name := fmt.Sprintf("verbs %s/%d: send queue %d", p.cfg.Interface, p.cfg.Queue, sendQueue)
	if p.closed {
		return qp.ErrClosed
	}
	if sendQueue < 0 || sendQueue > p.cfg.MaxPacedQueues {
		return fmt.Errorf("%s: paced send queues are 1..%d: %w", name, p.cfg.MaxPacedQueues, unix.EINVAL)
	}
	if err := checkRateLimit(rl, p.caps.Pacing); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	for len(p.sq) <= sendQueue {
		s, err := p.newSendQueue(p.sizes.PacedWR, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		p.sq = append(p.sq, s)
	}
	err := cRateLimit(p.sq[sendQueue].qp, rl.Kbps, rl.MaxBurst, rl.TypicalBytes)
	if err != nil && errors.Is(err, unix.EINVAL) && (rl.MaxBurst != 0 || rl.TypicalBytes != 0) {
		return fmt.Errorf("%s: set rate %d kbit/s with burst %d bytes, typical packet %d bytes: %w (this device does not take a burst size: set both to 0)",
			name, rl.Kbps, rl.MaxBurst, rl.TypicalBytes, err)
	}
	if err != nil {
		return translate(fmt.Sprintf("%s: set rate %d kbit/s", name, rl.Kbps), err)
	}
	return nil
}

// Close implements qp.Provider.
func (p *Provider) Close() error {
	p.flowMu.Lock()
	if p.closed {
		p.flowMu.Unlock()
		return nil
	}
	p.closed = true
	p.flowMu.Unlock()
	if err := p.release(); err != nil {
		return fmt.Errorf("verbs %s/%d: close: %w", p.cfg.Interface, p.cfg.Queue, err)
	}
	return nil
}

// release frees everything Open created, dependents first: flows, QPs,
// CQs, the channel, memory regions, device memory, the PD, the device.
func (p *Provider) release() error {
	var errs []error
	keep := func(op string, err error) {
		if err != nil {
			errs = append(errs, translate(op, err))
		}
	}
	for f, h := range p.flows {
		keep("destroy flow rule "+f.String(), cDestroyFlow(h))
	}
	clear(p.flows)
	for i, s := range p.sq {
		keep(fmt.Sprintf("destroy send queue %d", i), cDestroyQP(s.qp))
	}
	p.sq = nil
	if p.scq != nil {
		keep("destroy send CQ", cDestroyCQ(p.scq))
		p.scq = nil
	}
	if p.rcq != nil {
		keep("destroy receive CQ", cDestroyCQ(p.rcq))
		p.rcq = nil
	}
	if p.ch != nil {
		keep("destroy completion channel", cDestroyChannel(p.ch))
		p.ch = nil
	}
	if p.mr != nil {
		keep("deregister buffer pool", cDeregMR(p.mr))
		p.mr = nil
	}
	if p.dm != nil {
		keep("release device memory", p.dm.release())
		p.dm = nil
	}
	if p.pool != nil {
		_ = unix.Munmap(p.pool)
		p.pool = nil
	}
	if p.pd != nil {
		keep("free protection domain", cDeallocPD(p.pd))
		p.pd = nil
	}
	p.ctxMu.Lock()
	if p.ctx != nil {
		keep("close RDMA device", cClose(p.ctx))
		p.ctx = nil
	}
	p.ctxMu.Unlock()
	return errors.Join(errs...)
}
