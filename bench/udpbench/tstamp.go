package main

import (
	"fmt"
	"os"
	"time"

	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/clock/tsconv"
)

// Receive timestamping on vs off. rx-ring-ts opens the ring asking for
// hardware timestamps (mode 1): the device-bound XDP variant calls the
// metadata kfunc and writes its result in front of every redirected frame,
// and the AF_XDP provider reads it (veth has no hardware clock, so the
// stamps are absent, but every step runs). rx-shim-ts has the application
// ask for every timestamp slot (SO_TIMESTAMPING) and receive them with
// ReadBatch. The software stamp is taken in every case (it is part of the
// record), so "off" is the plain program and a socket without
// SO_TIMESTAMPING.

func (b *bench) rxRingTS() (sample, error) {
	b.hwts = tsconv.ModeRaw
	defer func() { b.hwts = tsconv.ModeDisable }()
	return b.rxRing()
}

// checkTimestamping makes sure a ring opened for rx-ring-ts really runs
// the timestamping program (openRing calls it while the ring is open).
func (b *bench) checkTimestamping(r *ring.Ring) error {
	if b.hwts == tsconv.ModeDisable {
		return nil
	}
	if p := r.Program(); p == nil || !p.RXTimestamps() {
		return fmt.Errorf("rx-ring-ts: the timestamping XDP program is not attached (%v)", p.RXTimestampsRefused())
	}
	return nil
}

func (b *bench) rxShimTS() (sample, error) {
	b.shimTS = true
	defer func() { b.shimTS = false }()
	return b.rxShim()
}

// xdpCost accumulates the XDP program's run count and run time over the
// rx-ring runs of one variant (kernel run-time statistics, enabled for
// -ts-cmp): the program's own cost per frame, which the load on a shared
// machine disturbs far less than the rates.
type xdpCost struct {
	runs uint64
	time time.Duration
}

// recordXDP adds the ring's program statistics to the current variant.
func (b *bench) recordXDP(r *ring.Ring) {
	p := r.Program()
	if p == nil || !b.o.tsCmp {
		return
	}
	runs, total, err := p.RunStats()
	if err != nil {
		fmt.Fprintf(os.Stderr, "XDP run statistics: %v\n", err)
		return
	}
	c := &b.xdpPlain
	if p.RXTimestamps() {
		c = &b.xdpTS
	}
	c.runs += runs
	c.time += total
}

// reportTS compares the RX cases with timestamping on and off, interleaved
// run by run with the other cases.
func reportTS(o options, res map[string][]sample, xdp [2]xdpCost) {
	dlv := func(s sample) float64 { return s.delivered }
	for _, c := range []struct{ off, on, what string }{
		{"rx-ring", "rx-ring-ts", "timestamping XDP program + metadata read"},
		{"rx-shim", "rx-shim-ts", "SO_TIMESTAMPING, all slots"},
	} {
		on, off := res[c.on], res[c.off]
		if len(on) == 0 || len(off) == 0 {
			continue
		}
		mOn, mOff := median(col(on, dlv)), median(col(off, dlv))
		fmt.Printf("%s %d-byte UDP, %s on vs off: %.3f vs %.3f Mpps delivered (medians of %d), %+.1f%% (target: cost <= 3%%)\n",
			c.off, o.size, c.what, mOn/1e6, mOff/1e6, len(on), 100*(mOn/mOff-1))
	}
	if plain, ts := xdp[0], xdp[1]; plain.runs > 0 && ts.runs > 0 {
		np := float64(plain.time) / float64(plain.runs)
		nt := float64(ts.time) / float64(ts.runs)
		fmt.Printf("XDP program per frame (kernel run-time statistics): plain %.1f ns over %d frames, timestamping variant %.1f ns over %d frames (+%.1f ns)\n",
			np, plain.runs, nt, ts.runs, nt-np)
	}
}
