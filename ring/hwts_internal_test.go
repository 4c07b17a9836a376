package ring

import (
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/dgram"
	"github.com/bypassd/bypassd/ring/clock/tsconv"
)

// offsetClock is a hardware clock running a fixed offset from the system
// clock: enough for the engine's plumbing (tsconv tests the estimator).
type offsetClock struct{ off int64 }

func (c offsetClock) Sample() (tsconv.Sample, error) {
	now := time.Now().UnixNano()
	return tsconv.Sample{SysBefore: now, HW: uint64(now + c.off), SysAfter: now}, nil
}

func TestStampsPerMode(t *testing.T) {
	// Near the present: sync mode extrapolates from its last sample in
	// float64, exact to well under a µs only over a short span.
	sw := time.Now().UnixNano()
	hw := uint64(sw + 37e9)
	for _, tc := range []struct {
		mode      tsconv.Mode
		flags     uint16
		raw, sys  int64
		clockSkew int64
	}{
		{mode: tsconv.ModeDisable, flags: dgram.FlagSWTimestamp},
		{mode: tsconv.ModeRaw, flags: dgram.FlagSWTimestamp | dgram.FlagHWRaw, raw: int64(hw)},
		{mode: tsconv.ModePTP, flags: dgram.FlagSWTimestamp | dgram.FlagHWRaw | dgram.FlagHWSys, raw: int64(hw), sys: int64(hw)},
		{mode: tsconv.ModeSync, flags: dgram.FlagSWTimestamp | dgram.FlagHWRaw | dgram.FlagHWSys, raw: int64(hw), sys: int64(hw) - 37e9, clockSkew: 37e9},
	} {
		e := &engine{r: &Ring{}}
		if tc.mode != tsconv.ModeDisable {
			var clock tsconv.Clock
			if tc.mode == tsconv.ModeSync {
				clock = offsetClock{off: tc.clockSkew}
			}
			conv, err := tsconv.New(tc.mode, clock, tsconv.Config{})
			if err != nil {
				t.Fatal(err)
			}
			if err := conv.Update(time.Now()); err != nil {
				t.Fatal(err)
			}
			e.r.hw = &hwClock{conv: conv}
		}
		st := e.stamps(sw, hw)
		if d := st.hwSys - tc.sys; st.flags != tc.flags || st.sw != sw || st.hwRaw != tc.raw || d < -1000 || d > 1000 {
			t.Errorf("mode %v: stamps %+v, want flags %#x raw %d sys %d", tc.mode, st, tc.flags, tc.raw, tc.sys)
		}
		// No hardware stamp on the frame: the slots stay absent, in
		// every mode.
		if st := e.stamps(sw, 0); st.flags != dgram.FlagSWTimestamp || st.hwRaw != 0 || st.hwSys != 0 {
			t.Errorf("mode %v without a frame stamp: %+v", tc.mode, st)
		}
	}
}

// BenchmarkStamps is the engine's per-datagram cost of building the
// record's timestamps from a frame with a hardware stamp, in sync mode
// (conversion included) and with hardware timestamps off.
func BenchmarkStamps(b *testing.B) {
	now := time.Now().UnixNano()
	for _, mode := range []tsconv.Mode{tsconv.ModeDisable, tsconv.ModeSync} {
		b.Run(mode.String(), func(b *testing.B) {
			e := &engine{r: &Ring{}}
			if mode == tsconv.ModeSync {
				conv, err := tsconv.New(mode, offsetClock{off: 37e9}, tsconv.Config{})
				if err != nil {
					b.Fatal(err)
				}
				if err := conv.Update(time.Now()); err != nil {
					b.Fatal(err)
				}
				e.r.hw = &hwClock{conv: conv}
			}
			hw := uint64(now + 37e9)
			var sink int64
			for i := range b.N {
				st := e.stamps(now, hw+uint64(i))
				sink += st.hwSys
			}
			_ = sink
		})
	}
}
