package netlab

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// RequirePrivEnv is the environment variable that turns a missing privilege
// from a skipped test into a failed one (set it to "1" in CI runs as root, so
// that a broken set-up cannot silently skip the kernel tests).
const RequirePrivEnv = "BYPASSD_REQUIRE_PRIV"

// Capability numbers from linux/capability.h.
const (
	capNetAdmin = 12
	capSysAdmin = 21
)

// Privileged reports whether the process can build labs: effective uid 0 and
// CAP_NET_ADMIN plus CAP_SYS_ADMIN in the effective set. When it cannot,
// the returned reason says what is missing.
func Privileged() (ok bool, reason string) {
	if os.Geteuid() != 0 {
		return false, fmt.Sprintf("netlab: needs root (euid is %d); run the tests as root, e.g. `sudo -E go test ...`", os.Geteuid())
	}
	caps, err := effectiveCaps()
	if err != nil {
		return false, fmt.Sprintf("netlab: cannot read capabilities: %v", err)
	}
	var missing []string
	if caps&(1<<capNetAdmin) == 0 {
		missing = append(missing, "CAP_NET_ADMIN")
	}
	if caps&(1<<capSysAdmin) == 0 {
		missing = append(missing, "CAP_SYS_ADMIN")
	}
	if len(missing) > 0 {
		return false, fmt.Sprintf("netlab: root but missing %s; run outside restricted containers or add the capabilities (e.g. docker --privileged)", strings.Join(missing, " and "))
	}
	return true, ""
}

// privileged is Privileged, replaceable by tests of RequirePriv.
var privileged = Privileged

// RequirePriv skips the test unless the process is privileged (see
// Privileged). With BYPASSD_REQUIRE_PRIV=1 it fails the test instead.
func RequirePriv(tb testing.TB) {
	tb.Helper()
	ok, reason := privileged()
	if ok {
		return
	}
	if os.Getenv(RequirePrivEnv) == "1" {
		tb.Fatalf("%s (%s=1 makes this a failure instead of a skip)", reason, RequirePrivEnv)
		return
	}
	tb.Skip(reason)
}

// effectiveCaps reads CapEff of the calling process from /proc.
func effectiveCaps() (uint64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		v, found := strings.CutPrefix(sc.Text(), "CapEff:")
		if !found {
			continue
		}
		caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			return 0, fmt.Errorf("parse CapEff %q: %w", v, err)
		}
		return caps, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no CapEff line in /proc/self/status")
}
