package config

import (
	"strings"
	"testing"
)

func TestDevMemConfig(t *testing.T) {
	two := []Interface{{Name: "eth1"}, {Name: "eth1", Queue: 1}, {Name: "eth2"}}
	c := Config{Interfaces: two, DevMemTX: 100}.WithDefaults()
	if c.DevMemTX != 128 || c.DevMemMax != DefaultDevMemMax {
		t.Fatalf("defaults: tx %d (want 128: rounded up to 64), max %d", c.DevMemTX, c.DevMemMax)
	}
	if err := (Config{Interfaces: two, DevMemTX: 128 << 10}).Validate(); err != nil {
		t.Fatalf("two rings × 128 KiB on a 256 KiB device: %v", err)
	}
	err := Config{Interfaces: two, DevMemTX: 128<<10 + 1}.Validate()
	if err == nil || !strings.Contains(err.Error(), "2 ring(s) of eth1") || !strings.Contains(err.Error(), "--dev-mem-max") {
		t.Fatalf("over the cap: %v", err)
	}
	if err := (Config{Interfaces: two, DevMemTX: 200 << 10, DevMemMax: 400 << 10}).Validate(); err != nil {
		t.Fatalf("raised cap: %v", err)
	}
	// Staging needs a fixed provider: no TAP path unless asked for, and
	// asking for one is refused with what to change.
	if c := (Config{Interfaces: two, DevMemTX: 64}).WithDefaults(); c.Fallback != "none" {
		t.Fatalf("fallback with device memory: %q, want none", c.Fallback)
	}
	if c := (Config{Interfaces: two}).WithDefaults(); c.Fallback != "auto" {
		t.Fatalf("fallback without device memory: %q, want auto", c.Fallback)
	}
	err = Config{Interfaces: two, DevMemTX: 64, Fallback: "auto"}.Validate()
	if err == nil || !strings.Contains(err.Error(), "--fallback none") {
		t.Fatalf("device memory with fallback auto: %v", err)
	}
	for _, bad := range []Config{{DevMemTX: -1}, {DevMemMax: -1}, {DevMemInline: 1 << 16}} {
		bad.Interfaces = two
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
