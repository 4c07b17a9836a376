package qos

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestParseRate(t *testing.T) {
	for _, c := range []struct {
		in   string
		kbps uint64
	}{
		{"3", 3_000_000}, {"0.1", 100_000}, {"0", 0}, {"100M", 100_000}, {"100Mbps", 100_000},
		{"2.5G", 2_500_000}, {"500k", 500}, {"1Gbit", 1_000_000}, {" 8 ", 8_000_000},
	} {
		got, err := ParseRate(c.in)
		if err != nil || got != c.kbps {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", c.in, got, err, c.kbps)
		}
	}
	for _, in := range []string{"", "fast", "-1", "NaN", "0.0000001", "401"} {
		if _, err := ParseRate(in); err == nil {
			t.Errorf("ParseRate(%q) accepted", in)
		}
	}
	for kbps, want := range map[uint64]string{0: "unlimited", 3_000_000: "3 Gbps", 100_000: "100 Mbps", 1500: "1500 Kbps"} {
		if got := FormatRate(kbps); got != want {
			t.Errorf("FormatRate(%d) = %q, want %q", kbps, got, want)
		}
	}
}

// Every validation error says what is wrong and what to do.
func TestSettersAndValidationErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		do   func(*Config) error
		want string
	}{
		{"tsa unknown", func(c *Config) error { return c.SetTSA("ets,fair") }, `tsa: tc 1: "fair" is not a transmission algorithm: use strict or ets`},
		{"tsa vendor", func(c *Config) error { return c.SetTSA("vendor") }, `use strict or ets`},
		{"tsa too long", func(c *Config) error { return c.SetTSA("ets,ets,ets,ets,ets,ets,ets,ets,ets") }, "tsa: 9 values, at most 8"},
		{"tsa empty", func(c *Config) error { return c.SetTSA("") }, "tsa: empty list"},
		{"tcbw over", func(c *Config) error { return c.SetTCBW("30,170") }, `tcbw: entry 1 is "170", want 0..100`},
		{"tcbw junk", func(c *Config) error { return c.SetTCBW("x") }, `tcbw: entry 0 is "x", want 0..100`},
		{"prio_tc 8", func(c *Config) error { return c.SetPrioTC("0,8") }, `prio_tc: entry 1 is "8", want 0..7`},
		{"skprio 17 entries", func(c *Config) error { return c.SetSkPrioUP(strings.Repeat("0,", 16) + "0") }, "skprio_up: 17 values, at most 16"},
		{"ratelimit junk", func(c *Config) error { return c.SetRateLimit("1,fast") }, `ratelimit: tc 1: rate "fast": want Gbit/s`},
		{"dscp2prio form", func(c *Config) error { return c.SetDSCP2Prio("30,2") }, "want set,DSCP,PRIO or del,DSCP,PRIO"},
		{"dscp2prio dscp", func(c *Config) error { return c.SetDSCP2Prio("set,64,2") }, `DSCP "64", want 0..63`},
		{"dscp2prio prio", func(c *Config) error { return c.SetDSCP2Prio("set,30,9") }, `priority "9", want 0..7`},
		{"dscp2prio action", func(c *Config) error { return c.SetDSCP2Prio("add,30,2") }, `action "add", want set or del`},
		{"dscp2prio del other", func(c *Config) error { return c.SetDSCP2Prio("del,30,2") }, "dscp 30 maps to priority 3, not 2"},
		{"sum", func(c *Config) error { _ = c.SetTSA("ets,ets"); _ = c.SetTCBW("30,60"); return c.Validate() },
			"the ETS classes' bandwidths sum to 90%, want 100%: give -t/--tcbw a percentage for every tc (tc 0 ets 30%, tc 1 ets 60%, tc 2 ets 0%"},
		{"traffic class", func(c *Config) error { c.TrafficClass = 256; return c.Validate() }, "traffic_class 256: use a ToS byte 0..255 (DSCP × 4, e.g. 96 for DSCP 24) or -1 for off"},
		{"trust", func(c *Config) error { c.Trust = 5; return c.Validate() }, "trust 5: use pcp or dscp"},
		{"rate", func(c *Config) error { c.RateKbps[3] = MaxRateKbps + 1; return c.Validate() }, "tc 3: rate limit 400000001 Kbps exceeds 400 Gbps"},
	} {
		cfg := Default()
		err := c.do(&cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to contain %q", c.name, err, c.want)
		}
	}
	if _, err := ParseTrust("none"); err == nil || err.Error() != `trust "none": use pcp or dscp` {
		t.Errorf("ParseTrust: %v", err)
	}
}

// Short lists: -s and -r leave the TCs they do not list alone, -p and -t
// reset them to 0 (the document's example shows UP 7 in TC 0 after
// -p 0,1,1,1,2,2,2).
func TestShortLists(t *testing.T) {
	c := Default()
	if err := c.SetRateLimit("0,0,0,0,0,0,0,5"); err != nil {
		t.Fatal(err)
	}
	if err := c.SetRateLimit("3,4,2"); err != nil {
		t.Fatal(err)
	}
	if c.RateKbps != [NumTC]uint64{3e6, 4e6, 2e6, 0, 0, 0, 0, 5e6} {
		t.Errorf("ratelimit %v", c.RateKbps)
	}
	if err := c.SetTSA("strict"); err != nil {
		t.Fatal(err)
	}
	if c.TSA[0] != Strict || c.TSA[1] != ETS {
		t.Errorf("tsa %v", c.TSA)
	}
	if err := c.SetTCBW("30,70"); err != nil {
		t.Fatal(err)
	}
	if c.BW != [NumTC]uint8{30, 70} {
		t.Errorf("tcbw %v", c.BW)
	}
	// TC 0 is strict now, so only 70 % is ETS.
	if err := c.Validate(); err == nil {
		t.Error("ETS sum of 70% accepted")
	}
}

func TestConfigJSON(t *testing.T) {
	c := Default()
	_ = c.SetTSA("ets,ets,strict")
	_ = c.SetTCBW("30,70")
	c.Trust = TrustDSCP
	c.TrafficClass = 96
	b, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"tsa":["ets","ets","strict","ets"`) || !strings.Contains(string(b), `"trust":"dscp"`) {
		t.Errorf("JSON %s", b)
	}
	var back Config
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back != c {
		t.Errorf("round trip: %+v, want %+v", back, c)
	}
	// Missing keys come from Default; a document that does not validate
	// is refused.
	var part Config
	if err := json.Unmarshal([]byte(`{"trust":"dscp"}`), &part); err != nil {
		t.Fatal(err)
	}
	if d := Default(); part.Trust != TrustDSCP || part.PrioTC != d.PrioTC || part.TrafficClass != -1 {
		t.Errorf("partial document: %+v", part)
	}
	if err := json.Unmarshal([]byte(`{"tcbw":[50]}`), &part); err == nil || !strings.Contains(err.Error(), "sum to 50%") {
		t.Errorf("invalid document: %v", err)
	}
	if err := json.Unmarshal([]byte(`{"tsa":["fair"]}`), &part); err == nil {
		t.Error("unknown tsa accepted")
	}
}
