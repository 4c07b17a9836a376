//go:build verbs

package verbs

import (
	"fmt"
	"math/bits"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring/clock/tsconv"
)

// Timestamps leave the provider in nanoseconds of the device's clock: the
// completion timestamps of RX frames and the clock samples alike are device
// ticks scaled by the nominal rate hca_core_clock (kHz in rdma-core). The
// ring then treats them like a PHC's, which counts nanoseconds, and the
// sync-mode converter corrects the nominal rate's error.

// ticksToNs scales device ticks to nanoseconds at khz kHz without
// overflowing (128-bit product).
func ticksToNs(ticks, khz uint64) uint64 {
	if khz == 0 {
		return 0
	}
	hi, lo := bits.Mul64(ticks, 1_000_000)
	if hi >= khz {
		return 1<<64 - 1
	}
	q, _ := bits.Div64(hi, lo, khz)
	return q
}

// deviceClock samples the device's free-running clock with
// ibv_query_rt_values_ex, bracketed by CLOCK_REALTIME reads taken in C
// right around the query.
type deviceClock struct{ p *Provider }

// Sample implements tsconv.Clock; HW is in nanoseconds (see ticksToNs).
func (c deviceClock) Sample() (tsconv.Sample, error) {
	c.p.ctxMu.RLock()
	defer c.p.ctxMu.RUnlock()
	if c.p.ctx == nil {
		return tsconv.Sample{}, fmt.Errorf("verbs %s: device closed: %w", c.p.bind.Device, unix.ENODEV)
	}
	before, hw, after, err := cSampleClock(c.p.ctx)
	if err != nil {
		return tsconv.Sample{}, translate("read the device clock (ibv_query_rt_values_ex)", err)
	}
	return tsconv.Sample{SysBefore: before, HW: ticksToNs(hw, c.p.caps.ClockKHz), SysAfter: after}, nil
}

// Clock returns the device clock for tsconv (nanoseconds, so the
// converter's default NominalHz of 1e9 applies) and this ring's tsconv
// capabilities. The clock is nil when it cannot be read
// (ibv_query_rt_values_ex unsupported, or no hca_core_clock); one trial
// read decides.
func (p *Provider) Clock() (tsconv.Clock, tsconv.Capabilities) {
	caps := tsconv.Capabilities{Timestamps: p.ts}
	clk := deviceClock{p}
	if p.caps.ClockKHz == 0 {
		return nil, caps
	}
	if _, err := clk.Sample(); err != nil {
		return nil, caps
	}
	caps.Clock = true
	return clk, caps
}
