package ring

import (
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/bypassd/bypassd/ring/clock/tsconv"
	"github.com/bypassd/bypassd/ring/qp"
)

// sysClock is a "device" clock that is the system clock itself.
type sysClock struct{}

func (sysClock) Sample() (tsconv.Sample, error) {
	b := time.Now().UnixNano()
	hw := uint64(time.Now().UnixNano())
	return tsconv.Sample{SysBefore: b, HW: hw, SysAfter: time.Now().UnixNano()}, nil
}

// clockProv is the part of a provider openProviderClock uses.
type clockProv struct {
	qp.Provider
	clock tsconv.Clock
	caps  tsconv.Capabilities
}

func (p clockProv) Caps() qp.Caps                              { return qp.Caps{Provider: "test"} }
func (p clockProv) Clock() (tsconv.Clock, tsconv.Capabilities) { return p.clock, p.caps }

func TestOpenProviderClock(t *testing.T) {
	for _, tc := range []struct {
		name      string
		requested tsconv.Mode
		prov      clockProv
		want      tsconv.Mode
		why       string
	}{
		{"sync", tsconv.ModeSync, clockProv{clock: sysClock{}, caps: tsconv.Capabilities{Timestamps: true, Clock: true}}, tsconv.ModeSync, ""},
		{"no timestamps", tsconv.ModeSync, clockProv{caps: tsconv.Capabilities{}}, tsconv.ModeDisable, "delivers none"},
		{"no clock", tsconv.ModeSync, clockProv{caps: tsconv.Capabilities{Timestamps: true}}, tsconv.ModeDisable, "no readable hardware clock"},
		{"raw", tsconv.ModeRaw, clockProv{clock: sysClock{}, caps: tsconv.Capabilities{Timestamps: true, Clock: true}}, tsconv.ModeRaw, ""},
		{"best", tsconv.ModeBest, clockProv{clock: sysClock{}, caps: tsconv.Capabilities{Timestamps: true, Clock: true}}, tsconv.ModeSync, "resolved to sync"},
	} {
		r := &Ring{cfg: Config{HWTimestamps: tc.requested}, prov: tc.prov, log: zap.NewNop()}
		h, why, err := r.openProviderClock(tc.prov)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := tsconv.ModeDisable
		if h != nil {
			got = h.conv.Mode()
		}
		if got != tc.want || !strings.Contains(why, tc.why) {
			t.Errorf("%s: mode %v (%q), want %v (%q)", tc.name, got, why, tc.want, tc.why)
		}
		if h != nil && got == tsconv.ModeSync {
			// The converter samples the provider's clock.
			if err := h.conv.Update(time.Now()); err != nil {
				t.Fatalf("%s: update: %v", tc.name, err)
			}
			now := time.Now().UnixNano()
			if sys, ok := h.conv.Convert(uint64(now)); !ok || sys-now > int64(time.Millisecond) || now-sys > int64(time.Millisecond) {
				t.Errorf("%s: converted %d for %d", tc.name, sys, now)
			}
		}
	}
}
