package ring

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/bypassd/bypassd/ring/clock/tsconv"
)

// clockProvider is a provider that reads its device's clock itself (verbs:
// ibv_query_rt_values_ex) instead of through a PHC, and stamps RX frames
// with that clock in nanoseconds.
type clockProvider interface {
	Clock() (tsconv.Clock, tsconv.Capabilities)
}

// openProviderClock resolves cfg.HWTimestamps against the provider's clock
// and prepares the converter, like openHWClock does with a PHC.
func (r *Ring) openProviderClock(cp clockProvider) (*hwClock, string, error) {
	clock, caps := cp.Clock()
	mode, why := tsconv.Resolve(r.cfg.HWTimestamps, caps)
	if mode == tsconv.ModeDisable {
		return nil, why, nil
	}
	if mode != tsconv.ModeSync {
		clock = nil
	}
	h := &hwClock{done: make(chan struct{})}
	var err error
	h.conv, err = tsconv.New(mode, clock, tsconv.Config{OnError: func(err error) {
		r.log.Warn("device clock sample failed", zap.String("provider", r.prov.Caps().Provider), zap.Error(err))
	}})
	if err != nil {
		return nil, "", fmt.Errorf("hardware timestamp conversion: %w", err)
	}
	return h, why, nil
}
