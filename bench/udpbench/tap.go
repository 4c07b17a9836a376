package main

import (
	"fmt"

	"github.com/bypassd/bypassd/ring"
)

// The TAP fallback path's cases: the ring cases with the ring forced onto
// its TAP (tc u32 + mirred in, a read(2) per frame; a write(2) per frame
// out, mirred to the NIC).

func (b *bench) txRingTAP() (sample, error) {
	b.fallback = ring.FallbackTAP
	defer func() { b.fallback = ring.FallbackNone }()
	return b.txRing()
}

func (b *bench) rxRingTAP() (sample, error) {
	b.fallback = ring.FallbackTAP
	defer func() { b.fallback = ring.FallbackNone }()
	return b.rxRing()
}

// reportTAP prints the TAP path next to the afxdp path and the kernel.
func reportTAP(o options, res map[string][]sample) {
	if len(res["tx-ring-tap"]) == 0 && len(res["rx-ring-tap"]) == 0 {
		return
	}
	m := func(c string) float64 { return deliveredMpps(res, c) }
	for _, dir := range []string{"tx", "rx"} {
		tap, afxdp, kernel := m(dir+"-ring-tap"), m(dir+"-ring"), m(dir+"-kernel")
		if tap == 0 {
			continue
		}
		fmt.Printf("%s %d-byte UDP, TAP path %.3f Mpps, afxdp %.3f, kernel %.3f (medians of %d, delivered); TAP/afxdp %.2fx, TAP/kernel %.2fx\n",
			dir, o.size, tap, afxdp, kernel, len(res[dir+"-ring-tap"]), ratioOrZero(tap, afxdp), ratioOrZero(tap, kernel))
	}
}

func ratioOrZero(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// deliveredMpps is case c's median delivered rate in Mpps (0 when it did
// not run): what the side-by-side reports compare.
func deliveredMpps(res map[string][]sample, c string) float64 {
	if len(res[c]) == 0 {
		return 0
	}
	return median(col(res[c], func(s sample) float64 { return s.delivered })) / 1e6
}
