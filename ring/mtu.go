package ring

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/bypassd/bypassd/ring/provider/afxdp"
)

// The interface MTU at run time. Open reads the MTU once and sizes the
// ring's paths for it (frame size, multi-buffer, the TAP device). An
// `ip link set mtu` later reaches the ring through its route resolver,
// whose link notifications bump the generation; the engine then compares
// the MTU (checkMTU):
//
//   - an MTU the ring's frames still carry (any lower one, or a higher one
//     within Caps.MaxFrame) needs nothing but new header templates, which
//     the generation change rebuilds: datagrams are cut at the new MTU;
//   - a higher MTU than the frames carry, with the TAP fallback (auto):
//     the fast path is declared lost, the flows move to the TAP path, and
//     the watcher re-opens the fast path a second later for the new MTU
//     (a new frame size when it was chosen automatically, multi-buffer
//     chains when needed);
//   - without a fallback the ring cannot re-open alone: it logs an error,
//     keeps sending datagrams cut to what its frames carry (templates
//     never exceed maxMTU), and frames larger than that are dropped on
//     receive (counted by the kernel: XDP_STATISTICS rx_dropped) until
//     bypassd restarts.
//
// Either way no socket breaks silently: the log says what happened and
// what to do.

// maxMTU is the largest MTU the active path's frames carry.
func (r *Ring) maxMTU() int { return r.prov.Caps().MaxFrame - afxdp.FrameOverhead }

// pathSwitched reports whether the ring moved between its fast path and
// its TAP path since the last call: their largest frames differ, so the
// templates are rebuilt.
func (e *engine) pathSwitched() bool {
	fp := e.r.fb.fp
	if fp == nil {
		return false
	}
	n := fp.plugouts.Load() + fp.plugins.Load()
	if n == e.switches {
		return false
	}
	e.switches = n
	return true
}

// checkMTU follows a change of the interface MTU (engine thread, after a
// resolver generation change).
func (e *engine) checkMTU() {
	r := e.r
	now := r.res.LinkMTU()
	if now <= 0 || int64(now) == r.mtu.Load() {
		return
	}
	old := int(r.mtu.Swap(int64(now)))
	max := r.maxMTU()
	fields := []zap.Field{zap.Int("old_mtu", old), zap.Int("mtu", now), zap.Int("ring_max_mtu", max)}
	switch {
	case now <= max:
		r.log.Info("interface MTU changed; datagrams are cut at the new MTU", fields...)
	case r.fb.fp != nil && r.fb.mode == FallbackAuto:
		err := fmt.Errorf("interface MTU raised from %d to %d, more than the fast path's frames carry (MTU %d): re-opening it for the new MTU", old, now, max)
		r.log.Warn("interface MTU above what the ring's frames carry: moving flows to the TAP path and re-opening the fast path", fields...)
		_ = r.fb.fp.fail(err)
	default:
		r.log.Error("interface MTU above what the ring's frames carry: received frames larger than ring_max_mtu are dropped and sent datagrams are cut at it until bypassd restarts; restart it (the frame size follows the MTU unless --frame-size is set), or run with --fallback auto to re-open rings automatically",
			fields...)
	}
}
