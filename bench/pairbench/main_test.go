package main

import (
	"math"
	"testing"
	"time"
)

// TestMedianCI checks the median and the sign test's order statistics:
// for n = 20, k = floor((20 - 1.96·√20) / 2) = 5, so the interval is the
// 5th and the 16th smallest ratio.
func TestMedianCI(t *testing.T) {
	r := make([]float64, 20)
	for i := range r {
		r[i] = float64(20-i) / 10 // 2.0, 1.9, ... 0.1, unsorted
	}
	med, lo, hi := medianCI(r)
	if math.Abs(med-1.05) > 1e-9 || math.Abs(lo-0.5) > 1e-9 || math.Abs(hi-1.6) > 1e-9 {
		t.Fatalf("medianCI = %v [%v, %v], want 1.05 [0.5, 1.6]", med, lo, hi)
	}
	if med, lo, hi := medianCI([]float64{3}); med != 3 || lo != 3 || hi != 3 {
		t.Fatalf("one ratio: %v [%v, %v], want 3 [3, 3]", med, lo, hi)
	}
	if med, _, _ := medianCI(nil); !math.IsNaN(med) {
		t.Fatalf("no ratios: median %v, want NaN", med)
	}
}

func TestPct(t *testing.T) {
	d := []time.Duration{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	if got := pct(d, 50); got != 5 {
		t.Errorf("p50 = %v, want 5", got)
	}
	if got := pct(d, 99); got != 10 {
		t.Errorf("p99 = %v, want 10", got)
	}
	if got := pct(nil, 50); got != 0 {
		t.Errorf("p50 of nothing = %v, want 0", got)
	}
}
