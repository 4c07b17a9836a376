package config

import (
	"fmt"
	"slices"

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
