//go:build !verbs

package verbs

// Built reports whether this binary contains the verbs provider.
const Built = false

// Query would read the device's capabilities; without the verbs build tag
// it reports ErrNotBuilt.
func Query(Binding) (DeviceCaps, error) { return DeviceCaps{}, ErrNotBuilt }
