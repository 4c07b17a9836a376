// Package tsconv converts hardware receive timestamps (NIC or PHC clock
// ticks) into system time, following VMA's VMA_HW_TS_CONVERSION modes:
// 0 disable, 1 raw, 2 best possible, 3 sync to system (default), 4 PTP.
//
// It owns the conversion only: the Clock interface a hardware clock source
// implements, the mode resolution, and the sync-to-system estimator that
// keeps frequency and offset of the hardware clock relative to
// CLOCK_REALTIME. It does not own clock discovery (finding a NIC's PHC,
// opening /dev/ptpN, PTP_SYS_OFFSET_EXTENDED), the providers that read
// timestamps off frames, flag or environment parsing beyond ParseMode, or
// logging: callers log the effective mode that Resolve reports.
//
// Readers (Convert, Snapshot, EstimatedErrorNs) never block: parameters are
// an immutable struct swapped through an atomic pointer, so a reader sees
// either the old or the new set, never a mix.
package tsconv

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// Mode is a hardware timestamp conversion mode; the numbers match
// VMA_HW_TS_CONVERSION and BYPASSD_HW_TS_CONVERSION.
type Mode int

const (
	// ModeDisable reports no hardware timestamp at all.
	ModeDisable Mode = 0
	// ModeRaw converts ticks to nanoseconds with the nominal frequency
	// only; the result is on the hardware clock's own time scale.
	ModeRaw Mode = 1
	// ModeBest is sync to system where a readable hardware clock exists,
	// raw otherwise. It is resolved to one of those before use.
	ModeBest Mode = 2
	// ModeSync converts onto the system clock's time scale using
	// bracketed (system, hardware) samples. It is the default.
	ModeSync Mode = 3
	// ModePTP uses the hardware time directly as nanoseconds because
	// ptp4l (or similar) disciplines the PHC.
	ModePTP Mode = 4
)

// DefaultMode is the mode used when nothing is configured.
const DefaultMode = ModeSync

var modeNames = [...]string{"disable", "raw", "best", "sync", "ptp"}

// String returns the mode's short name ("disable", "raw", "best", "sync",
// "ptp").
func (m Mode) String() string {
	if m.Valid() {
		return modeNames[m]
	}
	return "mode(" + strconv.Itoa(int(m)) + ")"
}

// Valid reports whether m is one of the five defined modes.
func (m Mode) Valid() bool { return m >= ModeDisable && m <= ModePTP }

// ParseMode accepts a mode number "0".."4" or its name (case-insensitive),
// as given in BYPASSD_HW_TS_CONVERSION or on the command line.
func ParseMode(s string) (Mode, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if n, err := strconv.Atoi(t); err == nil {
		if m := Mode(n); m.Valid() {
			return m, nil
		}
	} else {
		for i, name := range modeNames {
			if t == name {
				return Mode(i), nil
			}
		}
	}
	return 0, fmt.Errorf("tsconv: unknown hardware timestamp conversion mode %q: use 0 (disable), 1 (raw), 2 (best), 3 (sync, the default) or 4 (ptp)", s)
}

// Capabilities describes what a device offers for hardware timestamps.
type Capabilities struct {
	// Timestamps: the device delivers hardware timestamps with frames.
	Timestamps bool
	// Clock: the device's hardware clock can be read together with the
	// system clock (a Clock implementation exists for it).
	Clock bool
	// PTP: the hardware clock is disciplined to real time (ptp4l), so its
	// readings are already system-comparable nanoseconds.
	PTP bool
}

// Resolve returns the effective mode for a requested mode on a device with
// the given capabilities, and a one-line reason when it differs from the
// request (empty otherwise) for the caller to log. Fallbacks follow VMA:
// best → sync, else raw; ptp → sync when the clock is not disciplined;
// sync without a readable clock → disable; anything without hardware
// timestamps → disable.
func Resolve(requested Mode, c Capabilities) (Mode, string) {
	if !requested.Valid() {
		return ModeDisable, fmt.Sprintf("hardware timestamp conversion mode %d is unknown; using disable", int(requested))
	}
	if requested == ModeDisable {
		return ModeDisable, ""
	}
	if !c.Timestamps {
		return ModeDisable, fmt.Sprintf("hardware timestamps requested (mode %s) but the device delivers none; using disable", requested)
	}
	switch requested {
	case ModeRaw:
		return ModeRaw, ""
	case ModeBest:
		if c.Clock {
			return ModeSync, "mode best resolved to sync: the hardware clock is readable"
		}
		return ModeRaw, "mode best resolved to raw: no readable hardware clock (no PHC), timestamps stay on the hardware time scale"
	case ModePTP:
		if c.PTP {
			return ModePTP, ""
		}
		if c.Clock {
			return ModeSync, "mode ptp requested but the hardware clock is not PTP-disciplined; using sync"
		}
		return ModeDisable, "mode ptp requested but the hardware clock is neither PTP-disciplined nor readable; using disable"
	default: // ModeSync
		if c.Clock {
			return ModeSync, ""
		}
		return ModeDisable, "mode sync requested but no readable hardware clock (no PHC); using disable (mode 1 gives raw hardware time)"
	}
}

// Lowest returns the lowest of the given modes: the effective mode shared
// by all devices of a daemon. With no modes it returns ModeDisable.
func Lowest(modes ...Mode) Mode {
	if len(modes) == 0 {
		return ModeDisable
	}
	low := modes[0]
	for _, m := range modes[1:] {
		if m < low {
			low = m
		}
	}
	return low
}

// Sample is one bracketed reading: the system clock (CLOCK_REALTIME, ns
// since the epoch) read just before and just after the hardware clock. The
// hardware read happened somewhere inside [SysBefore, SysAfter]; a tighter
// bracket is a better sample.
type Sample struct {
	SysBefore int64
	HW        uint64
	SysAfter  int64
}

// Width is the bracket width in nanoseconds.
func (s Sample) Width() int64 { return s.SysAfter - s.SysBefore }

// Clock is a hardware clock source that can be sampled against the system
// clock. HW is a free-running 64-bit tick counter (nanoseconds for a PHC).
// Implementations must be safe for use by one goroutine at a time; the
// Converter serialises its calls.
type Clock interface {
	Sample() (Sample, error)
}

// BatchClock is a Clock that can take several samples in one operation,
// as PTP_SYS_OFFSET_EXTENDED does (n_samples triplets in one ioctl). The
// Converter uses it when available. Samples fills dst and returns how many
// entries are valid.
type BatchClock interface {
	Clock
	Samples(dst []Sample) (int, error)
}

// errNoSample: every bracket was inverted or negative, i.e. the system
// clock went backwards across the hardware read.
var errNoSample = errors.New("no usable sample: every bracket was inverted (system clock stepped back during the read); the next update retries")

// rawNs converts ticks to nanoseconds at a nominal frequency without
// overflowing: 128-bit product, then division.
func rawNs(hw uint64, hz uint64) (int64, bool) {
	if hz == 1e9 {
		if hw > math.MaxInt64 {
			return 0, false
		}
		return int64(hw), true
	}
	hi, lo := bits.Mul64(hw, 1e9)
	if hi >= hz {
		return 0, false
	}
	q, _ := bits.Div64(hi, lo, hz)
	if q > math.MaxInt64 {
		return 0, false
	}
	return int64(q), true
}
