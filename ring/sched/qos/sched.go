package qos

import "math/bits"

// The scheduler's units: a byte is 8e6 micro-bits, and a rate of k kbit/s
// adds k micro-bits per nanosecond, so token buckets refill in integers
// without rounding drift.
const microbitsPerByte = 8_000_000

// QuantumUnit is the DRR quantum of one percent of ETS bandwidth: a round
// over the ETS classes gives them 100 × QuantumUnit bytes in their
// shares. Small enough that a class's turn is short (latency), large
// enough that a round is not a handful of datagrams (cost).
const QuantumUnit = 512

// bucketTime is how long a limited class (or the port) may save up its
// rate to send back to back after idling; minBurst the least it may save,
// so a low rate still passes a jumbo datagram in one piece.
const (
	bucketTime = 2_000_000 // ns
	minBurst   = 16 << 10  // bytes
)

// bucket is a token bucket in micro-bits. A class may send while it has a
// positive balance; what it sends is charged afterwards and may take the
// balance below zero (a datagram is never split), which delays the next.
type bucket struct {
	kbps   int64 // 0: unlimited
	tokens int64
	cap    int64
	last   int64
}

func (b *bucket) set(kbps uint64, now int64) {
	b.kbps = int64(kbps)
	b.cap = max(b.kbps*bucketTime, minBurst*microbitsPerByte)
	b.tokens = b.cap
	b.last = now
}

func (b *bucket) refill(now int64) {
	if b.kbps == 0 || now <= b.last {
		return
	}
	// Bounded so that the product cannot overflow after a long idle.
	dt := min(now-b.last, b.cap/b.kbps+1)
	b.tokens = min(b.tokens+dt*b.kbps, b.cap)
	b.last = now
}

func (b *bucket) ok() bool { return b.kbps == 0 || b.tokens > 0 }

// readyAt is when the balance turns positive (valid when !ok).
func (b *bucket) readyAt() int64 { return b.last + (-b.tokens)/b.kbps + 1 }

// budget is how many bytes may go before the balance is spent.
func (b *bucket) budget() int64 {
	if b.kbps == 0 {
		return 1 << 40
	}
	return (b.tokens + microbitsPerByte - 1) / microbitsPerByte
}

func (b *bucket) charge(bytes int64) {
	if b.kbps != 0 {
		b.tokens -= bytes * microbitsPerByte
	}
}

// Scheduler arbitrates one ring's egress among the traffic classes. The
// caller passes the set of classes that have something to send (a bit per
// TC) and its monotonic clock in nanoseconds; Pick names the class to
// serve and how many wire bytes it may send before asking again, Charge
// records what was sent. Not safe for concurrent use (one per engine).
type Scheduler struct {
	strict, ets uint8 // class masks by TSA
	quantum     [NumTC]int64
	deficit     [NumTC]int64
	// cur is the ETS class whose DRR turn it is (-1: none yet).
	cur  int
	tc   [NumTC]bucket
	port bucket
	// limited has a bit per class with a rate limit; credit a bit per
	// ETS class whose deficit may be positive.
	limited, credit uint8
	// contended says the last Pick chose among several ETS classes: only
	// then does what a class sends count against its deficit (a class
	// alone on the ring owes nobody).
	contended bool
}

// NewScheduler returns a scheduler for c (which must be valid), its
// buckets full at now.
func NewScheduler(c *Config, now int64) *Scheduler {
	s := &Scheduler{cur: -1}
	for tc := range NumTC {
		if c.TSA[tc] == Strict {
			s.strict |= 1 << tc
		} else {
			s.ets |= 1 << tc
			// A 0 % class gets the least share rather than none: ETS
			// guarantees a minimum, it never starves a class.
			s.quantum[tc] = max(int64(c.BW[tc]), 1) * QuantumUnit
		}
		s.tc[tc].set(c.RateKbps[tc], now)
		if c.RateKbps[tc] != 0 {
			s.limited |= 1 << tc
		}
	}
	s.port.set(c.MaxRateKbps, now)
	return s
}

// eligible returns the classes of backlog that may send at now.
func (s *Scheduler) eligible(backlog uint8, now int64) uint8 {
	s.port.refill(now)
	if !s.port.ok() {
		return 0
	}
	if m := backlog & s.limited; m != 0 {
		for ; m != 0; m &= m - 1 {
			tc := bits.TrailingZeros8(m)
			b := &s.tc[tc]
			b.refill(now)
			if !b.ok() {
				backlog &^= 1 << tc
			}
		}
	}
	return backlog
}

// Pick returns the class to serve next among backlog (bit n: class n has
// datagrams ready) and the wire bytes it may send before the caller asks
// again (at least 1: a datagram in progress always completes). ok is
// false when no backlogged class may send now: every one is over its
// limit, or the port is (NextReady says until when).
func (s *Scheduler) Pick(backlog uint8, now int64) (tc int, budget int64, ok bool) {
	if backlog&(backlog-1) == 0 && s.limited == 0 && s.port.kbps == 0 && s.credit == 0 {
		// One class, nothing limited, nobody's credit to expire: the
		// common case of a ring whose sockets share one class.
		if backlog == 0 {
			return 0, 0, false
		}
		s.contended = false
		return bits.TrailingZeros8(backlog), 1 << 40, true
	}
	// An ETS class without traffic keeps no credit (it lends its share,
	// it does not save it up); a debt it ran up stays.
	for m := s.credit &^ backlog; m != 0; m &= m - 1 {
		c := bits.TrailingZeros8(m)
		s.deficit[c] = min(s.deficit[c], 0)
		s.credit &^= 1 << c
	}
	avail := s.eligible(backlog, now)
	if avail == 0 {
		return 0, 0, false
	}
	s.contended = false
	switch m := avail & s.strict; {
	case avail&(avail-1) == 0:
		// One class may send: no arbitration (the common case).
		tc = bits.TrailingZeros8(avail)
		budget = s.tc[tc].budget()
	case m != 0:
		tc = 7 - bits.LeadingZeros8(m)
		budget = s.tc[tc].budget()
	default:
		tc = s.nextETS(avail & s.ets)
		budget = min(s.tc[tc].budget(), s.deficit[tc])
		s.contended = true
	}
	return tc, max(min(budget, s.port.budget()), 1), true
}

// nextETS runs deficit round robin over the classes in m (not empty): the
// current class keeps its turn while it has credit; then the next class
// in m, cyclically, gets its quantum.
func (s *Scheduler) nextETS(m uint8) int {
	c := s.cur
	if c >= 0 && m&(1<<c) != 0 && s.deficit[c] > 0 {
		return c
	}
	for {
		// The next class of m after c, wrapping around.
		rot := m &^ (uint8(1)<<(c+1) - 1)
		if c < 0 {
			rot = m
		}
		if rot == 0 {
			rot = m
		}
		c = bits.TrailingZeros8(rot)
		s.deficit[c] += s.quantum[c]
		if s.deficit[c] > 0 {
			s.cur = c
			s.credit |= 1 << c
			return c
		}
	}
}

// Charge records that class tc sent wire bytes.
func (s *Scheduler) Charge(tc int, wire int) {
	if !s.contended && s.limited == 0 && s.port.kbps == 0 {
		return
	}
	w := int64(wire)
	s.port.charge(w)
	s.tc[tc].charge(w)
	if s.contended {
		s.deficit[tc] -= w
	}
}

// NextReady returns when a class of backlog held back by a limit may send
// again (ok=false: none is held back).
func (s *Scheduler) NextReady(backlog uint8, now int64) (at int64, ok bool) {
	if backlog == 0 {
		return 0, false
	}
	s.port.refill(now)
	if !s.port.ok() {
		at, ok = s.port.readyAt(), true
	}
	soonest := int64(-1)
	for m := backlog & s.limited; m != 0; m &= m - 1 {
		b := &s.tc[bits.TrailingZeros8(m)]
		b.refill(now)
		if b.ok() {
			// This class may send: only the port holds it back.
			return at, ok
		}
		if r := b.readyAt(); soonest < 0 || r < soonest {
			soonest = r
		}
	}
	if backlog&^s.limited != 0 || soonest < 0 {
		return at, ok
	}
	return max(at, soonest), true
}
