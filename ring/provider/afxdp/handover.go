package afxdp

import (
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Live upgrade: the socket itself moves to a new daemon. The old one hands
// over duplicates of the AF_XDP socket and of the UMEM's memfd with the
// Layout (Handover); the new one maps the same rings and memory (Adopt)
// without binding anything, so the socket never leaves its queue or its
// XSKMAP slot and frames that arrive meanwhile wait in its RX ring. Once
// the old engine stopped, its State (which send buffers are free) goes to
// the new one (SetState), whose engine carries on from the indexes in the
// shared rings.

// Layout is what a new process needs to map a handed-over socket: the
// UMEM's geometry and the mode the socket was bound in. It is JSON in the
// takeover state document.
type Layout struct {
	FrameSize    int  `json:"frame_size"`
	Frames       int  `json:"frames"`
	RingSize     int  `json:"ring_size"`
	RXFrames     int  `json:"rx_frames"`
	MTU          int  `json:"mtu"`
	DeviceMemory int  `json:"device_memory,omitempty"`
	ZeroCopy     bool `json:"zero_copy,omitempty"`
	Multi        bool `json:"multi_buffer,omitempty"`
}

// State is the engine-side bookkeeping of a stopped socket: the free send
// buffers (and, with multi-buffer, each send slot's descriptor count),
// how many posted frames the completion ring still owes, and whether a
// dropped receive chain's rest is still to be skipped.
type State struct {
	Free      []uint64 `json:"free"`
	SlotSegs  []uint8  `json:"slot_segs,omitempty"`
	TXPending int      `json:"tx_pending"`
	RXSkip    bool     `json:"rx_skip,omitempty"`
}

// Handover returns duplicates of the socket's and the UMEM's descriptors
// (the caller's to close) and the socket's layout. The socket keeps
// serving.
func (s *Socket) Handover() (xsk, umem int, l Layout, err error) {
	if s.closed || s.umemFD < 0 {
		return -1, -1, l, fmt.Errorf("afxdp %s queue %d: closed, or its UMEM is not shareable", s.cfg.IfName, s.cfg.Queue)
	}
	if xsk, err = unix.FcntlInt(uintptr(s.fd), unix.F_DUPFD_CLOEXEC, 0); err != nil {
		return -1, -1, l, fmt.Errorf("afxdp %s queue %d: duplicate socket: %w", s.cfg.IfName, s.cfg.Queue, err)
	}
	if umem, err = unix.FcntlInt(uintptr(s.umemFD), unix.F_DUPFD_CLOEXEC, 0); err != nil {
		unix.Close(xsk)
		return -1, -1, l, fmt.Errorf("afxdp %s queue %d: duplicate UMEM: %w", s.cfg.IfName, s.cfg.Queue, err)
	}
	l = Layout{FrameSize: s.cfg.FrameSize, Frames: s.cfg.Frames, RingSize: s.cfg.RingSize, RXFrames: s.rxFrames,
		MTU: s.cfg.MTU, DeviceMemory: s.cfg.DeviceMemory, ZeroCopy: s.zeroCopy, Multi: s.multi}
	return xsk, umem, l, nil
}

// Adopt maps a socket another process handed over (its descriptors xsk
// and umem, owned by the socket from now on, also on error). cfg names the
// interface and queue; the layout overrides cfg's sizes. Nothing is read
// or written in the rings until SetState: the old process may still be
// serving them.
func Adopt(cfg Config, xsk, umem int, l Layout) (_ *Socket, err error) {
	cfg.FrameSize, cfg.Frames, cfg.RingSize, cfg.MTU, cfg.DeviceMemory = l.FrameSize, l.Frames, l.RingSize, l.MTU, l.DeviceMemory
	s := &Socket{fd: xsk, umemFD: umem, zeroCopy: l.ZeroCopy, multi: l.Multi, rxFrames: l.RXFrames}
	defer func() {
		if err != nil {
			_ = s.release()
		}
	}()
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("afxdp %s queue %d: adopt: %w", cfg.IfName, cfg.Queue, err)
	}
	s.cfg = cfg
	if l.Multi != NeedsMultiBuffer(cfg.MTU, cfg.FrameSize) || l.RXFrames <= 0 || l.RXFrames >= cfg.Frames {
		return nil, fmt.Errorf("afxdp %s queue %d: adopt: inconsistent layout %+v", cfg.IfName, cfg.Queue, l)
	}
	s.stageBase = uint64(cfg.Frames * cfg.FrameSize)
	size := (cfg.Frames + stageFrames(cfg.DeviceMemory, cfg.FrameSize)) * cfg.FrameSize
	var st unix.Stat_t
	if err := unix.Fstat(umem, &st); err != nil || st.Size != int64(size) {
		return nil, fmt.Errorf("afxdp %s queue %d: adopt: the UMEM is not the %d bytes its layout says (%v)", cfg.IfName, cfg.Queue, size, err)
	}
	if s.umem, err = unix.Mmap(umem, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE); err != nil {
		return nil, fmt.Errorf("afxdp %s queue %d: adopt: map the UMEM: %w", cfg.IfName, cfg.Queue, err)
	}
	if err := s.mapRings(uint32(cfg.RingSize)); err != nil {
		return nil, fmt.Errorf("afxdp %s queue %d: adopt: %w", cfg.IfName, cfg.Queue, err)
	}
	s.initPools()
	s.pollFds[0] = unix.PollFd{Fd: int32(xsk), Events: unix.POLLIN}
	s.pollFds[1].Fd = -1
	return s, nil
}

// State returns the socket's bookkeeping; the engine driving it must have
// stopped.
func (s *Socket) State() State {
	st := State{Free: append([]uint64(nil), s.free.Offsets()...), TXPending: s.txPending, RXSkip: s.rxSkip}
	if s.multi {
		st.SlotSegs = append([]uint8(nil), s.slotSegs...)
	}
	return st
}

// SetState takes over a stopped socket's bookkeeping and the ring indexes
// as the old process left them; the engine starts after it.
func (s *Socket) SetState(st State) error {
	fs := uint64(s.cfg.FrameSize)
	for _, off := range st.Free {
		if off < s.txBase || off >= s.stageBase || (off-s.txBase)%s.txSlot != 0 {
			return fmt.Errorf("afxdp %s queue %d: handed-over send buffer %d is not one of the UMEM's (%d-byte frames)", s.cfg.IfName, s.cfg.Queue, off, fs)
		}
	}
	if s.multi && len(st.SlotSegs) != len(s.slotSegs) {
		return fmt.Errorf("afxdp %s queue %d: %d send slots handed over, %d here", s.cfg.IfName, s.cfg.Queue, len(st.SlotSegs), len(s.slotSegs))
	}
	s.free.Reset(st.Free)
	copy(s.slotSegs, st.SlotSegs)
	s.txPending, s.rxSkip = st.TXPending, st.RXSkip
	// We produce the fill and TX rings and consume RX and completion:
	// our side's indexes are what the old process published.
	s.fill.cachedProd, s.fill.cachedCons = atomic.LoadUint32(s.fill.producer), atomic.LoadUint32(s.fill.consumer)
	s.tx.cachedProd, s.tx.cachedCons = atomic.LoadUint32(s.tx.producer), atomic.LoadUint32(s.tx.consumer)
	s.rx.cachedCons, s.rx.cachedProd = atomic.LoadUint32(s.rx.consumer), atomic.LoadUint32(s.rx.producer)
	s.comp.cachedCons, s.comp.cachedProd = atomic.LoadUint32(s.comp.consumer), atomic.LoadUint32(s.comp.producer)
	return nil
}
