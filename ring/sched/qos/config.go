package qos

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// TSA is a traffic class's transmission selection algorithm.
type TSA uint8

const (
	// ETS classes share what the strict classes leave by their bandwidth
	// percentages (a minimum guarantee: what one does not use, the others
	// get).
	ETS TSA = iota
	// Strict classes send before every ETS class and before every strict
	// class of a lower number (TC 7 first).
	Strict
)

func (t TSA) String() string {
	if t == Strict {
		return "strict"
	}
	return "ets"
}

// ParseTSA parses "strict" or "ets".
func ParseTSA(s string) (TSA, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "strict":
		return Strict, nil
	case "ets":
		return ETS, nil
	case "vendor":
		return 0, errors.New(`"vendor" is the NIC firmware's own algorithm; bypassd schedules in software: use strict or ets`)
	}
	return 0, fmt.Errorf("%q is not a transmission algorithm: use strict or ets", s)
}

// MarshalText writes the name.
func (t TSA) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// UnmarshalText reads a name.
func (t *TSA) UnmarshalText(b []byte) error {
	v, err := ParseTSA(string(b))
	*t = v
	return err
}

// Trust is what decides a received frame's priority.
type Trust uint8

const (
	// TrustPCP takes the VLAN tag's PCP (untagged: priority 0), the
	// default, as on ConnectX.
	TrustPCP Trust = iota
	// TrustDSCP takes the IP header's DSCP through the dscp2prio map.
	TrustDSCP
)

func (t Trust) String() string {
	if t == TrustDSCP {
		return "dscp"
	}
	return "pcp"
}

// ParseTrust parses "pcp" or "dscp".
func ParseTrust(s string) (Trust, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "pcp":
		return TrustPCP, nil
	case "dscp":
		return TrustDSCP, nil
	}
	return 0, fmt.Errorf("trust %q: use pcp or dscp", s)
}

// MarshalText writes the name.
func (t Trust) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// UnmarshalText reads a name.
func (t *Trust) UnmarshalText(b []byte) error {
	v, err := ParseTrust(string(b))
	*t = v
	return err
}

// MaxRateKbps bounds a rate limit (400 Gbit/s): beyond any port here, and
// small enough that the scheduler's arithmetic cannot overflow.
const MaxRateKbps = 400_000_000

// Config is one interface's QoS state: what mlnx_qos shows and sets, the
// kernel's egress map (sk_prio → UP), the port rate limit, and the forced
// traffic class and TTL of the RoCE document. The zero value is not
// valid; start from Default. JSON keys are those of the daemon's QoS file
// and of the "qos" QUERY document.
type Config struct {
	// TSA, BW (percent, used for ETS classes, summing to 100 over them)
	// and RateKbps (0: unlimited) are per traffic class.
	TSA      [NumTC]TSA    `json:"tsa"`
	BW       [NumTC]uint8  `json:"tcbw"`
	RateKbps [NumTC]uint64 `json:"ratelimit_kbps"`
	// PrioTC maps a user priority to its traffic class (mlnx_qos -p).
	PrioTC [NumTC]uint8 `json:"prio_tc"`
	// SkPrioUP is the egress map: sk_prio & 15 → user priority (what
	// vconfig set_egress_map and tc_wrap -u set).
	SkPrioUP [NumSkPrio]uint8 `json:"skprio_up"`
	// Trust and DSCP2Prio classify received frames.
	Trust     Trust     `json:"trust"`
	DSCP2Prio [64]uint8 `json:"dscp2prio"`
	// MaxRateKbps limits the whole ring (the queue's tx_maxrate; 0:
	// unlimited): the line rate the classes share, on links that have
	// none of their own (veth) or to leave room for the kernel's traffic.
	MaxRateKbps uint64 `json:"maxrate_kbps"`
	// TrafficClass, when 0..255, is the ToS byte of every datagram sent
	// on the interface whatever its socket asked (DSCP × 4, plus ECN);
	// -1 leaves the sockets' own.
	TrafficClass int `json:"traffic_class"`
	// TTL, when not 0, is the TTL / hop limit of every datagram sent.
	TTL uint8 `json:"ttl"`
}

// Default returns the state of an interface nobody configured: every class
// ETS with an equal share (12 or 13 %, as ConnectX firmware sets it), no
// limits, the 802.1Q priority-to-class table (UP 0 → TC 1, UP 1 → TC 0,
// others to their own number), sk_prio n → UP n for 0..7 (tc_wrap's
// listing), trust PCP, dscp2prio DSCP/8 (the document's listing), nothing
// forced.
func Default() Config {
	c := Config{TrafficClass: -1}
	for tc := range NumTC {
		c.BW[tc] = 12 + uint8(tc&1^1)
		c.PrioTC[tc] = uint8(tc)
	}
	c.PrioTC[0], c.PrioTC[1] = 1, 0
	for p := range NumTC {
		c.SkPrioUP[p] = uint8(p)
	}
	for d := range c.DSCP2Prio {
		c.DSCP2Prio[d] = uint8(d >> 3)
	}
	return c
}

// Validate checks c and says what to change.
func (c *Config) Validate() error {
	var errs []error
	sum, ets := 0, 0
	for tc := range NumTC {
		switch c.TSA[tc] {
		case ETS:
			sum += int(c.BW[tc])
			ets++
		case Strict:
		default:
			errs = append(errs, fmt.Errorf("tc %d: transmission algorithm %d: use strict or ets", tc, c.TSA[tc]))
		}
		if c.BW[tc] > 100 {
			errs = append(errs, fmt.Errorf("tc %d: bandwidth %d%% exceeds 100%%", tc, c.BW[tc]))
		}
		if c.RateKbps[tc] > MaxRateKbps {
			errs = append(errs, fmt.Errorf("tc %d: rate limit %s exceeds %s", tc, FormatRate(c.RateKbps[tc]), FormatRate(MaxRateKbps)))
		}
		if c.PrioTC[tc] >= NumTC {
			errs = append(errs, fmt.Errorf("prio_tc: priority %d maps to tc %d; traffic classes are 0..7", tc, c.PrioTC[tc]))
		}
	}
	if ets > 0 && sum != 100 {
		errs = append(errs, fmt.Errorf("the ETS classes' bandwidths sum to %d%%, want 100%%: give -t/--tcbw a percentage for every tc (%s)", sum, c.etsList()))
	}
	for p, up := range c.SkPrioUP {
		if up >= NumTC {
			errs = append(errs, fmt.Errorf("skprio_up: sk_prio %d maps to priority %d; priorities are 0..7", p, up))
		}
	}
	for d, p := range c.DSCP2Prio {
		if p >= NumTC {
			errs = append(errs, fmt.Errorf("dscp2prio: dscp %d maps to priority %d; priorities are 0..7", d, p))
		}
	}
	if c.Trust != TrustPCP && c.Trust != TrustDSCP {
		errs = append(errs, fmt.Errorf("trust %d: use pcp or dscp", c.Trust))
	}
	if c.MaxRateKbps > MaxRateKbps {
		errs = append(errs, fmt.Errorf("port rate limit %s exceeds %s", FormatRate(c.MaxRateKbps), FormatRate(MaxRateKbps)))
	}
	if c.TrafficClass < -1 || c.TrafficClass > 255 {
		errs = append(errs, fmt.Errorf("traffic_class %d: use a ToS byte 0..255 (DSCP × 4, e.g. 96 for DSCP 24) or -1 for off", c.TrafficClass))
	}
	return errors.Join(errs...)
}

// etsList names the ETS classes and their shares, for error messages.
func (c *Config) etsList() string {
	var b strings.Builder
	for tc := range NumTC {
		if c.TSA[tc] != ETS {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "tc %d ets %d%%", tc, c.BW[tc])
	}
	return b.String()
}

// MarshalJSON is the plain encoding; it exists so that UnmarshalJSON
// below can start from Default.
func (c Config) MarshalJSON() ([]byte, error) {
	type plain Config
	return json.Marshal(plain(c))
}

// UnmarshalJSON fills keys missing from the document from Default, so a
// file may give only what it changes, and validates the result.
func (c *Config) UnmarshalJSON(b []byte) error {
	type plain Config
	p := plain(Default())
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	v := Config(p)
	if err := v.Validate(); err != nil {
		return err
	}
	*c = v
	return nil
}

// The mlnx_qos list options. Each applies to the TCs (or priorities) it
// lists, from 0 up; a shorter list leaves the rest as they were, except
// where mlnx_qos's own examples show otherwise (-p and -t reset the rest
// to 0).

// splitList splits a comma-separated list of at most max entries, one per
// tc or priority (per sk_prio for the egress map).
func splitList(what, s string, max int) ([]string, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, fmt.Errorf("%s: empty list", what)
	}
	f := strings.Split(s, ",")
	if len(f) > max {
		return nil, fmt.Errorf("%s: %d values, at most %d", what, len(f), max)
	}
	return f, nil
}

func parseSmall(what string, i int, s string, limit int) (uint8, error) {
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || v < 0 || v >= limit {
		return 0, fmt.Errorf("%s: entry %d is %q, want 0..%d", what, i, s, limit-1)
	}
	return uint8(v), nil
}

// SetTSA applies an mlnx_qos -s/--tsa list ("ets,ets,strict").
func (c *Config) SetTSA(list string) error {
	f, err := splitList("tsa", list, NumTC)
	if err != nil {
		return err
	}
	for i, s := range f {
		t, err := ParseTSA(s)
		if err != nil {
			return fmt.Errorf("tsa: tc %d: %w", i, err)
		}
		c.TSA[i] = t
	}
	return nil
}

// SetTCBW applies an mlnx_qos -t/--tcbw list of percentages; TCs not
// listed get 0 (ETS classes with 0 % still send when the others leave
// room, and a minimal share otherwise, so none starves).
func (c *Config) SetTCBW(list string) error {
	f, err := splitList("tcbw", list, NumTC)
	if err != nil {
		return err
	}
	var bw [NumTC]uint8
	for i, s := range f {
		if bw[i], err = parseSmall("tcbw", i, s, 101); err != nil {
			return err
		}
	}
	c.BW = bw
	return nil
}

// SetRateLimit applies an mlnx_qos -r/--ratelimit list: Gbit/s per TC as
// mlnx_qos takes them (decimals allowed: 0.1 is 100 Mbit/s), or with a
// unit (100M, 2.5G, 500K); 0 is unlimited.
func (c *Config) SetRateLimit(list string) error {
	f, err := splitList("ratelimit", list, NumTC)
	if err != nil {
		return err
	}
	for i, s := range f {
		v, err := ParseRate(s)
		if err != nil {
			return fmt.Errorf("ratelimit: tc %d: %w", i, err)
		}
		c.RateKbps[i] = v
	}
	return nil
}

// SetPrioTC applies an mlnx_qos -p/--prio_tc list: the TC of each UP from
// 0; UPs not listed go to TC 0 (as the document's example shows).
func (c *Config) SetPrioTC(list string) error {
	f, err := splitList("prio_tc", list, NumTC)
	if err != nil {
		return err
	}
	var m [NumTC]uint8
	for i, s := range f {
		if m[i], err = parseSmall("prio_tc", i, s, NumTC); err != nil {
			return err
		}
	}
	c.PrioTC = m
	return nil
}

// SetSkPrioUP applies a tc_wrap -u list: the UP of each sk_prio from 0 (at
// most 16); sk_prios not listed keep theirs.
func (c *Config) SetSkPrioUP(list string) error {
	f, err := splitList("skprio_up", list, NumSkPrio)
	if err != nil {
		return err
	}
	for i, s := range f {
		if c.SkPrioUP[i], err = parseSmall("skprio_up", i, s, NumTC); err != nil {
			return err
		}
	}
	return nil
}

// SetDSCP2Prio applies an mlnx_qos --dscp2prio argument: "set,DSCP,PRIO"
// maps DSCP to PRIO, "del,DSCP,PRIO" resets DSCP to priority 0 (the
// document's words; PRIO must be the one it had).
func (c *Config) SetDSCP2Prio(arg string) error {
	f := strings.Split(arg, ",")
	if len(f) != 3 {
		return fmt.Errorf("dscp2prio %q: want set,DSCP,PRIO or del,DSCP,PRIO (e.g. set,30,2)", arg)
	}
	d, err := strconv.Atoi(strings.TrimSpace(f[1]))
	if err != nil || d < 0 || d > 63 {
		return fmt.Errorf("dscp2prio %q: DSCP %q, want 0..63", arg, f[1])
	}
	p, err := strconv.Atoi(strings.TrimSpace(f[2]))
	if err != nil || p < 0 || p >= NumTC {
		return fmt.Errorf("dscp2prio %q: priority %q, want 0..7", arg, f[2])
	}
	switch strings.TrimSpace(f[0]) {
	case "set":
		c.DSCP2Prio[d] = uint8(p)
	case "del":
		if int(c.DSCP2Prio[d]) != p {
			return fmt.Errorf("dscp2prio %q: dscp %d maps to priority %d, not %d", arg, d, c.DSCP2Prio[d], p)
		}
		c.DSCP2Prio[d] = 0
	default:
		return fmt.Errorf("dscp2prio %q: action %q, want set or del", arg, f[0])
	}
	return nil
}

// ParseRate parses a rate: a bare number is Gbit/s (mlnx_qos's unit), or a
// number with K, M or G (optionally followed by "bps" or "bit"). It
// returns kbit/s; 0 means unlimited.
func ParseRate(s string) (uint64, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "bps"), "bit")
	mult := 1e6 // Gbit/s in kbit/s
	switch {
	case strings.HasSuffix(t, "g"):
		t = t[:len(t)-1]
	case strings.HasSuffix(t, "m"):
		t, mult = t[:len(t)-1], 1e3
	case strings.HasSuffix(t, "k"):
		t, mult = t[:len(t)-1], 1
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(t), 64)
	if err != nil || v < 0 || v != v {
		return 0, fmt.Errorf("rate %q: want Gbit/s (3, 0.1) or a number with K, M or G (100M); 0 is unlimited", s)
	}
	k := v * mult
	if k > MaxRateKbps {
		return 0, fmt.Errorf("rate %q exceeds %s", s, FormatRate(MaxRateKbps))
	}
	if k > 0 && k < 1 {
		return 0, fmt.Errorf("rate %q is below 1 kbit/s (the resolution); use 0 for unlimited", s)
	}
	return uint64(k + 0.5), nil
}

// FormatRate prints kbit/s as mlnx_qos does ("3 Gbps"), in Mbps or Kbps
// when not a whole number of the larger unit, "unlimited" for 0.
func FormatRate(kbps uint64) string {
	switch {
	case kbps == 0:
		return "unlimited"
	case kbps%1_000_000 == 0:
		return fmt.Sprintf("%d Gbps", kbps/1_000_000)
	case kbps%1000 == 0:
		return fmt.Sprintf("%d Mbps", kbps/1000)
	}
	return fmt.Sprintf("%d Kbps", kbps)
}
