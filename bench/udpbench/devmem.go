package main

import (
	"fmt"
	"slices"

	"github.com/bypassd/bypassd/ring"
)

// devMemBytes is the staging memory of the tx-ring-devmem case: the
// default per-device cap, all on one ring.
const devMemBytes = 256 << 10

// txRingDevMem is tx-ring with egress staging on: every frame over the
// inline threshold is copied into the ring's staging region and sent from
// there.
func (b *bench) txRingDevMem() (sample, error) {
	b.devMem = devMemBytes
	defer func() { b.devMem = 0 }()
	s, err := b.txRing()
	if err != nil {
		return s, err
	}
	// The counters outlive the ring's Close.
	st := b.lastRing.DevMemStats()
	b.devMemSeen.StagedPackets += st.StagedPackets
	b.devMemSeen.InlinePackets += st.InlinePackets
	b.devMemSeen.OOBPackets += st.OOBPackets
	return s, nil
}

// reportDevMem compares tx-ring with staging on and off, both interleaved
// with the other cases run by run, so drift hits them alike.
func reportDevMem(o options, res map[string][]sample, seen ring.DevMemStats) {
	on, off := res["tx-ring-devmem"], res["tx-ring"]
	if len(on) == 0 || len(off) == 0 {
		return
	}
	dlv := func(s sample) float64 { return s.delivered }
	mOn, mOff := median(col(on, dlv)), median(col(off, dlv))
	fmt.Printf("tx-ring %d-byte UDP, egress staging on (%d KiB) vs off: %.3f vs %.3f Mpps arrived (medians of %d), ratio on/off %.3f (target >= 0.98)\n",
		o.size, devMemBytes>>10, mOn/1e6, mOff/1e6, len(on), mOn/mOff)
	cpu := func(s sample) float64 { return s.cpuPerPkt }
	cOn, cOff := median(col(on, cpu)), median(col(off, cpu))
	fmt.Printf("  CPU per datagram (process, user+system): on %.0f ns, off %.0f ns (medians), ratio on/off %.3f (target <= 1.02)\n",
		cOn, cOff, cOn/cOff)
	// Runs i of both cases ran back to back: their ratios cancel the drift
	// between runs, which on a shared VM is larger than the effect.
	var rate, busy []float64
	for i := range min(len(on), len(off)) {
		rate = append(rate, on[i].delivered/off[i].delivered)
		busy = append(busy, on[i].cpuPerPkt/off[i].cpuPerPkt)
	}
	fmt.Printf("  paired runs, on/off: rate %.3f (%.2f–%.2f), CPU per datagram %.3f (%.2f–%.2f) (median, min–max of %d pairs)\n",
		median(rate), slices.Min(rate), slices.Max(rate), median(busy), slices.Min(busy), slices.Max(busy), len(rate))
	if k := res["tx-kernel"]; len(k) > 0 {
		mk := median(col(k, dlv))
		fmt.Printf("  vs the kernel in the same run: staging off %.2fx, on %.2fx\n", mOff/mk, mOn/mk)
	}
	fmt.Printf("  staging runs: %d frames staged, %d inline, %d oob\n", seen.StagedPackets, seen.InlinePackets, seen.OOBPackets)
}

// cpuNote is a run's CPU per datagram for the progress lines (TX cases).
func cpuNote(s sample) string {
	if s.cpuPerPkt == 0 {
		return ""
	}
	return fmt.Sprintf(", CPU %.0f ns/datagram", s.cpuPerPkt)
}
