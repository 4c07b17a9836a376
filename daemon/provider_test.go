package daemon

import (
	"strings"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/ring/provider/verbs"
)

// auto on an interface without an RDMA device picks afxdp and says why.
func TestChooseProviderAuto(t *testing.T) {
	core, logs := observer.New(zap.InfoLevel)
	if got := chooseProvider(config.ProviderAuto, verbs.Decide("lo"), zap.New(core)); got != "afxdp" {
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
