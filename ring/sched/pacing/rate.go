package pacing

import (
	"fmt"
	"math"
)

// Rate is one pacing setting in the terms of SO_MAX_PACING_RATE's extended
// form and of the device's rate table: identical Rates share a table entry.
type Rate struct {
	// Kbps is the rate in kbit/s (1000 bit/s), of wire bytes.
	Kbps uint32
	// MaxBurst is the burst allowance in bytes: how much may leave back to
	// back before the rate is enforced, and how much lateness the pacer
	// can make up. 0 selects DefaultBurst.
	MaxBurst uint32
	// TypicalBytes is the typical frame size in bytes, used only to size
	// the default burst (0: a full 1514-byte Ethernet frame).
	TypicalBytes uint16
}

func (r Rate) String() string {
	s := FormatKbps(r.Kbps)
	if r.MaxBurst != 0 || r.TypicalBytes != 0 {
		s += fmt.Sprintf(" burst %d typical %d", r.MaxBurst, r.TypicalBytes)
	}
	return s
}

// FormatKbps renders a rate in kbit/s with a readable unit.
func FormatKbps(kbps uint32) string {
	switch {
	case kbps >= 1_000_000 && kbps%10_000 == 0:
		return fmt.Sprintf("%gGbit/s", float64(kbps)/1e6)
	case kbps >= 1_000 && kbps%10 == 0:
		return fmt.Sprintf("%gMbit/s", float64(kbps)/1e3)
	}
	return fmt.Sprintf("%dkbit/s", kbps)
}

// Default burst sizing (see DefaultBurst).
const (
	// DefaultTypicalBytes is the frame size assumed when TypicalBytes is 0.
	DefaultTypicalBytes = 1514
	// BurstTime is how much sending time the default burst covers: a
	// pacer woken up to this late still keeps the long-run rate exact.
	BurstTime = 200_000 // ns
	// MaxDefaultBurst caps the default burst at high rates.
	MaxDefaultBurst = 256 << 10
)

// Burst returns the burst allowance in bytes: MaxBurst when set, else
// DefaultBurst.
func (r Rate) Burst() uint32 {
	if r.MaxBurst != 0 {
		return r.MaxBurst
	}
	return r.DefaultBurst()
}

// DefaultBurst is the burst used when MaxBurst is 0: BurstTime worth of
// the rate, at least two typical frames and at most MaxDefaultBurst. Two
// frames let a pacer woken up late send the late frame and the next one
// on time; BurstTime covers the wake-up delays of a loaded machine.
func (r Rate) DefaultBurst() uint32 {
	typ := uint64(r.TypicalBytes)
	if typ == 0 {
		typ = DefaultTypicalBytes
	}
	b := uint64(r.Kbps) * BurstTime / 8_000_000 // kbit/s × ns → bytes
	b = max(b, 2*typ)
	return uint32(min(b, MaxDefaultBurst))
}

// Cost returns how long b wire bytes take at the rate, in nanoseconds
// (rounded down; Pacer carries the remainder).
func (r Rate) Cost(b int) int64 {
	if r.Kbps == 0 {
		return 0
	}
	return int64(uint64(b) * 8_000_000 / uint64(r.Kbps))
}

// BytesPerSecond is the rate as SO_MAX_PACING_RATE reads it back (kbit/s
// × 125), saturated at the u32 maximum.
func (r Rate) BytesPerSecond() uint32 {
	return uint32(min(uint64(r.Kbps)*125, math.MaxUint32))
}

// KbpsFromBytesPerSecond converts SO_MAX_PACING_RATE's bytes/s to kbit/s
// (÷125, rounded down).
func KbpsFromBytesPerSecond(bps uint32) uint32 { return bps / 125 }
