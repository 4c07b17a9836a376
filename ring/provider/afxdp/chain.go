package afxdp

import (
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring/qp"
)

// Multi-buffer (AF_XDP XDP_USE_SG, Linux 6.6). A frame larger than one
// chunk travels as a chain of descriptors, each in its own chunk; every
// descriptor but the last carries XDP_PKT_CONTD in its options.
//
// Receive: the kernel copies a frame into chunks of FrameSize-256 bytes
// (the XDP headroom stays free in each), so an MTU-sized frame needs
// rxSegs(MTU) descriptors. RXBurst copies a chain into a linear buffer of
// its own and returns the chunks to the fill ring at once: the engine, the
// TAP and the verbs paths then see one buffer per frame, and a jumbo frame
// costs one extra copy (the engine copies payloads into socket queues
// anyway). A chain longer than the bound, or one with a descriptor outside
// its chunk, is dropped and counted (rx_bad_chains); its descriptors are
// consumed and their chunks refilled, up to the end of the chain, even if
// that end arrives in a later burst, so a malformed or endless chain cannot
// wedge the ring.
//
// Transmit: send buffers are runs of contiguous chunks ("slots") large
// enough for the largest frame, so the engine builds a frame in one
// contiguous buffer and TXBurst only describes it chunk by chunk. The
// completion ring returns every descriptor's address in order; a slot goes
// back to the free list when its last chunk completes.

// maxSegs is the longest chain the kernel builds or accepts: the linear
// part and MAX_SKB_FRAGS-1 (16) fragments in copy-mode transmit
// (xsk_build_skb answers EOVERFLOW beyond it).
const maxSegs = 17

// rxHeadroom is what the kernel leaves free at the start of each receive
// chunk (XDP_PACKET_HEADROOM; our UMEM headroom is 0).
const rxHeadroom = 256

// FrameOverhead is what an Ethernet frame adds to the MTU: the 14-byte
// header and one 802.1Q tag.
const FrameOverhead = 18

// linearHandle marks an RX frame that lives in a linear buffer of the
// socket: its chunks were refilled already, ReleaseRX skips it.
const linearHandle = ^uint64(0)

// chainState is what scanChain found at the head of the RX ring.
type chainState uint8

const (
	// chainOK: a whole frame of n descriptors.
	chainOK chainState = iota
	// chainPartial: the chain's end has not been produced yet; consume
	// nothing, look again next burst.
	chainPartial
	// chainBad: n descriptors to drop. ended reports whether the last of
	// them ends the chain (else the rest of it is skipped as it arrives).
	chainBad
)

// chainScan is the result of scanChain.
type chainScan struct {
	state chainState
	// n is how many descriptors the frame (or the dropped part) spans.
	n uint32
	// length is the frame's total length (chainOK).
	length int
	// ended: the n-th descriptor has no XDP_PKT_CONTD.
	ended bool
}

// chainLimits bounds and validates chains.
type chainLimits struct {
	// maxSegs is the longest acceptable chain.
	maxSegs uint32
	// umem is the UMEM's size, chunk its chunk size: a descriptor must
	// lie within one chunk of the UMEM.
	umem, chunk uint64
}

// validDesc reports whether d lies within one chunk of the UMEM.
func (l chainLimits) validDesc(d *unix.XDPDesc) bool {
	end := d.Addr + uint64(d.Len)
	return end >= d.Addr && end <= l.umem && d.Addr%l.chunk+uint64(d.Len) <= l.chunk
}

// scanChain reads the frame whose first descriptor is descs[cons&mask],
// with avail descriptors produced from there on. It never reads past
// avail, and decides within lim.maxSegs descriptors.
func scanChain(descs []unix.XDPDesc, mask, cons, avail uint32, lim chainLimits) chainScan {
	length := 0
	bad := false
	for i := uint32(0); i < avail; i++ {
		d := &descs[(cons+i)&mask]
		if !lim.validDesc(d) {
			bad = true
		}
		length += int(d.Len)
		last := d.Options&unix.XDP_PKT_CONTD == 0
		switch {
		case last && bad:
			return chainScan{state: chainBad, n: i + 1, ended: true}
		case last:
			return chainScan{state: chainOK, n: i + 1, length: length, ended: true}
		case i+1 >= lim.maxSegs:
			// Longer than any frame we accept: drop what we have
			// seen; the rest is skipped as it comes.
			return chainScan{state: chainBad, n: i + 1}
		}
	}
	return chainScan{state: chainPartial}
}

// segsFor is how many chunks of payload bytes each hold n bytes.
func segsFor(n, payload int) int {
	if n <= 0 {
		return 1
	}
	return (n + payload - 1) / payload
}

// NeedsMultiBuffer reports whether an interface of this MTU needs
// descriptor chains at this frame size: its largest frame does not fit in
// one receive chunk.
func NeedsMultiBuffer(mtu, frameSize int) bool {
	return mtu+FrameOverhead > frameSize-rxHeadroom
}

// MaxSingleBufferMTU is the largest MTU frames of frameSize bytes carry in
// one buffer.
func MaxSingleBufferMTU(frameSize int) int { return frameSize - rxHeadroom - FrameOverhead }

// initPools fills the TX free list: single chunks, or with multi-buffer
// slots of contiguous chunks that hold the largest frame.
func (s *Socket) initPools() {
	fs := uint64(s.cfg.FrameSize)
	s.txBase = uint64(s.rxFrames) * fs
	segs := 1
	if s.multi {
		segs = segsFor(s.cfg.MTU+FrameOverhead, s.cfg.FrameSize)
		rxSegs := segsFor(s.cfg.MTU+FrameOverhead, s.cfg.FrameSize-rxHeadroom)
		s.rxLim = chainLimits{maxSegs: uint32(rxSegs), umem: uint64(len(s.umem)), chunk: fs}
	}
	s.txSlot = uint64(segs) * fs
	slots := (s.cfg.Frames - s.rxFrames) / segs
	s.free = qp.NewTXPool(s.umem, int(s.txSlot), slots)
	if s.multi {
		s.slotSegs = make([]uint8, slots)
	}
	for i := slots - 1; i >= 0; i-- {
		s.free.Put(s.txBase + uint64(i)*s.txSlot)
	}
}

// maxFrame is the largest frame the socket carries (qp.Caps.MaxFrame).
func (s *Socket) maxFrame() int {
	if s.multi {
		return int(s.rxLim.maxSegs) * (s.cfg.FrameSize - rxHeadroom)
	}
	return s.cfg.FrameSize - rxHeadroom
}

// rxChains is RXBurst for a multi-buffer socket: single-descriptor frames
// are lent as they are, chains are linearized and their chunks refilled.
func (s *Socket) rxChains(frames []qp.Frame) int {
	// Always look at the kernel's index: a partial chain at the end of
	// the cached view completes only when the view is refreshed.
	s.rx.cachedProd = atomic.LoadUint32(s.rx.producer)
	cons := s.rx.cachedCons
	avail := s.rx.cachedProd - cons
	if avail == 0 {
		return 0
	}
	var used uint32   // descriptors consumed
	n, chains := 0, 0 // frames produced, of which chains
	var meta, stamped uint64
scan:
	for n < len(frames) && used < avail {
		if s.rxSkip {
			// The tail of a chain dropped in an earlier burst.
			d := &s.rx.descs[(cons+used)&s.rx.mask]
			s.refill(d.Addr)
			used++
			s.rxSkip = d.Options&unix.XDP_PKT_CONTD != 0
			continue
		}
		c := scanChain(s.rx.descs, s.rx.mask, cons+used, avail-used, s.rxLim)
		switch c.state {
		case chainPartial:
			break scan // its end comes with a later burst
		case chainBad:
			for i := uint32(0); i < c.n; i++ {
				s.refill(s.rx.descs[(cons+used+i)&s.rx.mask].Addr)
			}
			used += c.n
			s.rxSkip = !c.ended
			s.rxBadChains.Add(1)
			continue
		}
		// The program's metadata (flow tag, timestamp) sits in front of
		// the first buffer.
		first := s.rx.descs[(cons+used)&s.rx.mask].Addr
		if c.n == 1 {
			l := first + uint64(s.rx.descs[(cons+used)&s.rx.mask].Len)
			frames[n] = qp.Frame{Buf: s.umem[first:l:l], Handle: first}
		} else {
			frames[n] = qp.Frame{Handle: linearHandle}
			chains++
		}
		m, st := s.frameMeta(first, &frames[n])
		meta += m
		stamped += st
		if c.n > 1 {
			frames[n].Buf = s.linearize(n, cons+used, c)
		}
		used += c.n
		n++
	}
	if used == 0 {
		return 0
	}
	s.rx.cachedCons = cons + used
	s.rx.publishConsumer(s.rx.cachedCons)
	s.publishFill()
	s.rxPackets.Add(uint64(n))
	if chains > 0 {
		s.rxChained.Add(uint64(chains))
	}
	s.countMeta(meta, stamped)
	return n
}

// linearize copies the chain c starting at index first into burst slot
// slot's linear buffer and refills its chunks.
func (s *Socket) linearize(slot int, first uint32, c chainScan) []byte {
	for len(s.rxLinear) <= slot {
		s.rxLinear = append(s.rxLinear, make([]byte, s.maxFrame()))
	}
	buf := s.rxLinear[slot][:0]
	for i := uint32(0); i < c.n; i++ {
		d := &s.rx.descs[(first+i)&s.rx.mask]
		buf = append(buf, s.umem[d.Addr:d.Addr+uint64(d.Len)]...)
		s.refill(d.Addr)
	}
	return buf
}

// refill queues one receive chunk for the fill ring (published by
// publishFill). The fill ring has room for every receive chunk.
func (s *Socket) refill(addr uint64) {
	if addr >= uint64(len(s.umem)) {
		return // never one of our chunks
	}
	s.fill.addrs[s.fill.cachedProd&s.fill.mask] = addr &^ uint64(s.cfg.FrameSize-1)
	s.fill.cachedProd++
}

func (s *Socket) publishFill() {
	s.fill.publishProducer(s.fill.cachedProd)
	if s.zeroCopy && s.fill.needWakeup() {
		s.kickRX()
	}
}

// txChains is TXBurst for a multi-buffer socket: each frame, built in a
// slot of contiguous chunks, is posted as one descriptor per chunk it
// covers. Frames are posted whole or not at all.
func (s *Socket) txChains(frames []qp.Frame) (int, error) {
	fs := uint64(s.cfg.FrameSize)
	prod := s.tx.cachedProd
	posted, chains, descs := 0, 0, uint32(0)
	for _, f := range frames {
		l := uint64(len(f.Buf))
		segs := uint32(1)
		if f.Handle < s.stageBase {
			segs = uint32(segsFor(int(l), int(fs)))
		}
		if s.tx.freeSlots(prod+descs, &s.tx.cachedCons, segs) < segs {
			break
		}
		for i := uint32(0); i < segs; i++ {
			d := &s.tx.descs[(prod+descs+i)&s.tx.mask]
			d.Addr = f.Handle + uint64(i)*fs
			d.Len = uint32(min(fs, l-uint64(i)*fs))
			d.Options = unix.XDP_PKT_CONTD
		}
		s.tx.descs[(prod+descs+segs-1)&s.tx.mask].Options = 0
		if f.Handle < s.stageBase {
			s.slotSegs[(f.Handle-s.txBase)/s.txSlot] = uint8(segs)
		}
		descs += segs
		posted++
		if segs > 1 {
			chains++
		}
	}
	s.tx.cachedProd = prod + descs
	s.tx.publishProducer(s.tx.cachedProd)
	s.txPending += int(descs)
	s.txPackets.Add(uint64(posted))
	if chains > 0 {
		s.txChained.Add(uint64(chains))
	}
	return posted, s.kickTX()
}

// completeChunk handles one completed TX chunk of a multi-buffer socket:
// the slot is free again once its last chunk is back.
func (s *Socket) completeChunk(addr uint64) {
	slot := (addr - s.txBase) / s.txSlot
	if slot >= uint64(len(s.slotSegs)) {
		return // not ours; the kernel never returns such an address
	}
	base := s.txBase + slot*s.txSlot
	if (addr-base)/uint64(s.cfg.FrameSize)+1 == uint64(s.slotSegs[slot]) {
		s.free.Put(base)
	}
}

// MultiBufferKernel reports whether the running kernel has multi-buffer
// AF_XDP (XDP_USE_SG, Linux 6.6).
func MultiBufferKernel() bool { return kernelAtLeast(6, 6) }

// kernelAtLeast reports whether the running kernel is at least major.minor.
func kernelAtLeast(major, minor int) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return true // cannot tell: let the kernel answer
	}
	var ma, mi int
	if _, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &ma, &mi); err != nil {
		return true
	}
	return ma > major || ma == major && mi >= minor
}
