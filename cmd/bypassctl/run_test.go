package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestPreloadEnv(t *testing.T) {
	env := preloadEnv([]string{"A=1", "LD_PRELOAD=/x.so", "BYPASSD_SOCKET=/old", "BYPASSD_REQUIRE=0"}, "/lib/libbypassd.so", "/run/s.sock", true)
	want := []string{"A=1", "LD_PRELOAD=/lib/libbypassd.so:/x.so", "BYPASSD_SOCKET=/run/s.sock", "BYPASSD_REQUIRE=1"}
	if !slices.Equal(env, want) {
		t.Errorf("got %q\nwant %q", env, want)
	}
	env = preloadEnv([]string{"LD_PRELOAD=", "BYPASSD_REQUIRE=1"}, "/l.so", "/s", false)
	want = []string{"BYPASSD_REQUIRE=1", "LD_PRELOAD=/l.so", "BYPASSD_SOCKET=/s"}
	if !slices.Equal(env, want) {
		t.Errorf("got %q\nwant %q", env, want)
	}
}

func TestRunErrors(t *testing.T) {
	var out, errb bytes.Buffer
	if err := run([]string{"run"}, &out, &errb); err == nil || !strings.Contains(err.Error(), "needs a command") {
		t.Errorf("run without a command: %v", err)
	}
	missing := filepath.Join(t.TempDir(), "none.so")
	if err := run([]string{"run", "--lib", missing, "--", "true"}, &out, &errb); err == nil || !strings.Contains(err.Error(), "make build") {
		t.Errorf("run with a missing library: %v", err)
	}
	lib := filepath.Join(t.TempDir(), libName)
	if err := os.WriteFile(lib, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run([]string{"run", "--lib", lib, "--", "no-such-command-14"}, &out, &errb); err == nil || !strings.Contains(err.Error(), "executable file not found") {
		t.Errorf("run of a missing command: %v", err)
	}
}
