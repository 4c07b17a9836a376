package pacing

// Pacer enforces one Rate on one send queue with departure times: a
// datagram may leave once the queue's theoretical departure time (TAT) is
// no more than the burst allowance ahead of the clock, and each datagram
// pushes TAT by its cost at the rate. This is the generic cell rate
// algorithm (a token bucket of depth Burst) in time units, so that:
//
//   - departures are absolute: TAT advances by the cost of what was sent,
//     not from the moment the pacer happened to run, and a late wake-up is
//     made up by the next departures (up to the burst), so the long-run
//     rate does not drift with wake-up jitter;
//   - no stretch of departures exceeds Burst bytes plus the rate's share of
//     its duration;
//   - an idle queue earns at most Burst bytes of credit.
//
// A datagram is never split in time: one larger than Burst leaves whole,
// as soon as the bucket is empty. The zero Pacer is unusable; call Set.
type Pacer struct {
	rate    Rate
	burstNs int64
	// tat is when the bucket is empty again (ns): the burst allowance
	// left at time t is burstNs − (tat − t). frac is
	// the remainder of the last cost division, in units of 1/Kbps ns, so
	// that rounding never adds up.
	tat  int64
	frac uint64
}

// Set (re)configures the pacer. A new or changed rate starts with a full
// burst allowance at now: what was already sent at the old rate does not
// delay the new one.
func (p *Pacer) Set(r Rate, now int64) {
	p.rate = r
	p.burstNs = r.Cost(int(r.Burst()))
	p.tat, p.frac = now, 0
}

// BurstNs is the burst allowance in time: how late a departure may be
// and still be made up.
func (p *Pacer) BurstNs() int64 { return p.burstNs }

// Rate returns the pacer's rate.
func (p *Pacer) Rate() Rate { return p.rate }

// Due returns the earliest time a datagram of b wire bytes may leave: now
// or earlier means at once.
func (p *Pacer) Due(b int) int64 {
	return p.tat + p.rate.Cost(b) - p.burstNs
}

// Charge records that b wire bytes left at now.
func (p *Pacer) Charge(now int64, b int) {
	if p.tat < now {
		// The bucket ran empty (idle, or later than the burst covers):
		// credit does not accumulate beyond a full burst.
		p.tat, p.frac = now, 0
	}
	k := uint64(p.rate.Kbps)
	if k == 0 {
		return
	}
	num := uint64(b)*8_000_000 + p.frac
	p.tat += int64(num / k)
	p.frac = num % k
}
