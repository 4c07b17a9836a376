package config

import (
	"strings"
	"testing"

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
