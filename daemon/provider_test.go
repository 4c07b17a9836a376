package daemon

import (
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/bypassd/bypassd/ring/provider/verbs"
)

func TestCheckProvider(t *testing.T) {
	for _, ok := range []string{"auto", "afxdp"} {
		if err := checkProvider(ok); err != nil {
			t.Errorf("provider %s refused: %v", ok, err)
		}
	}
	if err := checkProvider("nosuch"); err == nil || !strings.Contains(err.Error(), "afxdp") {
		t.Errorf("unknown provider: %v, want the list of providers", err)
	}
	err := checkProvider("verbs")
	if verbs.Built {
		if err != nil {
			t.Errorf("verbs refused in a -tags verbs build: %v", err)
		}
	} else if err == nil || !strings.Contains(err.Error(), "-tags verbs") {
		t.Errorf("verbs without the build tag: %v, want how to build it", err)
	}
	cfg := Config{Interfaces: []Interface{{Name: "eth1"}}, Provider: "nosuch"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "nosuch") {
		t.Errorf("Validate with an unknown provider: %v", err)
	}
}

// auto on an interface without an RDMA device picks afxdp and says why.
func TestChooseProviderAuto(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	if got := chooseProvider(ProviderAuto, verbs.Decide("lo"), zap.New(core)); got != "afxdp" {
		t.Fatalf("auto on lo chose %s", got)
	}
	entries := logs.All()
	if len(entries) != 1 || !strings.Contains(entries[0].ContextMap()["why_not_verbs"].(string), "no RDMA device") {
		t.Fatalf("log: %+v", entries)
	}
	if got := chooseProvider("afxdp", verbs.Decide("lo"), zap.New(core)); got != "afxdp" || len(logs.All()) != 1 {
		t.Fatalf("an explicit provider is taken as given, without a log line: %s", got)
	}
}
