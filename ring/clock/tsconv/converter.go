package tsconv

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Config tunes a Converter. The zero value gives the documented defaults.
type Config struct {
	// NominalHz is the hardware clock's nominal tick rate (1e9 for a PHC,
	// which counts nanoseconds). Raw mode divides by it; sync mode uses it
	// until the first frequency estimate.
	NominalHz uint64
	// Warmup lists the early re-estimation times after the first sample
	// (default 100 ms and 200 ms): a quick first frequency estimate.
	Warmup []time.Duration
	// Interval is the steady re-estimation period (default 1 s); steady
	// updates fall on whole multiples of it after the first sample.
	Interval time.Duration
	// SamplesPerUpdate is how many bracketed samples one update takes
	// and intersects into one tight bracket (default 16; a PHC's
	// PTP_SYS_OFFSET_EXTENDED allows up to 25 in one ioctl).
	SamplesPerUpdate int
	// Window is how many kept points (one per update) the frequency fit
	// uses (default 3). Longer averages out sampling noise, shorter
	// follows frequency wander faster: with 1 s updates a linear fit
	// lags a wandering frequency by about (Window-1)/2 s.
	Window int
	// StepThreshold is the prediction error beyond which an update is
	// treated as a clock step, in addition to the bracket widths and the
	// drift allowance (default 2 µs).
	StepThreshold time.Duration
	// MaxPPM bounds the deviation from NominalHz assumed before the first
	// frequency estimate, for step detection and the error estimate
	// (default 500 ppm).
	MaxPPM float64

	// Now and After drive Run; tests inject simulated time. Defaults are
	// time.Now and time.After.
	Now   func() time.Time
	After func(time.Duration) <-chan time.Time
	// OnError receives Run's update errors (the daemon logs them); Run
	// keeps going with the last good parameters.
	OnError func(error)
}

func (c Config) withDefaults() (Config, error) {
	if c.NominalHz == 0 {
		c.NominalHz = 1e9
	}
	if c.Warmup == nil {
		c.Warmup = []time.Duration{100 * time.Millisecond, 200 * time.Millisecond}
	}
	for i, w := range c.Warmup {
		if w <= 0 || (i > 0 && w <= c.Warmup[i-1]) {
			return c, fmt.Errorf("tsconv: warmup times must be positive and increasing, got %v", c.Warmup)
		}
	}
	if c.Interval == 0 {
		c.Interval = time.Second
	}
	if c.Interval < 0 {
		return c, fmt.Errorf("tsconv: update interval %v must be positive", c.Interval)
	}
	if c.SamplesPerUpdate == 0 {
		c.SamplesPerUpdate = 16
	}
	if c.SamplesPerUpdate < 0 || c.SamplesPerUpdate > 1024 {
		return c, fmt.Errorf("tsconv: samples per update %d out of range 1..1024", c.SamplesPerUpdate)
	}
	if c.Window == 0 {
		c.Window = 3
	}
	if c.Window < 2 || c.Window > 64 {
		return c, fmt.Errorf("tsconv: fit window %d out of range 2..64", c.Window)
	}
	if c.StepThreshold == 0 {
		c.StepThreshold = 2 * time.Microsecond
	}
	if c.StepThreshold < 0 {
		return c, fmt.Errorf("tsconv: step threshold %v must be positive", c.StepThreshold)
	}
	if c.MaxPPM == 0 {
		c.MaxPPM = 500
	}
	if !(c.MaxPPM > 0 && c.MaxPPM < 1e5) {
		return c, fmt.Errorf("tsconv: max ppm %v out of range (0, 100000)", c.MaxPPM)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.After == nil {
		c.After = time.After
	}
	return c, nil
}

// Params is one immutable parameter set of sync mode: system time =
// SysRef + (HW - HWRef) × NsPerTick.
type Params struct {
	HWRef     uint64
	SysRef    int64
	NsPerTick float64
	// ErrorNs is the estimated conversion error bound until the next
	// update (see Converter.EstimatedErrorNs).
	ErrorNs int64
	// Updates counts successful updates; Steps counts detected clock
	// steps (hardware or system) that restarted the fit.
	Updates uint64
	Steps   uint64
}

// Convert maps a hardware tick count with these parameters. The counter
// difference is taken modulo 2^64, so a wrapping counter converts across
// the wrap.
func (p *Params) Convert(hw uint64) (int64, bool) {
	d := int64(hw - p.HWRef)
	f := float64(d) * p.NsPerTick
	// Far outside the range a receive timestamp can have: refuse rather
	// than overflow.
	if f > 4e18 || f < -4e18 {
		return 0, false
	}
	s := p.SysRef + int64(math.Round(f))
	if s < 0 {
		return 0, false
	}
	return s, true
}

// point is one kept (tightest-bracket) sample: the bracket midpoint and
// its half width.
type point struct {
	hw   uint64
	sys  int64
	half int64
}

// Converter converts hardware timestamps in one fixed mode. Convert and the
// other readers are safe for concurrent use and never block; Update and Run
// serialise among themselves.
type Converter struct {
	mode  Mode
	clock Clock
	cfg   Config

	p atomic.Pointer[Params]

	mu      sync.Mutex // serialises Update; guards the fields below
	started bool
	start   time.Time
	next    time.Time
	sched   int // index of the next scheduled update
	points  []point
	rate    float64 // ns per tick, last estimate
	rated   bool    // rate comes from a fit, not NominalHz
	lastRes int64   // |prediction error| at the last non-step update
	batch   []Sample
}

// New returns a Converter for mode. ModeBest resolves here: sync with a
// clock, raw without. ModeSync needs a clock; use Resolve to fall back.
// ModeDisable, ModeRaw and ModePTP ignore the clock.
func New(mode Mode, clock Clock, cfg Config) (*Converter, error) {
	if !mode.Valid() {
		return nil, fmt.Errorf("tsconv: unknown conversion mode %d: use 0..4", int(mode))
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if mode == ModeBest {
		mode = ModeRaw
		if clock != nil {
			mode = ModeSync
		}
	}
	if mode == ModeSync && clock == nil {
		return nil, errors.New("tsconv: mode sync needs a hardware clock to sample; pass one, or pick the mode with Resolve (it falls back to disable) or use mode raw")
	}
	c := &Converter{
		mode:  mode,
		clock: clock,
		cfg:   cfg,
		rate:  1e9 / float64(cfg.NominalHz),
		batch: make([]Sample, cfg.SamplesPerUpdate),
	}
	return c, nil
}

// Mode returns the effective mode (ModeBest already resolved).
func (c *Converter) Mode() Mode { return c.mode }

// Convert returns the system time in nanoseconds since the epoch for a
// hardware tick count, and false when there is no valid conversion: mode
// disable, sync mode before the first sample, or a value out of range.
// Raw mode returns the hardware time scale in nanoseconds; PTP mode returns
// hw unchanged.
func (c *Converter) Convert(hw uint64) (int64, bool) {
	switch c.mode {
	case ModeSync:
		p := c.p.Load()
		if p == nil {
			return 0, false
		}
		return p.Convert(hw)
	case ModeRaw:
		return rawNs(hw, c.cfg.NominalHz)
	case ModePTP:
		if hw > math.MaxInt64 {
			return 0, false
		}
		return int64(hw), true
	default:
		return 0, false
	}
}

// Snapshot returns the current sync-mode parameters, or false when there
// are none (not sync mode, or no sample yet). The values are one
// consistent set.
func (c *Converter) Snapshot() (Params, bool) {
	p := c.p.Load()
	if p == nil {
		return Params{}, false
	}
	return *p, true
}

// EstimatedErrorNs returns the estimated conversion error in nanoseconds
// for a gauge, and whether the mode has a meaningful estimate. In sync mode
// it is the half width of the last kept bracket plus the prediction error
// observed at the last update (before the first frequency fit: plus the
// MaxPPM allowance over the coming interval). Raw and disable have no
// relation to system time; PTP mode's error is ptp4l's, not known here.
func (c *Converter) EstimatedErrorNs() (int64, bool) {
	if c.mode != ModeSync {
		return 0, false
	}
	p := c.p.Load()
	if p == nil {
		return 0, false
	}
	return p.ErrorNs, true
}

// Next returns when the next update is due (zero before the first one).
func (c *Converter) Next() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.next
}

// Update re-estimates the sync-mode parameters if an update is due at now:
// the first call always samples (and starts the schedule), later calls
// sample at the warmup times and then every Interval, and return nil
// without sampling in between. In other modes it does nothing. On error
// the previous parameters stay in use and the schedule moves on.
func (c *Converter) Update(now time.Time) error {
	if c.mode != ModeSync {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.started && now.Before(c.next) {
		return nil
	}
	if !c.started {
		c.started = true
		c.start = now
		c.sched = 0
	}
	c.advance(now)
	pt, err := c.sample()
	if err != nil {
		return fmt.Errorf("tsconv: sample hardware clock: %w (conversion keeps the previous parameters)", err)
	}
	c.estimate(pt, c.next.Sub(now))
	return nil
}

// scheduleAt returns the i-th update time after start: the warmup times,
// then the multiples of Interval beyond the last warmup time.
func (c *Converter) scheduleAt(i int) time.Time {
	w := c.cfg.Warmup
	if i < len(w) {
		return c.start.Add(w[i])
	}
	var last time.Duration
	if len(w) > 0 {
		last = w[len(w)-1]
	}
	k := int64(last/c.cfg.Interval) + 1 + int64(i-len(w))
	return c.start.Add(time.Duration(k) * c.cfg.Interval)
}

// advance moves the schedule to the first time after now, skipping missed
// slots instead of catching up with a burst.
func (c *Converter) advance(now time.Time) {
	w := c.cfg.Warmup
	for c.sched < len(w) && !c.scheduleAt(c.sched).After(now) {
		c.sched++
	}
	if c.sched >= len(w) {
		var last time.Duration
		if len(w) > 0 {
			last = w[len(w)-1]
		}
		// Jump straight to the right steady slot.
		base := int64(last/c.cfg.Interval) + 1
		k := int64(now.Sub(c.start)/c.cfg.Interval) + 1
		if k < base {
			k = base
		}
		if i := len(w) + int(k-base); i > c.sched {
			c.sched = i
		}
		for !c.scheduleAt(c.sched).After(now) {
			c.sched++
		}
	}
	c.next = c.scheduleAt(c.sched)
}

// sample takes SamplesPerUpdate bracketed samples and combines them into
// the tightest bracket. Failed or inverted brackets are skipped; only when none is
// usable does it fail.
func (c *Converter) sample() (point, error) {
	n := 0
	var firstErr error
	if bc, ok := c.clock.(BatchClock); ok {
		k, err := bc.Samples(c.batch)
		if err != nil {
			firstErr = err
		}
		n = min(max(k, 0), len(c.batch))
	} else {
		for range c.batch {
			s, err := c.clock.Sample()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				continue
			}
			c.batch[n] = s
			n++
		}
	}
	best := -1
	for i := range n {
		w := c.batch[i].Width()
		if w < 0 || c.batch[i].SysBefore < 0 {
			continue
		}
		if best < 0 || w < c.batch[best].Width() {
			best = i
		}
	}
	if best < 0 {
		if firstErr != nil {
			return point{}, firstErr
		}
		return point{}, errNoSample
	}
	// Every sample bounds the system time at the tightest sample's hardware
	// reading (shifted by the tick difference, a few µs at most, so the
	// rate error does not matter). Intersecting the bounds is at least as
	// tight as the best single bracket: the earliest lower and the latest
	// upper edge may come from different reads.
	ref := c.batch[best]
	// Offsets from ref.SysBefore: float64 cannot hold epoch nanoseconds
	// exactly.
	lo, hi := 0.0, float64(ref.Width())
	for i := range n {
		s := c.batch[i]
		if i == best || s.Width() < 0 || s.SysBefore < 0 {
			continue
		}
		shift := float64(int64(s.HW-ref.HW)) * c.rate
		lo = math.Max(lo, float64(s.SysBefore-ref.SysBefore)-shift)
		hi = math.Min(hi, float64(s.SysAfter-ref.SysBefore)-shift)
	}
	if lo > hi {
		// Inconsistent brackets (a clock moved between reads): trust
		// the single tightest one.
		lo, hi = 0, float64(ref.Width())
	}
	mid := ref.SysBefore + int64(math.Round((lo+hi)/2))
	return point{hw: ref.HW, sys: mid, half: int64(math.Ceil((hi - lo) / 2))}, nil
}

// estimate folds a new point into the fit and publishes new parameters;
// gap is the time until the next update. Caller holds c.mu.
func (c *Converter) estimate(pt point, gap time.Duration) {
	old := c.p.Load()
	var updates, steps uint64
	if old != nil {
		updates, steps = old.Updates, old.Steps
		last := c.points[len(c.points)-1]
		pred, ok := old.Convert(pt.hw)
		res := pt.sys - pred
		dt := math.Abs(float64(pt.sys - last.sys))
		allow := float64(c.cfg.StepThreshold) + 2*float64(pt.half+last.half)
		if c.rated {
			// A fitted rate is good to well under a ppm; 2 ppm of the
			// interval covers wander without hiding a real step.
			allow += 2e-6 * dt
		} else {
			allow += c.cfg.MaxPPM * 1e-6 * dt
		}
		switch {
		case !ok:
			steps++
			c.points = c.points[:0]
		case math.Abs(float64(res)) > allow:
			// The hardware or the system clock stepped. Move the
			// kept points onto the new time line by the observed
			// jump so the frequency fit carries on: a step changes
			// the offset, not the rate.
			steps++
			for i := range c.points {
				c.points[i].sys += res
			}
		default:
			c.lastRes = abs64(res)
		}
	}
	c.points = append(c.points, pt)
	if len(c.points) > c.cfg.Window {
		c.points = append(c.points[:0], c.points[len(c.points)-c.cfg.Window:]...)
	}

	ref := pt
	sysRef := pt.sys
	if len(c.points) >= 2 {
		nominal := 1e9 / float64(c.cfg.NominalHz)
		// A rate outside any plausible crystal error means broken
		// samples (e.g. a clock that does not advance): keep the old one.
		if b, a, ok := fit(c.points); ok && math.Abs(b/nominal-1) <= 2*c.cfg.MaxPPM*1e-6 {
			c.rate = b
			c.rated = true
			sysRef = ref.sys + int64(math.Round(a))
		}
	}

	// After a step there is no observed prediction error on the new time
	// line yet: the last good residual is the honest guess.
	errNs := pt.half + c.lastRes
	if !c.rated {
		errNs = pt.half + int64(c.cfg.MaxPPM*1e-6*float64(gap))
	}
	c.p.Store(&Params{
		HWRef:     ref.hw,
		SysRef:    sysRef,
		NsPerTick: c.rate,
		ErrorNs:   errNs,
		Updates:   updates + 1,
		Steps:     steps,
	})
}

// fit is a weighted least-squares line sys = a + b·hw through the points,
// relative to the newest point (keeps the numbers small for float64).
// Weights are 1/half², so tight brackets count more. It returns the slope
// b (ns per tick) and the intercept a (the fitted system time at the
// newest point's hw, minus its measured sys).
func fit(pts []point) (b, a float64, ok bool) {
	ref := pts[len(pts)-1]
	var sw, sx, sy, sxx, sxy float64
	for _, p := range pts {
		h := float64(max(p.half, 5)) // floor: avoid infinite weight
		w := 1 / (h * h)
		x := float64(int64(p.hw - ref.hw))
		y := float64(p.sys - ref.sys)
		sw += w
		sx += w * x
		sy += w * y
		sxx += w * x * x
		sxy += w * x * y
	}
	den := sw*sxx - sx*sx
	if !(den > 0) {
		return 0, 0, false
	}
	b = (sw*sxy - sx*sy) / den
	a = (sy - b*sx) / sw
	if math.IsNaN(b) || math.IsInf(b, 0) || math.IsNaN(a) || math.IsInf(a, 0) {
		return 0, 0, false
	}
	return b, a, true
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// Run drives Update on the schedule until ctx ends, then returns
// ctx.Err(). Update errors go to Config.OnError and do not stop it. In
// modes other than sync there is nothing to maintain and Run returns nil
// at once.
func (c *Converter) Run(ctx context.Context) error {
	if c.mode != ModeSync {
		return nil
	}
	for {
		if err := c.Update(c.cfg.Now()); err != nil && c.cfg.OnError != nil {
			c.cfg.OnError(err)
		}
		wait := c.Next().Sub(c.cfg.Now())
		if wait < 0 {
			wait = 0
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c.cfg.After(wait):
		}
	}
}
