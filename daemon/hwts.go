package daemon

import (
	"fmt"

	"go.uber.org/zap"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/clock/tsconv"
)

// hwTimestampMode resolves the requested hardware timestamp conversion mode
// on every interface and returns the lowest, the one all rings use so that
// every socket's timestamps mean the same thing. It logs one line: the
// effective mode and, when it is lower than requested, the first interface
// that lowered it and why.
func hwTimestampMode(ifaces []config.Interface, requested tsconv.Mode, log *zap.Logger) (tsconv.Mode, error) {
	if requested == tsconv.ModeDisable {
		log.Info("hardware timestamps disabled (mode 0)", zap.Int("hw_ts_conversion", 0))
		return tsconv.ModeDisable, nil
	}
	effective := requested
	var why, dev string
	seen := map[string]bool{}
	for _, it := range ifaces {
		if seen[it.Name] {
			continue
		}
		seen[it.Name] = true
		sup, err := ring.ProbeHWTimestamps(it.Name, requested)
		if err != nil {
			return 0, fmt.Errorf("interface %s: hardware timestamp support: %w", it.Name, err)
		}
		if sup.Mode < effective {
			// The device's fact ("no PHC on eth1") is clearer than the
			// mode arithmetic, which the message states anyway.
			effective, why, dev = sup.Mode, sup.Info.Reason(), it.Name
			if why == "" {
				why = sup.Reason
			}
		}
	}
	fields := []zap.Field{zap.Int("hw_ts_conversion", int(effective)), zap.Int("requested", int(requested))}
	switch {
	case effective == requested:
		log.Info(fmt.Sprintf("hardware timestamps: using mode %d (%s)", effective, effective), fields...)
	case effective == tsconv.ModeDisable:
		log.Info(fmt.Sprintf("%s: hardware timestamps unavailable, using mode 0 (disable); software receive timestamps still work", why),
			append(fields, zap.String("interface", dev))...)
	default:
		log.Info(fmt.Sprintf("%s: using mode %d (%s)", why, effective, effective), append(fields, zap.String("interface", dev))...)
	}
	return effective, nil
}
