package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestRunUsageAndVersion(t *testing.T) {
	var out, errb bytes.Buffer
	if rc := run([]string{"--help"}, env(nil), &out, &errb); rc != 0 || !strings.Contains(out.String(), "--interface") ||
		!strings.Contains(out.String(), "BYPASSD_RX_POLL") {
		t.Errorf("--help: %d %q", rc, out.String())
	}
	out.Reset()
	if rc := run([]string{"--version"}, env(nil), &out, &errb); rc != 0 || !strings.HasPrefix(out.String(), "bypassd ") {
		t.Errorf("--version: %d %q", rc, out.String())
	}
	errb.Reset()
	if rc := run([]string{"--frames", "7", "-i", "eth1"}, env(nil), &out, &errb); rc != 2 ||
		!strings.Contains(errb.String(), "power of two") || !strings.Contains(errb.String(), "bypassd --help") {
		t.Errorf("bad value: %d %q", rc, errb.String())
	}
}

func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}
