package ring

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netns"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/ring/provider/tapfd"
	"github.com/bypassd/bypassd/ring/qp"
	"github.com/bypassd/bypassd/tap"
)

// Fallback selects what a ring does when its fast path (XDP + AF_XDP, or
// another provider's) is unavailable or lost.
type Fallback int

const (
	// FallbackNone: no TAP path; a ring whose provider fails stops with
	// an error.
	FallbackNone Fallback = iota
	// FallbackAuto: a standby TAP path with its tc filters installed is
	// kept ready; the ring switches its flows to it when the fast path is
	// lost (the XDP program detached, the AF_XDP socket failing) and back
	// when the fast path can be opened again. A fast path that cannot be
	// opened at all starts the ring on the TAP path.
	FallbackAuto
	// FallbackTAP: the TAP path only (NICs without XDP). Same as
	// Config.Provider "tap".
	FallbackTAP
)

func (f Fallback) String() string {
	switch f {
	case FallbackNone:
		return "none"
	case FallbackAuto:
		return "auto"
	case FallbackTAP:
		return "tap"
	}
	return fmt.Sprintf("fallback(%d)", int(f))
}

// ParseFallback reads "none", "auto" or "tap".
func ParseFallback(s string) (Fallback, error) {
	switch strings.ToLower(s) {
	case "none":
		return FallbackNone, nil
	case "auto":
		return FallbackAuto, nil
	case "tap":
		return FallbackTAP, nil
	}
	return 0, fmt.Errorf("fallback %q: use none, auto or tap", s)
}

// Timing of the fallback watcher. It sleeps in poll(2) on the standby TAP's
// descriptor: with the TAP's filters installed, the first frame of an
// offloaded flow that XDP no longer takes lands there and wakes it at once,
// so losing the fast path under traffic is noticed within microseconds and
// an idle ring costs nothing. checkEvery is its safety net (is the NIC still
// there, is the fast path healthy) when nothing happens.
const (
	checkEvery = time.Second
	// restoreDelay is how long the ring stays on the TAP path before it
	// tries to open the fast path again, and the first retry interval
	// (doubling up to restoreMaxDelay while it fails).
	restoreDelay    = time.Second
	restoreMaxDelay = 10 * time.Second
	// drainWindow is how long after a switch the engine still reads the
	// path it left, for frames that were already queued there.
	drainWindow = 200 * time.Millisecond
)

// FallbackStats are a ring's fallback counters (VMA's TAP and VF plug-out
// lines).
type FallbackStats struct {
	// Mode is the configured fallback.
	Mode Fallback
	// OnTAP reports whether the TAP path carries the flows now.
	OnTAP bool
	// Plugouts counts switches to the TAP path, Plugins switches back.
	Plugouts, Plugins uint64
	// TAPFD and TAPIfindex identify the TAP (-1 and 0 without one).
	TAPFD, TAPIfindex int
	// TAPName is the TAP device's name ("" without one).
	TAPName string
	// RX/TX packets and bytes moved through the TAP.
	RXPackets, RXBytes, TXPackets, TXBytes uint64
	// TXDropped counts frames built for the lost fast path and dropped
	// at the switch.
	TXDropped uint64
}

// fallbackState is the ring's paths: the fast path (prim) and the TAP path
// (standby), either of which may be absent.
type fallbackState struct {
	mode Fallback
	// prim is changed under Ring.mu (so no flow is added meanwhile) and
	// read without it (the engine uses fp's copy).
	prim    atomic.Pointer[path]
	standby *path
	tapProv *tapfd.Provider
	tapDev  *tap.Device
	fp      *fallbackProvider
	pc      qp.PathConfig
	name    string // the fast path's provider name
	// wake interrupts the watcher's poll (the engine's fast path failed,
	// or the ring closes); done is closed when the watcher returned.
	wake *shmq.Waiter
	done chan struct{}
	// closed is set when the paths are closed.
	closed atomic.Bool
}

// openPaths opens the ring's paths for cfg's provider and fallback, and
// sets r.prov to what the engine drives.
func (r *Ring) openPaths(pc qp.PathConfig) (err error) {
	fs := &r.fb
	fs.mode, fs.pc, fs.name = r.cfg.Fallback, pc, r.cfg.Provider
	if fs.name == tapfd.Name {
		fs.mode = FallbackTAP
	}
	// Leftovers of a dead daemon's TAP path redirect to a TAP that is
	// gone: they would drop fragments and, after a fast path loss, flows.
	// Whatever the fallback, they go (a foreign or live owner's objects
	// are refused, and fail a TAP path below).
	if pc.AdoptPath != nil {
		// The old daemon, alive, still owns what is on the interface.
	} else if n, err := tap.Sweep(pc.NS, pc.Ifindex); err != nil {
		r.log.Warn("cannot remove TAP fallback filters found on the interface", zap.Error(err))
	} else if n > 0 {
		r.log.Info("removed a dead daemon's TAP fallback filters", zap.Int("classifiers", n))
	}
	if fs.mode != FallbackTAP {
		p, err := openPath(fs.name, pc)
		switch {
		case err == nil:
			fs.prim.Store(&p)
		case fs.mode == FallbackNone:
			return fmt.Errorf("%s: %w", fs.name, err)
		default:
			r.log.Warn("fast path unavailable: starting on the TAP path", zap.String("provider", fs.name), zap.Error(err))
		}
	}
	if fs.mode == FallbackNone {
		r.prov = fs.prim.Load().prov
		return nil
	}
	p, err := openPath(tapfd.Name, pc)
	if err != nil {
		return fmt.Errorf("TAP path: %w", err)
	}
	fs.standby = &p
	fs.tapProv = p.prov.(*tapfd.Provider)
	fs.tapDev = fs.tapProv.Device()
	var prim qp.Provider
	if fast := fs.prim.Load(); fast != nil {
		prim = fast.prov
		// (An adopted TAP path gets its steering at Activate.)
		if err := setStandby(p.steer); err != nil {
			return fmt.Errorf("TAP path: %w", err)
		}
	}
	if fs.wake, err = shmq.NewWaiter(); err != nil {
		return fmt.Errorf("path watcher: %w", err)
	}
	fs.fp = newFallbackProvider(prim, p.prov, r)
	r.prov = fs.fp
	return nil
}

// setStandby makes a TAP path's steering a standby's: flows filtered to
// the TAP, fragments left to XDP (nil: no steering yet).
func setStandby(steer qp.Steering) error {
	if steer == nil {
		return nil
	}
	return steer.(*tap.Steering).SetActive(false)
}

// startWatch starts the path watcher of a ring with a TAP path.
func (r *Ring) startWatch() {
	if r.fb.fp == nil {
		return
	}
	r.fb.done = make(chan struct{})
	go r.watch()
}

// stopWatch ends the watcher (the ring's context is cancelled already) and
// waits for it.
func (r *Ring) stopWatch() {
	if r.fb.done == nil {
		return
	}
	_ = r.fb.wake.Wake()
	<-r.fb.done
}

// closePaths closes both paths (after the engine and the watcher stopped).
// Readers of a closed ring (stats of a daemon whose ring lost its
// interface) then see no steering.
func (r *Ring) closePaths() error {
	r.fb.closed.Store(true)
	var errs []error
	if p := r.fb.prim.Swap(nil); p != nil {
		errs = append(errs, p.close())
	}
	if r.fb.standby != nil {
		errs = append(errs, r.fb.standby.close())
	}
	if r.fb.wake != nil {
		errs = append(errs, r.fb.wake.Close())
	}
	return errors.Join(errs...)
}

// steerings lists the steerings flows must be added to. Holds r.mu.
func (r *Ring) steeringsLocked() []qp.Steering {
	var out []qp.Steering
	if p := r.fb.prim.Load(); p != nil {
		out = append(out, p.steer)
	}
	if r.fb.standby != nil && !r.standbyDeferred {
		out = append(out, r.fb.standby.steer)
	}
	return out
}

// mainSteering is the steering Flows and Program report: the fast path's,
// or the TAP's without one; nil once the ring closed.
func (r *Ring) mainSteering() qp.Steering {
	if r.fb.closed.Load() {
		return nil
	}
	if p := r.fb.prim.Load(); p != nil {
		return p.steer
	}
	return r.fb.standby.steer
}

// FallbackStats returns the ring's fallback counters.
func (r *Ring) FallbackStats() FallbackStats {
	fs := &r.fb
	st := FallbackStats{Mode: fs.mode, TAPFD: -1, OnTAP: fs.mode == FallbackTAP}
	if fs.tapProv != nil {
		st.TAPFD, st.TAPIfindex, st.TAPName = fs.tapDev.FD(), fs.tapDev.Ifindex(), fs.tapDev.Name()
		ps := fs.tapProv.Stats()
		st.RXPackets, st.TXPackets = ps.RXPackets, ps.TXPackets
		st.RXBytes, st.TXBytes = fs.tapProv.Bytes()
	}
	if fp := fs.fp; fp != nil {
		st.OnTAP = fp.onTAP.Load()
		st.Plugouts, st.Plugins, st.TXDropped = fp.plugouts.Load(), fp.plugins.Load(), fp.txDropped.Load()
	}
	return st
}

// watch is the auto fallback's watcher: it checks the fast path's health
// every healthEvery, asks the engine to switch to the TAP path when it is
// lost, closes the lost path and reopens it (after restoreDelay, retrying
// with backoff), then asks the engine to switch back.
func (r *Ring) watch() {
	defer close(r.fb.done)
	fs, fp := &r.fb, r.fb.fp
	retry := restoreDelay
	lost := fp.wantTAP.Load() // the fast path did not even open
	var lostAt time.Time
	var pfd [2]unix.PollFd
	for r.ctx.Err() == nil {
		timeout := checkEvery
		pfd[0] = unix.PollFd{Fd: int32(fs.wake.FD()), Events: unix.POLLIN}
		fds := pfd[:1]
		switch {
		case fs.mode == FallbackTAP:
			// Nothing to restore: only the NIC vanishing matters.
		case lost:
			timeout = min(max(retry-time.Since(lostAt), 0), checkEvery)
		default:
			pfd[1] = unix.PollFd{Fd: int32(fs.tapDev.FD()), Events: unix.POLLIN}
			fds = pfd[:2]
		}
		if _, err := unix.Poll(fds, int(timeout/time.Millisecond)); err != nil && err != unix.EINTR {
			r.log.Warn("path watcher: poll failed", zap.Error(err))
			time.Sleep(10 * time.Millisecond)
		}
		if pfd[0].Revents&unix.POLLIN != 0 {
			drainEventfd(fs.wake.FD())
		}
		if r.ctx.Err() != nil || r.nicGone() {
			return
		}
		switch {
		case fs.mode == FallbackTAP:
			// Nothing to restore: only the NIC vanishing matters.
		case !lost:
			var why error
			if p := fp.primErr.Load(); p != nil {
				why = *p
			} else if prim := fs.prim.Load(); prim != nil {
				why = prim.steer.Healthy()
			}
			if why != nil {
				r.plugOut(why)
				lost, lostAt, retry = true, time.Now(), restoreDelay
			} else if len(fds) > 1 && pfd[1].Revents&unix.POLLIN != 0 {
				// A flow's frame reached the TAP although the fast path
				// is fine (XDP had no socket for it a moment): the engine
				// delivers it, and the watcher lets it do so before
				// polling the TAP again.
				fp.drainReq.Store(true)
				_ = r.doorbell.Wake()
				time.Sleep(time.Millisecond)
			}
		case time.Since(lostAt) >= retry:
			if err := r.restore(); err != nil {
				r.log.Debug("fast path not restored yet", zap.Error(err), zap.Duration("retry_in", retry))
				lostAt = time.Now()
				retry = min(2*retry, restoreMaxDelay)
				continue
			}
			lost = false
		}
	}
}

// nicGone reports whether the ring's interface vanished. The TAP path
// cannot serve a NIC that is gone, so the engine is told to stop with that
// error, as without a fallback (the daemon then tells its clients).
func (r *Ring) nicGone() bool {
	if _, err := r.nl.LinkByIndex(r.ifindex); err == nil {
		return false
	}
	err := fmt.Errorf("interface %s is gone (ifindex %d): %w", r.cfg.Interface, r.ifindex, unix.ENODEV)
	r.fb.fp.fatal.Store(&err)
	r.doorbell.Wake()
	return true
}

// plugOut moves the flows to the TAP path: fragments to the TAP, then the
// engine switches at its next iteration (woken by the doorbell).
func (r *Ring) plugOut(why error) {
	fp := r.fb.fp
	if err := r.fb.standby.steer.(*tap.Steering).SetActive(true); err != nil {
		r.log.Warn("TAP path: cannot steer fragments", zap.Error(err))
	}
	fp.wantTAP.Store(true)
	r.doorbell.Wake()
	r.log.Warn("fast path lost: flows moved to the TAP path", zap.Error(why), zap.String("tap", r.fb.tapDev.Name()))
}

// restore closes the lost fast path, opens it again with every flow and
// switches the engine back to it.
func (r *Ring) restore() error {
	fs, fp := &r.fb, r.fb.fp
	// The engine lets go of the old provider first (it may still hold
	// its frames for a moment); then it can be closed, which frees its
	// queue for the new one.
	if !fp.releasePrim() {
		return errRingClosed
	}
	r.mu.Lock()
	old := fs.prim.Swap(nil)
	r.mu.Unlock()
	if old != nil {
		if err := old.close(); err != nil {
			r.log.Debug("closing the lost fast path", zap.Error(err))
		}
	}
	// The interface's MTU may have changed since the path was opened
	// (the reason it was lost, mtu.go): open it for the MTU of now.
	fs.pc.MTU = r.MTU()
	if r.frameAuto {
		fs.pc.FrameSize = DefaultFrameSize(fs.pc.MTU)
	}
	var p path
	err := inNS(r.ns, func() error {
		var err error
		p, err = openPath(fs.name, fs.pc)
		return err
	})
	if err != nil {
		return err
	}
	r.mu.Lock()
	for f := range r.flowRefs {
		if err := p.steer.AddFlow(f); err != nil {
			r.mu.Unlock()
			_ = p.close()
			return fmt.Errorf("steer %v: %w", f, err)
		}
	}
	fs.prim.Store(&p)
	r.mu.Unlock()
	fp.primErr.Store(nil)
	fp.newPrim.Store(&p)
	fp.wantTAP.Store(false)
	r.doorbell.Wake()
	// Fragments back to the fast path once the engine switched.
	for fp.onTAP.Load() && r.ctx.Err() == nil {
		time.Sleep(100 * time.Microsecond)
	}
	if err := fs.standby.steer.(*tap.Steering).SetActive(false); err != nil {
		r.log.Warn("TAP path: cannot release fragments", zap.Error(err))
	}
	r.log.Info("fast path restored: flows moved back from the TAP path", zap.String("provider", fs.name))
	return nil
}

// inNS runs fn on a thread in ns (netns.None(): this process's namespace).
func inNS(ns netns.NsHandle, fn func() error) error {
	if !ns.IsOpen() {
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		// The thread ends with the goroutine (still locked), so no other
		// goroutine ever runs in ns by accident.
		runtime.LockOSThread()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter the ring's network namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// fallbackProvider is the qp.Provider the engine drives when the ring has a
// TAP path: the fast path's provider (prim) while it works, the TAP's
// otherwise (always, with FallbackTAP). It switches only on the engine's thread, at the start of a
// receive burst, and keeps the two providers' buffers apart by tagging the
// TAP's frame handles with tapTag.
type fallbackProvider struct {
	r   *Ring
	tap qp.Provider
	// Engine-owned.
	prim   qp.Provider
	onPrim bool
	// rxOut and txOut count the fast path's frames the engine holds.
	rxOut, txOut int
	drainUntil   time.Time
	scratchA     []qp.Frame
	scratchB     []qp.Frame

	// Set by the watcher (or the engine on a provider error), applied by
	// the engine.
	wantTAP atomic.Bool
	// drainReq asks for a drain window on the TAP while on the fast path.
	drainReq atomic.Bool
	newPrim  atomic.Pointer[path]
	dropReq  atomic.Bool
	dropped  chan struct{}
	// primErr is why the fast path's provider failed; fatal, set by the
	// watcher, stops the engine (the interface is gone).
	primErr, fatal atomic.Pointer[error]

	onTAP atomic.Bool
	// caps are the active provider's, for readers on other goroutines.
	caps                         atomic.Pointer[qp.Caps]
	plugouts, plugins, txDropped atomic.Uint64
}

const tapTag = 1 << 63

func newFallbackProvider(prim, tapP qp.Provider, r *Ring) *fallbackProvider {
	fp := &fallbackProvider{r: r, prim: prim, tap: tapP, onPrim: prim != nil, dropped: make(chan struct{}, 1)}
	fp.wantTAP.Store(prim == nil)
	fp.onTAP.Store(prim == nil)
	fp.setCaps()
	return fp
}

func (fp *fallbackProvider) setCaps() {
	c := fp.active().Caps()
	fp.caps.Store(&c)
}

// releasePrim asks the engine to let go of the fast path's provider and
// reports whether it did (false: the ring is closing).
func (fp *fallbackProvider) releasePrim() bool {
	fp.dropReq.Store(true)
	fp.r.doorbell.Wake()
	select {
	case <-fp.dropped:
		return true
	case <-fp.r.ctx.Done():
		return false
	case <-fp.r.done:
		return false
	}
}

// apply carries out what the watcher asked for. Engine thread.
func (fp *fallbackProvider) apply() {
	if fp.drainReq.Load() && fp.drainReq.Swap(false) {
		fp.drainUntil = time.Now().Add(drainWindow)
	}
	if fp.dropReq.Load() && fp.txOut == 0 && fp.rxOut == 0 && !fp.onPrim {
		fp.dropReq.Store(false)
		fp.prim = nil
		select {
		case fp.dropped <- struct{}{}:
		default: // a signal is pending already
		}
	}
	if p := fp.newPrim.Load(); p != nil && fp.prim == nil {
		fp.newPrim.Store(nil)
		fp.prim = p.prov
	}
	want := fp.wantTAP.Load()
	if want == !fp.onPrim || (!want && fp.prim == nil) {
		return
	}
	fp.onPrim = !want
	fp.onTAP.Store(want)
	fp.setCaps()
	if want {
		fp.plugouts.Add(1)
	} else {
		fp.plugins.Add(1)
	}
	fp.drainUntil = time.Now().Add(drainWindow)
}

// fail records a fast-path provider error and switches to the TAP path at
// once (engine thread). A vanished interface is not something the TAP path
// can serve: then the error stays fatal.
func (fp *fallbackProvider) fail(err error) error {
	if _, lerr := fp.r.nl.LinkByIndex(fp.r.ifindex); lerr != nil {
		return err
	}
	if fp.primErr.Load() == nil {
		fp.primErr.Store(&err)
	}
	fp.wantTAP.Store(true)
	fp.apply()
	_ = fp.r.fb.wake.Wake() // the watcher logs it and arms the TAP path
	return nil
}

func (fp *fallbackProvider) active() qp.Provider {
	if fp.onPrim {
		return fp.prim
	}
	return fp.tap
}

// Caps are the active provider's.
func (fp *fallbackProvider) Caps() qp.Caps { return *fp.caps.Load() }

func (fp *fallbackProvider) rxFrom(p qp.Provider, frames []qp.Frame) int {
	n := p.RXBurst(frames)
	if p == fp.tap {
		for i := range frames[:n] {
			frames[i].Handle |= tapTag
		}
	} else {
		fp.rxOut += n
	}
	return n
}

// RXBurst reads the active path. Right after a switch it first empties the
// path it left (those frames are older), until that path has nothing left
// or drainWindow passed.
func (fp *fallbackProvider) RXBurst(frames []qp.Frame) int {
	fp.apply()
	act := fp.active()
	n := 0
	if !fp.drainUntil.IsZero() {
		other := fp.other(act)
		if other != nil {
			n = fp.rxFrom(other, frames)
		}
		if n == 0 || time.Now().After(fp.drainUntil) {
			fp.drainUntil = time.Time{}
		}
	}
	return n + fp.rxFrom(act, frames[n:])
}

func (fp *fallbackProvider) other(act qp.Provider) qp.Provider {
	if act == fp.tap {
		return fp.prim
	}
	return fp.tap
}

// split sorts frames into the TAP's (untagged) and the fast path's.
func (fp *fallbackProvider) split(frames []qp.Frame) (tapF, primF []qp.Frame) {
	fp.scratchA, fp.scratchB = fp.scratchA[:0], fp.scratchB[:0]
	for _, f := range frames {
		if f.Handle&tapTag != 0 {
			f.Handle &^= tapTag
			fp.scratchA = append(fp.scratchA, f)
		} else {
			fp.scratchB = append(fp.scratchB, f)
		}
	}
	return fp.scratchA, fp.scratchB
}

func (fp *fallbackProvider) ReleaseRX(frames []qp.Frame) {
	t, p := fp.split(frames)
	if len(t) > 0 {
		fp.tap.ReleaseRX(t)
	}
	if len(p) > 0 {
		fp.prim.ReleaseRX(p)
		fp.rxOut -= len(p)
	}
}

func (fp *fallbackProvider) AllocTX(frames []qp.Frame) int {
	act := fp.active()
	n := act.AllocTX(frames)
	if act == fp.tap {
		for i := range frames[:n] {
			frames[i].Handle |= tapTag
		}
	} else {
		fp.txOut += n
	}
	return n
}

// AllocTSO takes a large-packet buffer from the fast path when its device
// segments in hardware (qp.Segmenter); on the TAP the engine cuts large
// packets in software.
func (fp *fallbackProvider) AllocTSO(f *qp.Frame, size, hdr int) bool {
	act := fp.active()
	s, ok := act.(qp.Segmenter)
	if act == fp.tap || !ok || !s.AllocTSO(f, size, hdr) {
		return false
	}
	fp.txOut++
	return true
}

func (fp *fallbackProvider) FreeTX(frames []qp.Frame) {
	t, p := fp.split(frames)
	if len(t) > 0 {
		fp.tap.FreeTX(t)
	}
	if len(p) > 0 {
		fp.prim.FreeTX(p)
		fp.txOut -= len(p)
	}
}

// TXBurst posts runs of frames to their provider. Frames built for the fast
// path after the engine left it are dropped (counted in TXDropped).
func (fp *fallbackProvider) TXBurst(frames []qp.Frame) (int, error) {
	if p := fp.fatal.Load(); p != nil {
		return 0, *p
	}
	total := 0
	for total < len(frames) {
		isTAP := frames[total].Handle&tapTag != 0
		end := total + 1
		for end < len(frames) && (frames[end].Handle&tapTag != 0) == isTAP {
			end++
		}
		run := frames[total:end]
		switch {
		case isTAP:
			t, _ := fp.split(run)
			n, err := fp.tap.TXBurst(t)
			total += n
			if n < len(run) || err != nil {
				return total, err
			}
		case fp.onPrim:
			n, err := fp.prim.TXBurst(run)
			fp.txOut -= n
			total += n
			if err != nil && !errors.Is(err, unix.ENETDOWN) {
				if ferr := fp.fail(err); ferr != nil {
					return total, ferr
				}
				// The rest is dropped by the engine like a link down.
				return total, fmt.Errorf("%w: %w", unix.ENETDOWN, err)
			}
			if n < len(run) || err != nil {
				return total, err
			}
		default:
			fp.prim.FreeTX(run)
			fp.txOut -= len(run)
			fp.txDropped.Add(uint64(len(run)))
			total += len(run)
		}
	}
	return total, nil
}

func (fp *fallbackProvider) Complete() int {
	if fp.onPrim && fp.prim.TXPending() > 0 {
		return fp.prim.Complete()
	}
	return 0
}

// TXPending counts only the active path: a lost fast path's completions
// may never come, and its buffers are not used again.
func (fp *fallbackProvider) TXPending() int {
	if fp.onPrim {
		return fp.prim.TXPending()
	}
	return 0
}

func (fp *fallbackProvider) Wait(timeout time.Duration, extra int) (bool, error) {
	if p := fp.fatal.Load(); p != nil {
		return false, *p
	}
	act := fp.active()
	ok, err := act.Wait(timeout, extra)
	if err != nil && act != fp.tap {
		return ok, fp.fail(err)
	}
	return ok, err
}

// FD is the TAP's descriptor, the one that stays for the ring's life (the
// fast path's steering was given its own descriptor when it opened).
func (fp *fallbackProvider) FD() int { return fp.tap.FD() }

// Stats adds both paths' counters.
func (fp *fallbackProvider) Stats() qp.Stats {
	st := fp.tap.Stats()
	if prim := fp.r.fb.prim.Load(); prim != nil {
		ps := prim.prov.Stats()
		st.RXPackets += ps.RXPackets
		st.TXPackets += ps.TXPackets
		st.RXDropped += ps.RXDropped
		st.FillEmpty += ps.FillEmpty
		st.TXNoBuffer += ps.TXNoBuffer
		st.Kicks += ps.Kicks
		st.InvalidDescs += ps.InvalidDescs
		st.RXBadChains += ps.RXBadChains
		st.RXChains += ps.RXChains
		st.TXChains += ps.TXChains
		st.TXTSOPackets += ps.TXTSOPackets
	}
	return st
}

// Close does nothing: the ring closes the paths themselves.
func (fp *fallbackProvider) Close() error { return nil }
