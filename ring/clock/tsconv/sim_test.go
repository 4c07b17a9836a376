package tsconv

import (
	"math"
	"math/rand/v2"
)

// simClock is a simulated free-running hardware clock sampled against a
// simulated system clock, behind the same Clock interface a PHC uses. All
// time is simulated: sampling advances the true time by the simulated
// read latencies, nothing sleeps.
type simClock struct {
	t0     int64   // true system time at start, ns
	t      int64   // true system time now, ns
	hz     float64 // nominal tick rate
	hwBase uint64
	phase  float64 // ticks elapsed since start (plus steps)
	// ppm returns the clock's frequency error at s seconds after start.
	ppm func(s float64) float64

	rng    *rand.Rand
	jitter bool
	calls  int
}

func newSim(seed uint64, hz float64, ppm func(float64) float64, jitter bool) *simClock {
	const t0 = 1_700_000_000_000_000_000
	return &simClock{
		t0: t0, t: t0, hz: hz, hwBase: 123_456_789_012_345,
		ppm: ppm, rng: rand.New(rand.NewPCG(seed, 1)), jitter: jitter,
	}
}

// advance moves true time by dt ns, integrating the clock frequency at the
// interval's midpoint (exact for linear frequency changes).
func (s *simClock) advance(dt int64) {
	mid := float64(s.t-s.t0) + float64(dt)/2
	f := (1 + s.ppm(mid/1e9)*1e-6) * s.hz / 1e9
	s.phase += float64(dt) * f
	s.t += dt
}

// step jumps the hardware clock by ns nanoseconds of its own time.
func (s *simClock) step(ns float64) { s.phase += ns * s.hz / 1e9 }

func (s *simClock) hw() uint64 { return s.hwBase + uint64(math.Round(s.phase)) }

// latency models one side of a clock read: a floor, an exponential tail,
// and rare preemptions of 20 µs.
func (s *simClock) latency() int64 {
	if !s.jitter {
		return 0
	}
	l := 30 + s.rng.ExpFloat64()*150
	if s.rng.Float64() < 0.05 {
		l += 20_000
	}
	return int64(l)
}

func (s *simClock) Sample() (Sample, error) {
	s.calls++
	a, b := s.latency(), s.latency()
	s.advance(a)
	before := s.t - a
	hw := s.hw()
	s.advance(b)
	after := s.t
	if s.jitter {
		s.advance(200) // gap between consecutive reads
	}
	return Sample{SysBefore: before, HW: hw, SysAfter: after}, nil
}
