package ring

import (
	"fmt"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/bypassd/bypassd/ring/devmem"
	"github.com/bypassd/bypassd/ring/qp"
)

// Egress staging decides WHERE a built frame is sent from: its regular TX
// buffer, or the provider's device memory (on ConnectX the NIC then skips a
// PCI read per packet; with AF_XDP it is a reserved UMEM area, where a
// single-frame datagram is built in place rather than copied).
// It does not decide when a frame leaves; that is the TX path's business.
// Frames at or under the inline threshold and frames the region cannot hold
// (oob) stay in their TX buffer. A provider without qp.DeviceMemory (or a
// ring configured with DevMemTX 0) gets a disabled allocator: zero
// capacity, nothing staged, nothing counted.

// DevMemStats are a ring's egress staging counters.
type DevMemStats struct {
	devmem.Stats
	// ReleaseErrors counts completions for offsets no staged frame was
	// awaiting (completed twice, or never staged), and unposted frames
	// that could not be given back: the provider or the engine lost track
	// of a frame. 0 on a healthy queue.
	ReleaseErrors uint64
}

// DevMemStats returns the ring's staging counters; Capacity is the granted
// region size (0: staging off).
func (r *Ring) DevMemStats() DevMemStats {
	st := &r.eng.stg
	return DevMemStats{Stats: st.mgr.Stats(), ReleaseErrors: st.releaseErrs.Load()}
}

// staging is the engine's staging state; only the engine thread uses mgr
// and region.
type staging struct {
	mgr    *devmem.Manager
	region qp.DeviceRegion
	// mapped: the region is in this process's memory, so single-frame
	// datagrams are built in it directly (allocTX) instead of copied.
	mapped      bool
	releaseErrs atomic.Uint64
	log         *zap.Logger
}

// initStaging asks the provider for cfg.DevMemTX bytes of device memory.
// It runs before the engine starts.
func (e *engine) initStaging() error {
	r, st := e.r, &e.stg
	st.log = r.log
	cfg := devmem.DefaultConfig()
	switch {
	case r.cfg.DevMemInline > 0:
		cfg.InlineThreshold = r.cfg.DevMemInline
	case r.cfg.DevMemInline < 0:
		cfg.InlineThreshold = 0
	}
	// A TAP fallback (Fallback auto or tap) drives the engine through a
	// provider that switches paths at run time and has no device memory of
	// its own: a region of the fast path would outlive a path it replaced
	// (its UMEM unmapped), so staging stays off there.
	dm, ok := r.prov.(qp.DeviceMemory)
	if r.cfg.DevMemTX > 0 && ok && r.prov.Caps().DeviceMemory > 0 {
		reg, err := dm.AllocDeviceMemory(r.cfg.DevMemTX, st.released)
		if err != nil {
			return fmt.Errorf("device memory: %w", err)
		}
		st.region = reg
		if mr, ok := reg.(qp.MappedRegion); ok && mr.Mapped() {
			st.mapped = true
		}
	}
	var reg devmem.Region
	if st.region != nil {
		reg = st.region
	}
	m, err := devmem.New(reg, cfg)
	if err != nil {
		return fmt.Errorf("device memory: %w", err)
	}
	st.mgr = m
	switch {
	case r.cfg.DevMemTX > 0 && m.Capacity() > 0:
		r.log.Info("egress staging", zap.Int("dev_mem_tx_requested", r.cfg.DevMemTX),
			zap.Int("dev_mem_tx_granted", m.Capacity()), zap.Int("inline_threshold", cfg.InlineThreshold),
			zap.String("provider", r.prov.Caps().Provider))
	case r.cfg.DevMemTX > 0:
		why := "the provider has no device memory"
		if r.cfg.Fallback != FallbackNone {
			why = "not available with a TAP fallback (fallback " + r.cfg.Fallback.String() + ")"
		}
		r.log.Warn("egress staging off: "+why, zap.Int("dev_mem_tx_requested", r.cfg.DevMemTX),
			zap.Int("dev_mem_tx_granted", 0), zap.String("provider", r.prov.Caps().Provider))
	}
	return nil
}

// released is the provider's completion callback for staged frames.
func (st *staging) released(off int) {
	if err := st.mgr.Release(off); err != nil {
		if st.releaseErrs.Add(1) == 1 {
			st.log.Warn("completion for a staged frame that was not awaiting one", zap.Error(err))
		}
	}
}

// allocTX takes the send buffers of one datagram of len(dst) frames. With
// a mapped region, a single-frame datagram of frameLen bytes over the inline
// threshold gets its buffer in the region instead: it is built where it is
// staged, with no TX buffer and no copy. Everything else (inline, oob,
// fragments, regions that need a copy) gets TX buffers; stage copies those
// that qualify after they are built.
func (e *engine) allocTX(dst []qp.Frame, frameLen int) int {
	st := &e.stg
	if st.mapped && len(dst) == 1 {
		e.completeIfLow()
		if off, ok := st.mgr.Reserve(frameLen); ok {
			dst[0] = st.region.TXFrame(off, frameLen)
			return 1
		}
	}
	return e.r.prov.AllocTX(dst)
}

// completeIfLow reaps completions when the region runs low, so the space
// comes back before the next frame needs it.
func (e *engine) completeIfLow() {
	if e.stg.mgr.NeedCompletion() {
		e.r.prov.Complete()
	}
}

// stage moves the frames of one datagram that are over the inline threshold
// into device memory, returning their TX buffers to the provider. A
// single-frame datagram with a mapped region was decided by allocTX already.
func (e *engine) stage(frames []qp.Frame) {
	st := &e.stg
	if !st.mgr.Enabled() || st.mapped && len(frames) == 1 {
		return
	}
	e.completeIfLow()
	for i := range frames {
		off, ok := st.mgr.Stage(frames[i].Buf)
		if !ok {
			continue
		}
		sq := frames[i].SendQueue // a paced endpoint's hardware queue
		e.r.prov.FreeTX(frames[i : i+1])
		frames[i] = st.region.TXFrame(off, len(frames[i].Buf))
		frames[i].SendQueue = sq
	}
}

// dropFrames gives back frames that will never be posted: TX buffers to the
// provider, staged frames to the allocator. They are the newest frames, so
// staged ones are cancelled newest first.
func (e *engine) dropFrames(frames []qp.Frame) {
	st := &e.stg
	for i := len(frames) - 1; i >= 0; i-- {
		if st.region != nil {
			if off, ok := st.region.Offset(frames[i]); ok {
				if err := st.mgr.Cancel(off); err != nil {
					st.releaseErrs.Add(1)
					st.log.Warn("cannot give back an unposted staged frame", zap.Error(err))
				}
				continue
			}
		}
		e.r.prov.FreeTX(frames[i : i+1])
	}
}
