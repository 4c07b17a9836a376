package qos

import (
	"math"
	"testing"
)

// sim drives a scheduler like an engine would: every class in backlog
// always has datagrams of size[tc] wire bytes; the clock advances by
// step ns per datagram (0: the engine is infinitely fast, only limits
// hold it back) and jumps to NextReady when every class is held back. It
// returns the wire bytes each class sent until the clock reaches end.
func sim(t *testing.T, c Config, backlog uint8, size [NumTC]int, step, end int64) [NumTC]int64 {
	t.Helper()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	s := NewScheduler(&c, 0)
	var sent [NumTC]int64
	now := int64(0)
	for now < end {
		tc, budget, ok := s.Pick(backlog, now)
		if !ok {
			at, ok := s.NextReady(backlog, now)
			if !ok || at <= now {
				t.Fatalf("held back at %d with no ready time (%d, %v)", now, at, ok)
			}
			now = at
			continue
		}
		if backlog&(1<<tc) == 0 {
			t.Fatalf("picked tc %d, not in backlog %08b", tc, backlog)
		}
		if budget < 1 {
			t.Fatalf("budget %d", budget)
		}
		s.Charge(tc, size[tc])
		sent[tc] += int64(size[tc])
		now += step
	}
	return sent
}

func sizes(n int) (s [NumTC]int) {
	for i := range s {
		s[i] = n
	}
	return s
}

func allETS(bw ...uint8) Config {
	c := Default()
	c.BW = [NumTC]uint8{}
	copy(c.BW[:], bw)
	return c
}

func share(sent [NumTC]int64, tc int) float64 {
	var sum int64
	for _, b := range sent {
		sum += b
	}
	return float64(sent[tc]) / float64(sum)
}

func TestETSShares(t *testing.T) {
	c := allETS(30, 70)
	// Unequal datagram sizes: the shares are of wire bytes, not datagrams.
	size := sizes(1500)
	size[0] = 64
	sent := sim(t, c, 0b11, size, 1, 2_000_000)
	if s := share(sent, 0); math.Abs(s-0.30) > 0.005 {
		t.Errorf("tc 0 got %.4f of the bytes, want 0.30 (%v)", s, sent)
	}
	// Four classes 10/20/30/40.
	c = allETS(10, 20, 30, 40)
	sent = sim(t, c, 0b1111, sizes(1000), 1, 4_000_000)
	for tc, want := range []float64{0.1, 0.2, 0.3, 0.4} {
		if s := share(sent, tc); math.Abs(s-want) > 0.005 {
			t.Errorf("tc %d got %.4f, want %.2f (%v)", tc, s, want, sent)
		}
	}
}

// What an idle ETS class does not use, the others get; a 0 % class still
// sends (a minimal share), it does not starve.
func TestETSLendingAndNoStarvation(t *testing.T) {
	c := allETS(30, 70)
	sent := sim(t, c, 0b01, sizes(1500), 1, 100_000)
	if sent[0] != 100_000*1500 {
		t.Errorf("a lone 30%% class sent %d bytes, want all %d", sent[0], 100_000*1500)
	}
	sent = sim(t, c, 0b101, sizes(1500), 1, 1_000_000)
	// Its quantum is that of 1 %: 1/31 of what the 30 % class gets.
	if sh := share(sent, 2); math.Abs(sh-1.0/31) > 0.005 {
		t.Errorf("0%% class: share %.4f (%v), want 1/31", sh, sent)
	}
}

// A strict class sends before every ETS class and before lower strict
// classes, for as long as it has traffic.
func TestStrict(t *testing.T) {
	c := allETS(30, 70)
	c.TSA[5], c.TSA[7] = Strict, Strict
	s := NewScheduler(&c, 0)
	for i := range 1000 {
		if tc, _, _ := s.Pick(0b1010_0011, int64(i)); tc != 7 {
			t.Fatalf("pick %d: tc %d, want strict 7", i, tc)
		}
		s.Charge(7, 1500)
	}
	if tc, _, _ := s.Pick(0b0010_0011, 1000); tc != 5 {
		t.Fatalf("without 7: tc %d, want strict 5", tc)
	}
	if tc, _, _ := s.Pick(0b0000_0011, 1001); tc != 0 && tc != 1 {
		t.Fatalf("without strict traffic: tc %d, want an ETS class", tc)
	}
	// The ETS classes then share 30/70 as if the strict burst never was
	// (it gave them no debt).
	sent := sim(t, c, 0b0000_0011, sizes(1500), 1, 1_000_000)
	if sh := share(sent, 0); math.Abs(sh-0.3) > 0.005 {
		t.Errorf("ETS after strict: %.4f", sh)
	}
}

// A class limit holds whatever its demand, and the port limit holds over
// every class; within the port limit ETS shares still hold.
func TestRateLimits(t *testing.T) {
	const second = int64(1e9)
	c := allETS(30, 70)
	c.RateKbps[1] = 100_000 // 100 Mbit/s
	sent := sim(t, c, 0b10, sizes(1500), 0, second)
	// 100 Mbit/s for a second is 12.5 MB, plus the bucket it starts with.
	want := int64(12_500_000)
	if got := sent[1]; got < want || got > want+burst(100_000)+1500 {
		t.Errorf("tc 1 limited to 100 Mbit/s sent %d bytes in a second, want %d (+ one bucket)", got, want)
	}
	c = allETS(30, 70)
	c.MaxRateKbps = 20_000 // 20 Mbit/s port
	sent = sim(t, c, 0b11, sizes(1000), 0, 10*second)
	total := sent[0] + sent[1]
	if want := int64(25_000_000); total < want || total > want+burst(20_000)+1000 {
		t.Errorf("port limit 20 Mbit/s: %d bytes in 10 s, want %d", total, want)
	}
	if sh := share(sent, 0); math.Abs(sh-0.3) > 0.005 {
		t.Errorf("ETS under the port limit: tc 0 share %.4f, want 0.30", sh)
	}
	// A strict class under its own limit leaves the rest to ETS.
	c = allETS(30, 70)
	c.TSA[7], c.RateKbps[7], c.MaxRateKbps = Strict, 5_000, 20_000
	sent = sim(t, c, 0b1000_0011, sizes(1000), 0, 10*second)
	if got, want := sent[7], int64(6_250_000); got < want || got > want+burst(5_000)+1000 {
		t.Errorf("strict tc 7 limited to 5 of 20 Mbit/s: %d bytes, want %d", got, want)
	}
	if sh := float64(sent[0]) / float64(sent[0]+sent[1]); math.Abs(sh-0.3) > 0.005 {
		t.Errorf("ETS beside a limited strict class: %.4f", sh)
	}
}

// burst is what a bucket of kbps holds when full, in bytes.
func burst(kbps int64) int64 {
	return max(kbps*bucketTime, minBurst*microbitsPerByte) / microbitsPerByte
}

func TestNextReady(t *testing.T) {
	c := allETS(100)
	c.RateKbps[0] = 8_000 // 1 byte per µs
	s := NewScheduler(&c, 0)
	if _, ok := s.NextReady(0b1, 0); ok {
		t.Fatal("ready time while the class may send")
	}
	s.Charge(0, 2*minBurst)
	if _, _, ok := s.Pick(0b1, 0); ok {
		t.Fatal("over-limit class picked")
	}
	at, ok := s.NextReady(0b1, 0)
	if !ok || at < int64(minBurst)*1000 || at > int64(minBurst)*1000+1000 {
		t.Fatalf("ready at %d (%v), want about %d", at, ok, minBurst*1000)
	}
	if _, _, ok := s.Pick(0b1, at); !ok {
		t.Fatal("not ready at its ready time")
	}
	// An unlimited backlogged class means nothing waits.
	if _, ok := s.NextReady(0b11, 0); ok {
		t.Fatal("ready time with an unlimited class backlogged")
	}
}

// BenchmarkPick is the scheduler's cost per datagram: one Pick and one
// Charge, with one class (the default: what every ring pays) and with all
// eight classes active, ETS with limits.
func BenchmarkPick(b *testing.B) {
	run := func(b *testing.B, c Config, backlog uint8) {
		s := NewScheduler(&c, 0)
		now := int64(0)
		b.ResetTimer()
		for range b.N {
			now += 100
			tc, _, ok := s.Pick(backlog, now)
			if ok {
				s.Charge(tc, 1000)
			}
		}
	}
	b.Run("1tc", func(b *testing.B) { run(b, Default(), 0b1) })
	b.Run("8tc-ets", func(b *testing.B) { run(b, Default(), 0xff) })
	b.Run("8tc-mixed-limited", func(b *testing.B) {
		c := Default()
		_ = c.SetTSA("ets,ets,ets,ets,ets,ets,strict,strict")
		_ = c.SetTCBW("10,10,10,10,20,40")
		_ = c.SetRateLimit("0,0,0,0,0,0,10,20")
		c.MaxRateKbps = 100_000_000
		run(b, c, 0xff)
	})
}
