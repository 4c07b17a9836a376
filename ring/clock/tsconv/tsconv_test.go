package tsconv

import (
	"math"
	"testing"
	"time"
)

func TestParseMode(t *testing.T) {
	for in, want := range map[string]Mode{
		"0": ModeDisable, "1": ModeRaw, "2": ModeBest, "3": ModeSync, "4": ModePTP,
		"disable": ModeDisable, "RAW": ModeRaw, " best ": ModeBest, "sync": ModeSync, "Ptp": ModePTP,
	} {
		got, err := ParseMode(in)
		if err != nil || got != want {
			t.Errorf("ParseMode(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "5", "-1", "fast", "3x"} {
		if _, err := ParseMode(in); err == nil {
			t.Errorf("ParseMode(%q) accepted", in)
		}
	}
	if s := Mode(9).String(); s != "mode(9)" {
		t.Errorf("Mode(9).String() = %q", s)
	}
	if DefaultMode != ModeSync {
		t.Errorf("default mode %v, want sync", DefaultMode)
	}
}

func TestResolve(t *testing.T) {
	none := Capabilities{}
	ts := Capabilities{Timestamps: true}
	clk := Capabilities{Timestamps: true, Clock: true}
	ptp := Capabilities{Timestamps: true, Clock: true, PTP: true}
	cases := []struct {
		req  Mode
		caps Capabilities
		want Mode
		note bool
	}{
		{ModeDisable, ptp, ModeDisable, false},
		{ModeRaw, ts, ModeRaw, false},
		{ModeRaw, none, ModeDisable, true},
		{ModeBest, clk, ModeSync, true},
		{ModeBest, ts, ModeRaw, true},
		{ModeBest, none, ModeDisable, true},
		{ModeSync, clk, ModeSync, false},
		{ModeSync, ts, ModeDisable, true},
		{ModePTP, ptp, ModePTP, false},
		{ModePTP, clk, ModeSync, true},
		{ModePTP, ts, ModeDisable, true},
		{Mode(7), ptp, ModeDisable, true},
	}
	for _, tc := range cases {
		got, why := Resolve(tc.req, tc.caps)
		if got != tc.want || (why != "") != tc.note {
			t.Errorf("Resolve(%v, %+v) = %v, %q; want %v (reason given: %v)", tc.req, tc.caps, got, why, tc.want, tc.note)
		}
	}
	if got := Lowest(ModePTP, ModeSync, ModeRaw, ModeSync); got != ModeRaw {
		t.Errorf("Lowest = %v, want raw", got)
	}
	if got := Lowest(); got != ModeDisable {
		t.Errorf("Lowest() = %v, want disable", got)
	}
}

func TestModeDisable(t *testing.T) {
	c, err := New(ModeDisable, nil, Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, hw := range []uint64{0, 1, 1 << 40, math.MaxUint64} {
		if v, ok := c.Convert(hw); ok || v != 0 {
			t.Errorf("disable: Convert(%d) = %d, %v; want 0, false", hw, v, ok)
		}
	}
	if _, ok := c.EstimatedErrorNs(); ok {
		t.Error("disable reports an error estimate")
	}
}

func TestModePTPIdentity(t *testing.T) {
	c, err := New(ModePTP, nil, Config{NominalHz: 156_250_000})
	if err != nil {
		t.Fatal(err)
	}
	for _, hw := range []uint64{0, 1, 1_700_000_000_123_456_789, math.MaxInt64} {
		if v, ok := c.Convert(hw); !ok || v != int64(hw) {
			t.Errorf("ptp: Convert(%d) = %d, %v; want identity", hw, v, ok)
		}
	}
	if _, ok := c.Convert(math.MaxUint64); ok {
		t.Error("ptp: value beyond int64 accepted")
	}
}

func TestModeRaw(t *testing.T) {
	cases := []struct {
		hz   uint64
		hw   uint64
		want int64
		ok   bool
	}{
		{1e9, 12345, 12345, true},
		{1e9, math.MaxUint64, 0, false},
		{156_250_000, 156_250_000, 1e9, true},
		{156_250_000, 3, 19, true}, // 19.2 ns truncated
		{10e9, math.MaxUint64, int64(math.MaxUint64 / 10), true},
		{1, math.MaxUint64, 0, false}, // overflow caught, no wrap
	}
	for _, tc := range cases {
		c, err := New(ModeRaw, nil, Config{NominalHz: tc.hz})
		if err != nil {
			t.Fatal(err)
		}
		v, ok := c.Convert(tc.hw)
		if ok != tc.ok || (ok && v != tc.want) {
			t.Errorf("raw %d Hz: Convert(%d) = %d, %v; want %d, %v", tc.hz, tc.hw, v, ok, tc.want, tc.ok)
		}
	}
}

func TestNew(t *testing.T) {
	clk := ClockFunc(func() (Sample, error) { return Sample{}, nil })
	if c, err := New(ModeBest, clk, Config{}); err != nil || c.Mode() != ModeSync {
		t.Errorf("best with clock: %v, %v; want sync", c, err)
	}
	if c, err := New(ModeBest, nil, Config{}); err != nil || c.Mode() != ModeRaw {
		t.Errorf("best without clock: %v, %v; want raw", c, err)
	}
	if _, err := New(ModeSync, nil, Config{}); err == nil {
		t.Error("sync without clock accepted")
	}
	if _, err := New(Mode(5), clk, Config{}); err == nil {
		t.Error("mode 5 accepted")
	}
	bad := []Config{
		{Interval: -1},
		{Window: 1},
		{SamplesPerUpdate: -2},
		{MaxPPM: -3},
		{StepThreshold: -1},
		{Warmup: []time.Duration{200, 100}},
	}
	for _, cfg := range bad {
		if _, err := New(ModeSync, clk, cfg); err == nil {
			t.Errorf("config %+v accepted", cfg)
		}
	}
	c, err := New(ModeSync, clk, Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Convert(1); ok {
		t.Error("sync converts before the first sample")
	}
	if _, ok := c.Snapshot(); ok {
		t.Error("snapshot before the first sample")
	}
}
