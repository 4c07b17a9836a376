package ring_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/qp"
)

// TestUnknownProvider: a provider name that no package registered fails
// Open with the names this build has, and leaves nothing attached.
func TestUnknownProvider(t *testing.T) {
	// Linking package ring registers its providers (providers.go).
	for _, want := range []string{ring.DefaultProvider, "tap"} {
		if !slices.Contains(qp.Providers(), want) {
			t.Fatalf("providers %v lack %q", qp.Providers(), want)
		}
	}
	p := netlab.NewPair(t, netlab.Options{})
	err := p.A.NS.Do(func() error {
		r, err := ring.Open(ring.Config{Interface: p.A.Name, Provider: "nope"})
		if err == nil {
			_ = r.Close()
		}
		return err
	})
	if err == nil || !strings.Contains(err.Error(), `unknown provider "nope"`) || !strings.Contains(err.Error(), ring.DefaultProvider) {
		t.Fatalf("open with an unknown provider: %v", err)
	}
	// The default provider opens on the same interface afterwards: the
	// failed Open left no program or socket behind.
	err = p.A.NS.Do(func() error {
		r, err := ring.Open(ring.Config{Interface: p.A.Name})
		if err != nil {
			return err
		}
		defer r.Close()
		if got := r.Caps().Provider; got != ring.DefaultProvider {
			t.Errorf("provider %q, want %q", got, ring.DefaultProvider)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
