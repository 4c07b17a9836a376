package daemon

import (
	"slices"

	"go.uber.org/zap"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/provider/verbs"
	"github.com/bypassd/bypassd/ring/qp"
)

// chooseProvider resolves auto for one interface from what verbs.Decide
// found: verbs when the binary has it and the interface has an RDMA port
// that carries raw packet QPs, afxdp otherwise. It logs the choice and why.
func chooseProvider(requested string, d verbs.Decision, log *zap.Logger) string {
	if requested != config.ProviderAuto {
		return requested
	}
	if d.Use && slices.Contains(qp.Providers(), "verbs") {
		log.Info("provider chosen", zap.String("provider", "verbs"), zap.String("why", d.Reason))
		return "verbs"
	}
	level := log.Info
	if d.Binding != nil {
		// The NIC could run verbs but will not: worth a warning.
		level = log.Warn
	}
	level("provider chosen", zap.String("provider", ring.DefaultProvider), zap.String("why_not_verbs", d.Reason))
	return ring.DefaultProvider
}
