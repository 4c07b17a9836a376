package daemon

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Capability bit numbers (linux/capability.h).
const (
	capNetBindService = 10
	capNetAdmin       = 12
)

// privilegedPortLimit: ports below it need uid 0 or CAP_NET_BIND_SERVICE,
// like the kernel's default net.ipv4.ip_unprivileged_port_start.
const privilegedPortLimit = 1024

// peerCanBindPrivileged reports whether the client process may bind a
// port below 1024: uid 0 (from SO_PEERCRED) or CAP_NET_BIND_SERVICE in the
// effective set of the process, read from /proc/<pid>/status. A process that
// is gone (or whose status cannot be read) gets no privilege.
func peerCanBindPrivileged(uid uint32, pid int32) bool {
	return peerHasCap(uid, pid, capNetBindService)
}

// peerHasCap reports whether the client is uid 0 or has capability bit
// cap in its effective set.
func peerHasCap(uid uint32, pid int32, cap uint) bool {
	if uid == 0 {
		return true
	}
	caps, err := effectiveCaps(pid)
	return err == nil && caps&(1<<cap) != 0
}

// effectiveCaps reads CapEff of process pid.
func effectiveCaps(pid int32) (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return parseCapEff(f)
}

func parseCapEff(r io.Reader) (uint64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		v, ok := strings.CutPrefix(sc.Text(), "CapEff:")
		if !ok {
			continue
		}
		caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			return 0, fmt.Errorf("parse CapEff %q: %w", strings.TrimSpace(v), err)
		}
		return caps, nil
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no CapEff line in process status")
}
