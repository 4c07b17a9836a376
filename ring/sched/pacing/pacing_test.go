package pacing

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

func TestRateConversions(t *testing.T) {
	r := Rate{Kbps: KbpsFromBytesPerSecond(1_250_000)}
	if r.Kbps != 10_000 || r.BytesPerSecond() != 1_250_000 {
		t.Errorf("1250000 B/s → %d kbit/s → %d B/s, want 10000 and 1250000", r.Kbps, r.BytesPerSecond())
	}
	if got := (Rate{Kbps: 500_000}).Cost(1442); got != 23072 {
		t.Errorf("cost of 1442 bytes at 500 Mbit/s = %d ns, want 23072", got)
	}
	if got := (Rate{Kbps: 100_000_000}).BytesPerSecond(); got != 4294967295 {
		t.Errorf("100 Gbit/s reads back as %d B/s, want the u32 maximum", got)
	}
	for _, c := range []struct {
		r    Rate
		want uint32
	}{
		{Rate{Kbps: 1000}, 2 * DefaultTypicalBytes},           // 25 bytes of 200 µs: two frames
		{Rate{Kbps: 500_000}, 12500},                          // 200 µs at 500 Mbit/s
		{Rate{Kbps: 100_000_000}, MaxDefaultBurst},            // capped
		{Rate{Kbps: 1000, TypicalBytes: 200}, 400},            // two typical frames
		{Rate{Kbps: 1000, MaxBurst: 9000}, 9000},              // explicit
		{Rate{Kbps: 10_000, MaxBurst: 1, TypicalBytes: 9}, 1}, // explicit wins even when tiny
	} {
		if got := c.r.Burst(); got != c.want {
			t.Errorf("%v: burst %d, want %d", c.r, got, c.want)
		}
	}
	if s := (Rate{Kbps: 2_500_000}).String(); s != "2.5Gbit/s" {
		t.Errorf("String = %q", s)
	}
}

// TestPacerLongRun checks the long-run rate is exact to the byte even when
// the pacer runs late by random amounts within the burst allowance, and
// that no stretch of departures ever exceeds the burst.
func TestPacerLongRun(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, kbps := range []uint32{1000, 7_777, 10_000, 500_000, 3_000_000} {
		r := Rate{Kbps: kbps}
		var p Pacer
		p.Set(r, 0)
		const size = 1442
		burst := int64(r.Burst())
		now := int64(0)
		sent := int64(0)
		var times []int64
		for i := 0; i < 20000; i++ {
			due := p.Due(size)
			// Late by up to half the burst's time, never early.
			late := rng.Int64N(max(r.Cost(int(burst))/2, 1))
			now = max(now, due+late)
			p.Charge(now, size)
			sent += size
			times = append(times, now)
		}
		// Long run: the last departure is within one burst of the ideal
		// time of what was sent.
		ideal := r.Cost(int(sent - burst))
		if d := times[len(times)-1] - ideal; d < -r.Cost(size) || d > r.Cost(int(burst)) {
			t.Errorf("%v: last departure at %d ns, ideal %d (off by %d ns)", r, times[len(times)-1], ideal, d)
		}
		// Token-bucket conformance: bytes in [t_i, t_j] ≤ burst + rate·(t_j − t_i).
		for i := range times {
			for j := i; j < len(times) && j < i+200; j++ {
				bytes := int64(j-i+1) * size
				allowed := burst + int64(float64(times[j]-times[i])*float64(kbps)/8e6) + 1
				if bytes > allowed {
					t.Fatalf("%v: %d bytes between departures %d and %d (%d ns), allowed %d", r, bytes, i, j, times[j]-times[i], allowed)
				}
			}
		}
	}
}

func TestPacerIdleCreditCapped(t *testing.T) {
	r := Rate{Kbps: 10_000, MaxBurst: 3000}
	var p Pacer
	p.Set(r, 0)
	p.Charge(0, 1000)
	// A long silence earns no more than the burst: 3 datagrams of 1000
	// bytes go at once, the fourth waits its cost.
	now := int64(10e9)
	for i := 0; i < 3; i++ {
		if d := p.Due(1000); d > now {
			t.Fatalf("datagram %d after idle due at %d, want now (%d)", i, d, now)
		}
		p.Charge(now, 1000)
	}
	if d := p.Due(1000); d != now+r.Cost(1000) {
		t.Errorf("fourth datagram due at %d, want %d", d, now+r.Cost(1000))
	}
}

func TestPacerSetResetsCredit(t *testing.T) {
	var p Pacer
	p.Set(Rate{Kbps: 1000, MaxBurst: 2000}, 0)
	for i := 0; i < 10; i++ {
		p.Charge(0, 2000) // far ahead at the slow rate
	}
	p.Set(Rate{Kbps: 100_000, MaxBurst: 2000}, 5)
	if d := p.Due(1500); d > 5 {
		t.Errorf("after a rate change a datagram is due at %d, want at once", d)
	}
}

func TestWheelOrderAndRemove(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const start = 5_000_000_000
	w := NewWheel[int](start)
	items := make([]*Item[int], 3000)
	dues := map[int]int64{}
	for i := range items {
		items[i] = NewItem(i)
		// Mostly within the horizon, some far beyond, some in the past.
		var due int64
		switch i % 10 {
		case 0:
			due = start + 20e6 + rng.Int64N(1e9)
		case 1:
			due = start - rng.Int64N(1e6)
		default:
			due = start + rng.Int64N(16e6)
		}
		w.Insert(items[i], due)
		dues[i] = due
	}
	// Remove a third, re-insert some elsewhere.
	for i := 0; i < len(items); i += 3 {
		w.Remove(items[i])
		delete(dues, i)
		if i%2 == 0 {
			d := start + rng.Int64N(40e6)
			w.Insert(items[i], d)
			dues[i] = d
		}
	}
	w.Remove(NewItem(-1)) // unqueued: ignored
	if w.Len() != len(dues) {
		t.Fatalf("Len = %d, want %d", w.Len(), len(dues))
	}
	var fired []int
	now := int64(start)
	prev := int64(-1 << 62)
	for w.Len() > 0 {
		next, ok := w.Next()
		if !ok {
			t.Fatal("Next reports empty with items queued")
		}
		if next <= prev {
			t.Fatalf("Next = %d, but everything due by %d has fired", next, prev)
		}
		now = max(now, next) + rng.Int64N(3000)
		w.Advance(now, func(it *Item[int]) {
			// Fired at the first Advance at or after its due time: not
			// early, and not left behind by an earlier Advance.
			if it.Due() > now || it.Due() <= prev {
				t.Errorf("item %d due %d fired at %d (previous advance %d)", it.Value, it.Due(), now, prev)
			}
			if it.Queued() {
				t.Errorf("item %d fired while still queued", it.Value)
			}
			fired = append(fired, it.Value)
		})
		prev = now
	}
	if len(fired) != len(dues) {
		t.Fatalf("fired %d items, want %d", len(fired), len(dues))
	}
	for _, v := range fired {
		if _, ok := dues[v]; !ok {
			t.Errorf("item %d fired but was removed", v)
		}
	}
	if _, ok := w.Next(); ok {
		t.Error("Next on an empty wheel reports an item")
	}
}

func TestWheelLongIdleAdvance(t *testing.T) {
	w := NewWheel[int](0)
	a, b := NewItem(1), NewItem(2)
	w.Insert(a, 100)
	w.Insert(b, 3e9) // beyond the horizon
	var got []int
	w.Advance(10e9, func(it *Item[int]) { got = append(got, it.Value) }) // many turns at once
	if !slices.Equal(got, []int{1, 2}) || w.Len() != 0 {
		t.Errorf("after a long idle fired %v (left %d), want [1 2]", got, w.Len())
	}
	w.Advance(5e9, func(*Item[int]) { t.Error("fired when the clock went back") })
}

func TestTablePolicies(t *testing.T) {
	tb := NewTable(TableConfig{Device: "eth9", Capacity: 2, MaxQueues: 4})
	r10, r20, r30 := Rate{Kbps: 10_000}, Rate{Kbps: 20_000}, Rate{Kbps: 30_000}
	e1, err := tb.Acquire(r10)
	if err != nil {
		t.Fatal(err)
	}
	e2, _ := tb.Acquire(r10)
	if e1 != e2 || tb.Stats().Shared.Load() != 1 {
		t.Fatalf("identical rates got entries %d and %d (shared %d), want one shared entry", e1.Index, e2.Index, tb.Stats().Shared.Load())
	}
	if _, err := tb.Acquire(Rate{Kbps: 10_000, MaxBurst: 3000}); err != nil {
		t.Fatal(err) // another tuple: its own entry
	}
	if _, err := tb.Acquire(r20); !errors.Is(err, unix.ENOSPC) || tb.Stats().RefusedFull.Load() != 1 {
		t.Fatalf("full table: %v, want ENOSPC", err)
	}
	// Releasing both references frees the entry for another rate.
	tb.Release(e1)
	tb.Release(e2)
	tb.Release(e2) // extra release: ignored
	e3, err := tb.Acquire(r30)
	if err != nil || e3.Index != e1.Index {
		t.Fatalf("after release: %v, entry %v, want entry %d reused", err, e3, e1.Index)
	}
	if n, q := tb.Used(); n != 2 || q != 2 {
		t.Errorf("used %d entries by %d queues, want 2 by 2", n, q)
	}
	if err := tb.CheckRange(999); !errors.Is(err, unix.ERANGE) {
		t.Errorf("999 kbit/s: %v, want ERANGE", err)
	}
	if _, err := tb.Acquire(Rate{Kbps: 100_000_001}); !errors.Is(err, unix.ERANGE) || tb.Stats().RefusedRange.Load() != 1 {
		t.Errorf("above the maximum: %v, want ERANGE", err)
	}

	near := NewTable(TableConfig{Device: "eth9", Capacity: 2, MaxQueues: 4, Policy: Nearest})
	a, _ := near.Acquire(r10)
	b, _ := near.Acquire(r30)
	c, err := near.Acquire(r20) // equidistant: the lower rate
	if err != nil || c != a || near.Stats().Nearest.Load() != 1 {
		t.Fatalf("nearest for 20 Mbit/s between 10 and 30: %v %v, want the 10 Mbit/s entry", c, err)
	}
	if d, _ := near.Acquire(Rate{Kbps: 29_000}); d != b {
		t.Errorf("nearest for 29 Mbit/s: %v, want the 30 Mbit/s entry", d)
	}
	if _, err := near.Acquire(r10); !errors.Is(err, unix.ENOSPC) {
		t.Errorf("fifth paced queue with MaxQueues 4: %v, want ENOSPC", err)
	}
	snap := near.Snapshot()
	if len(snap.Entries) != 2 || snap.Queues != 4 || snap.Entries[0].Users != 2 || snap.Entries[1].Users != 2 {
		t.Errorf("snapshot %+v", snap)
	}
}

func TestTableConfig(t *testing.T) {
	for _, c := range []TableConfig{{Capacity: -1}, {MinKbps: 10, MaxKbps: 5}, {MaxQueues: -3}, {Policy: 7}} {
		if c.Validate() == nil {
			t.Errorf("%+v validated", c)
		}
	}
	if err := (TableConfig{}).Validate(); err != nil {
		t.Error(err)
	}
	if p, err := ParseFullPolicy("nearest"); err != nil || p != Nearest || p.String() != "nearest" {
		t.Errorf("ParseFullPolicy(nearest) = %v, %v", p, err)
	}
	if _, err := ParseFullPolicy("closest"); err == nil {
		t.Error("ParseFullPolicy accepted closest")
	}
}
