package main

import (
	"fmt"

	"github.com/bypassd/bypassd/ring/tsconv"
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
	s, err := b.rxRing()
	if err == nil && !b.lastRing.Program().RXTimestamps() {
		err = fmt.Errorf("the timestamping XDP program is not attached: %v", b.lastRing.Program().RXTimestampsRefused())
	}
	return s, err
}

func (b *bench) rxShimTS() (sample, error) {
	b.shimTS = true
	defer func() { b.shimTS = false }()
	return b.rxShim()
}

// reportTS compares the RX cases with timestamping on and off, interleaved
// run by run with the other cases.
func reportTS(o options, res map[string][]sample) {
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
}
