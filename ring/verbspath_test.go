//go:build verbs

package ring

import (
	"errors"
	"slices"
	"testing"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring/verbs"
)

// A verbs binary offers the provider, and a ring asked to use it on an
// interface without an RDMA device (a veth) fails saying so, leaving
// nothing behind.
func TestVerbsPathWithoutDevice(t *testing.T) {
	if !slices.Contains(Providers(), "verbs") {
		t.Fatalf("providers %v: verbs not registered in a -tags verbs build", Providers())
	}
	netlab.RequirePriv(t)
	pair := netlab.NewPair(t, netlab.Options{})
	err := pair.A.NS.Do(func() error {
		r, err := Open(Config{Interface: pair.A.Name, Provider: "verbs"})
		if err == nil {
			r.Close()
		}
		return err
	})
	if !errors.Is(err, verbs.ErrNoRDMADevice) {
		t.Fatalf("verbs ring on a veth: %v, want ErrNoRDMADevice", err)
	}
	t.Logf("as expected: %v", err)
}
