package arrivals

import (
	"math"
	"slices"
	"time"
)

// WireOverhead is what a datagram adds on the wire to its UDP payload
// without VLAN tags: Ethernet (14) + IP + UDP (8) headers.
const (
	WireOverhead4 = 14 + 20 + 8
	WireOverhead6 = 14 + 40 + 8
)

// wire returns a's bytes on the wire.
func wire(a Arrival, overhead int) int64 { return int64(a.Len + overhead) }

// WindowRates returns the rate of wire bytes in bit/s over n consecutive
// windows of length win, the first starting at start (ns since the
// epoch). A datagram belongs to the window its arrival falls in.
func WindowRates(arr []Arrival, overhead int, start int64, win time.Duration, n int) []float64 {
	bytes := make([]int64, n)
	for _, a := range arr {
		i := (a.T - start) / int64(win)
		if a.T >= start && i < int64(n) {
			bytes[i] += wire(a, overhead)
		}
	}
	out := make([]float64, n)
	for i, b := range bytes {
		out[i] = float64(b) * 8 / win.Seconds()
	}
	return out
}

// MaxExcess returns the largest burst beyond the rate: the maximum, over
// every stretch of consecutive arrivals i..j, of their wire bytes minus
// what the rate allows in t_j − t_i. A stream paced by a token bucket of
// depth B at this rate has MaxExcess ≤ B (departures shifted by a
// constant arrive the same). Linear time.
func MaxExcess(arr []Arrival, overhead int, bitsPerSec float64) float64 {
	bytesPerNs := bitsPerSec / 8 / 1e9
	var worst float64
	// excess(i, j) = (S_j − r·t_j) − (S_{i−1} − r·t_i), S cumulative bytes.
	minPrefix := math.Inf(1)
	var s float64
	for _, a := range arr {
		minPrefix = min(minPrefix, s-bytesPerNs*float64(a.T))
		s += float64(wire(a, overhead))
		worst = max(worst, s-bytesPerNs*float64(a.T)-minPrefix)
	}
	return worst
}

// Jitter is the distribution of |gap − ideal| over consecutive arrivals.
type Jitter struct {
	P50, P99, Max time.Duration
	Gaps          int
}

// GapJitter compares each gap between consecutive arrivals with the ideal
// gap of the previous datagram at the rate (its wire bytes over the rate).
func GapJitter(arr []Arrival, overhead int, bitsPerSec float64) Jitter {
	if len(arr) < 2 {
		return Jitter{}
	}
	devs := make([]int64, 0, len(arr)-1)
	for i := 1; i < len(arr); i++ {
		ideal := float64(wire(arr[i-1], overhead)) * 8 / bitsPerSec * 1e9
		d := float64(arr[i].T-arr[i-1].T) - ideal
		devs = append(devs, int64(math.Abs(d)))
	}
	slices.Sort(devs)
	pct := func(p float64) time.Duration {
		// sockperf's index: int(0.5 + p·N) − 1.
		i := max(int(0.5+p*float64(len(devs)))-1, 0)
		return time.Duration(devs[min(i, len(devs)-1)])
	}
	return Jitter{P50: pct(0.5), P99: pct(0.99), Max: time.Duration(devs[len(devs)-1]), Gaps: len(devs)}
}

// Accuracy is how close a paced stream came to its rate over consecutive
// windows.
type Accuracy struct {
	// Rates are the per-window rates in bit/s, Errors their relative
	// errors ((rate − want)/want).
	Rates, Errors []float64
	// Mean is the mean of |Errors|; Worst the error of largest magnitude.
	Mean, Worst float64
}

// MeasureAccuracy compares WindowRates with want (bit/s).
func MeasureAccuracy(arr []Arrival, overhead int, start int64, win time.Duration, n int, want float64) Accuracy {
	a := Accuracy{Rates: WindowRates(arr, overhead, start, win, n)}
	for _, r := range a.Rates {
		e := (r - want) / want
		a.Errors = append(a.Errors, e)
		a.Mean += math.Abs(e) / float64(n)
		if math.Abs(e) > math.Abs(a.Worst) {
			a.Worst = e
		}
	}
	return a
}
