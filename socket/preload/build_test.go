package preload

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// needTool returns the path of a program the tests need, skipping the test
// without it, or failing under BYPASSD_REQUIRE_PRIV=1 where `make deps`
// has installed everything.
func needTool(t *testing.T, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		msg := name + " not installed (apt-get install " + pkg + ", or `make deps`)"
		if os.Getenv("BYPASSD_REQUIRE_PRIV") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return p
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
	buildOut  []byte
)

// built runs the library's Makefile once per test binary: libbypassd.so
// and the sanitizer-built unit test, multiplexing and TCP programs, in a
// directory removed at exit.
func built(t *testing.T) (lib, unit string) {
	t.Helper()
	needTool(t, "cc", "gcc")
	needTool(t, "make", "make")
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "libbypassd-test")
		if buildErr != nil {
			return
		}
		cmd := exec.Command("make", "-j2", "-C", "c", "all", "unit", "mux", "tcp",
			"OUT="+filepath.Join(buildDir, "libbypassd.so"),
			"TESTBIN="+filepath.Join(buildDir, "unit_test"),
			"MUXBIN="+filepath.Join(buildDir, "mux_test"),
			"TCPBIN="+filepath.Join(buildDir, "tcp_test"))
		buildOut, buildErr = cmd.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("build libbypassd: %v\n%s", buildErr, buildOut)
	}
	return filepath.Join(buildDir, "libbypassd.so"), filepath.Join(buildDir, "unit_test")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// buildMux returns the multiplexing test program (c/tests/mux.c).
func buildMux(t *testing.T) string {
	t.Helper()
	built(t)
	return filepath.Join(buildDir, "mux_test")
}

// buildTCP returns the TCP test program (c/tests/tcp.c).
func buildTCP(t *testing.T) string {
	t.Helper()
	built(t)
	return filepath.Join(buildDir, "tcp_test")
}
