//go:build verbs

package verbs

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring/tsconv"
)

// deviceClock samples the device's free-running clock with
// ibv_query_rt_values_ex, bracketed by CLOCK_REALTIME reads taken in C
// right around the query.
type deviceClock struct{ p *Provider }

// Sample implements tsconv.Clock.
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
	return tsconv.Sample{SysBefore: before, HW: hw, SysAfter: after}, nil
}

// Clock returns the device clock for tsconv, the tsconv capabilities of
// this ring, and the clock's nominal rate (hca_core_clock, kHz → Hz) for
// tsconv.Config.NominalHz. The clock is nil when the device cannot be read
// (ibv_query_rt_values_ex unsupported); one trial read decides.
func (p *Provider) Clock() (tsconv.Clock, tsconv.Capabilities, uint64) {
	caps := tsconv.Capabilities{Timestamps: p.ts}
	clk := deviceClock{p}
	if _, err := clk.Sample(); err != nil || p.caps.ClockKHz == 0 {
		return nil, caps, p.caps.ClockHz()
	}
	caps.Clock = true
	return clk, caps, p.caps.ClockHz()
}
