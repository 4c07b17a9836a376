package daemon

import (
	"fmt"
	"slices"

	"go.uber.org/zap"

	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/provider/verbs"
	"github.com/bypassd/bypassd/ring/qp"
)

// ProviderAuto lets the daemon pick each interface's provider.
const ProviderAuto = "auto"

// checkProvider accepts auto and the providers this binary has, and says
// how to get verbs when it is missing.
func checkProvider(name string) error {
	if name == ProviderAuto || slices.Contains(qp.Providers(), name) {
		return nil
	}
	if name == "verbs" {
		return fmt.Errorf("provider verbs: %w", verbs.ErrNotBuilt)
	}
	return fmt.Errorf("provider %q: want auto or one of %v", name, qp.Providers())
}

// chooseProvider resolves auto for one interface from what verbs.Decide
// found: verbs when the binary has it and the interface has an RDMA port
// that carries raw packet QPs, afxdp otherwise. It logs the choice and why.
func chooseProvider(requested string, d verbs.Decision, log *zap.Logger) string {
	if requested != ProviderAuto {
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
