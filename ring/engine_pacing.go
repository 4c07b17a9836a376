package ring

import (
	"fmt"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring/qp"
	"github.com/bypassd/bypassd/ring/sched/pacing"
)

// Pacing in the engine. A paced endpoint's datagrams stay in its TX queue
// until their departure time (so backpressure reaches the sender through
// its full queue, and nothing is dropped); the endpoint waits in the
// engine's timing wheel meanwhile, off the engine's visit list, and the
// wheel puts it back when due. Unpaced endpoints are drained as before,
// never behind paced ones. With a provider that paces in hardware
// (qp.RateLimiter) the engine gives each paced endpoint its own send queue
// and lets the device enforce the rate.

// The engine stops sleeping a margin before the next departure and spins
// the rest of the way: a sleep ends a few to tens of microseconds late,
// more on a loaded machine, and that would show as departure jitter. The
// margin follows the wake-up lateness the engine observes (a high
// quantile of it, see paceWoke), within these bounds: spinning longer
// than the upper one costs more CPU than the jitter it saves, and an
// engine under SCHED_FIFO that never sleeps is stopped by the kernel's
// real-time throttling (50 ms of every second by default): with 20 µs, a
// 500 Mbit/s flow of 1400-byte datagrams (23 µs apart) was throttled on
// the lab VM, with 8 µs it was not.
const (
	paceSpinMin  = 2 * time.Microsecond
	paceSpinMax  = 8 * time.Microsecond
	paceSpinInit = 5 * time.Microsecond
)

// paceState is an endpoint's pacing state, owned by the engine thread.
type paceState struct {
	// applied is the rate the endpoint is paced at, as last seen in
	// Endpoint.rate (nil: unpaced).
	applied *pacing.Rate
	pacer   pacing.Pacer
	// item files the endpoint in the wheel while its next datagram waits
	// for its departure time.
	item *pacing.Item[*Endpoint]
	// hwQueue is the send queue a hardware rate limiter paces (0: the
	// engine paces in software).
	hwQueue int
}

// SetPacing paces the endpoint's transmissions at r from its next
// datagram on; nil removes pacing. The rate's range and the device's rate
// table are the caller's (the daemon's) business; a zero Kbps unpaces.
func (ep *Endpoint) SetPacing(r *pacing.Rate) {
	if r != nil && r.Kbps == 0 {
		r = nil
	}
	if r != nil {
		c := *r
		r = &c
	}
	ep.rate.Store(r)
	// The engine looks at the endpoint again, also when it holds it in
	// its wheel or sleeps.
	ep.r.announce(ep)
}

// Pacing returns the endpoint's pacing rate; ok is false when unpaced.
func (ep *Endpoint) Pacing() (r pacing.Rate, ok bool) {
	if p := ep.rate.Load(); p != nil {
		return *p, true
	}
	return pacing.Rate{}, false
}

// monotonic returns the engine's clock in nanoseconds.
func (e *engine) monotonic() int64 { return int64(time.Since(e.clockBase)) }

func (e *engine) initPacing() {
	e.clockBase = time.Now()
	e.paceSpin = paceSpinInit
	e.wheel = pacing.NewWheel[*Endpoint](0)
	e.paced = map[*Endpoint]struct{}{}
	e.hwRate, _ = e.r.prov.(qp.RateLimiter)
	// A ring with a TAP fallback is driven through a provider that swaps
	// paths under the engine; the TAP cannot honour a send queue's hardware
	// rate, so such a ring paces in software even on a pacing device.
	if fp, ok := e.r.prov.(*fallbackProvider); ok {
		if _, hw := fp.prim.(qp.RateLimiter); hw {
			e.r.log.Warn("hardware pacing off: a ring with a TAP fallback paces in software (run with --fallback none for the device's rate limiter)",
				zap.String("fallback", e.r.cfg.Fallback.String()))
		}
	}
}

// pacingThread prepares the engine thread: a timer slack of 1 µs instead
// of Linux's default 50 µs, so sleeps until a departure end on time, and
// the real-time priority asked for.
func (e *engine) pacingThread() {
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, 1000, 0, 0, 0); err != nil {
		e.r.log.Debug("cannot lower the engine thread's timer slack; paced departures may be later", zap.Error(err))
	}
	if p := e.r.cfg.RealtimePriority; p > 0 {
		if err := setFIFO(p); err != nil {
			e.r.log.Warn("cannot give the engine thread real-time priority (needs CAP_SYS_NICE); it runs under the normal scheduler",
				zap.Int("priority", p), zap.Error(err))
		}
	}
}

// setFIFO puts the calling thread under SCHED_FIFO at priority prio.
func setFIFO(prio int) error {
	param := struct{ priority int32 }{int32(prio)}
	_, _, errno := unix.RawSyscall(unix.SYS_SCHED_SETSCHEDULER, 0, unix.SCHED_FIFO, uintptr(unsafe.Pointer(&param)))
	if errno != 0 {
		return fmt.Errorf("sched_setscheduler SCHED_FIFO %d: %w", prio, errno)
	}
	return nil
}

// paceAdvance reads the clock for this transmit pass and releases the
// endpoints whose departure time has come.
func (e *engine) paceAdvance() {
	e.now = e.monotonic()
	if e.wheel.Len() > 0 {
		e.wheel.Advance(e.now, e.fired)
	}
}

// fired puts an endpoint whose departure time came back on the visit
// list, and counts a departure that came later than the burst allowance
// can make up for: the rate lost that time (the engine was not scheduled,
// or busy elsewhere).
func (e *engine) fired(it *pacing.Item[*Endpoint]) {
	if e.now-it.Due() > it.Value.pace.pacer.BurstNs() {
		e.r.stats.TXPaceLate.Add(1)
	}
	e.activate(it.Value)
}

// paceWaiting reports whether ep waits in the wheel with an unchanged
// rate (the transmit pass skips it).
func (ep *Endpoint) paceWaiting() bool {
	return ep.pace.item != nil && ep.pace.item.Queued() && ep.rate.Load() == ep.pace.applied
}

// paceSync applies a rate change made with SetPacing.
func (e *engine) paceSync(ep *Endpoint) {
	r := ep.rate.Load()
	ps := &ep.pace
	if r == ps.applied {
		return
	}
	if ps.item == nil {
		ps.item = pacing.NewItem(ep)
	}
	e.wheel.Remove(ps.item)
	ps.applied = r
	if r == nil {
		e.paceForget(ep)
		return
	}
	if _, ok := e.paced[ep]; !ok {
		e.paced[ep] = struct{}{}
		e.r.stats.PacedQueues.Store(uint64(len(e.paced)))
	}
	if e.hwRate != nil && e.setHardwareRate(ep, *r) {
		return
	}
	ps.pacer.Set(*r, e.now)
}

// setHardwareRate asks the provider to pace ep's send queue; false means
// it refused and the engine paces in software.
func (e *engine) setHardwareRate(ep *Endpoint, r pacing.Rate) bool {
	ps := &ep.pace
	if ps.hwQueue == 0 {
		if n := len(e.hwFree); n > 0 {
			ps.hwQueue, e.hwFree = e.hwFree[n-1], e.hwFree[:n-1]
		} else {
			e.hwNext++
			ps.hwQueue = e.hwNext
		}
	}
	err := e.hwRate.SetRateLimit(ps.hwQueue, qp.RateLimit{Kbps: r.Kbps, MaxBurst: r.MaxBurst, TypicalBytes: r.TypicalBytes})
	if err == nil {
		return true
	}
	// Warn once per ring: a device without pacing refuses every socket.
	log := e.r.log.Debug
	if !e.hwRefused {
		e.hwRefused, log = true, e.r.log.Warn
	}
	log("hardware rate limit refused; pacing in software", zap.Stringer("local", ep.local), zap.Stringer("rate", r), zap.Error(err))
	// The queue may still carry an earlier rate: clear it before it is
	// given out again.
	_ = e.hwRate.SetRateLimit(ps.hwQueue, qp.RateLimit{})
	e.hwFree = append(e.hwFree, ps.hwQueue)
	ps.hwQueue = 0
	return false
}

// paceForget drops ep's pacing state (unpaced, or gone from the table).
func (e *engine) paceForget(ep *Endpoint) {
	ps := &ep.pace
	if ps.item != nil {
		e.wheel.Remove(ps.item)
	}
	if ps.hwQueue != 0 {
		if err := e.hwRate.SetRateLimit(ps.hwQueue, qp.RateLimit{}); err != nil {
			e.r.log.Warn("cannot clear a hardware rate limit", zap.Int("send_queue", ps.hwQueue), zap.Error(err))
		}
		e.hwFree = append(e.hwFree, ps.hwQueue)
		ps.hwQueue = 0
	}
	ps.applied = nil
	delete(e.paced, ep)
	e.r.stats.PacedQueues.Store(uint64(len(e.paced)))
}

// paceAllow reports whether ep's next datagram, of wire bytes, may leave
// now. If not, ep waits in the wheel until its departure time.
func (e *engine) paceAllow(ep *Endpoint, wire int) bool {
	ps := &ep.pace
	if ps.hwQueue != 0 {
		return true
	}
	// A fresh clock: a pass that was preempted must not send (and charge)
	// at the time it started, or the delay would add to the next burst.
	e.now = e.monotonic()
	due := ps.pacer.Due(wire)
	if due <= e.now {
		return true
	}
	e.wheel.Insert(ps.item, due)
	e.r.stats.TXPaceWaits.Add(1)
	return false
}

// paceCharge records the departure of a paced datagram of wire bytes.
func (e *engine) paceCharge(ep *Endpoint, wire int) {
	if ep.pace.hwQueue == 0 {
		ep.pace.pacer.Charge(e.now, wire)
	}
	e.r.stats.TXPaced.Add(1)
}

// paceTimeout shortens a sleep of at most d so that the engine wakes the
// spin margin before the next departure, and notes when it means to wake.
func (e *engine) paceTimeout(d time.Duration) time.Duration {
	e.paceWake = 0
	next, ok := e.nextDeparture()
	if !ok {
		return d
	}
	now := e.monotonic()
	if t := time.Duration(next-now) - e.paceSpin; t < d {
		d = max(t, 0)
		e.paceWake = now + int64(d)
	}
	return d
}

// nextDeparture returns the earliest time the engine must act: a paced
// endpoint's or TCP connection's departure, or a delayed TCP ACK's
// deadline.
func (e *engine) nextDeparture() (int64, bool) {
	next, ok := e.wheel.Next()
	for _, t := range [2]int64{e.delack.next, e.tcpPace.next} {
		if t != 0 && (!ok || t < next) {
			next, ok = t, true
		}
	}
	return next, ok
}

// paceWoke adapts the spin margin after a sleep shortened for a departure:
// lateness above the margin pulls it up by an eighth of the difference,
// below it lets it down by 1/256, so it settles near the 97th percentile
// of the wake-up lateness. A wake-up before the deadline (a packet, the
// doorbell) says nothing about lateness.
func (e *engine) paceWoke() {
	if e.paceWake == 0 {
		return
	}
	late := time.Duration(e.monotonic() - e.paceWake)
	e.paceWake = 0
	switch {
	case late < 0:
		return
	case late > e.paceSpin:
		e.paceSpin += (late - e.paceSpin) / 8
	default:
		e.paceSpin -= (e.paceSpin - late) / 256
	}
	e.paceSpin = min(max(e.paceSpin, paceSpinMin), paceSpinMax)
}

// paceImminent reports whether a departure is due within the spin margin:
// the engine spins rather than sleeps.
func (e *engine) paceImminent() bool {
	next, ok := e.nextDeparture()
	return ok && time.Duration(next-e.monotonic()) < e.paceSpin
}
