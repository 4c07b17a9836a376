package netlab

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
	"strconv"

	"golang.org/x/sys/unix"
)

// pidNameRE matches namespaces of unnamed pairs: bdlab-<pid>-<n>-a|b.
// Options.Name must start with a letter, so named pairs never match.
var pidNameRE = regexp.MustCompile(`^` + regexp.QuoteMeta(Prefix) + `([0-9]+)-[0-9]+-[ab]$`)

// ownerPID returns the pid encoded in a lab namespace name, if any.
func ownerPID(name string) (int, bool) {
	m := pidNameRE.FindStringSubmatch(name)
	if m == nil {
		return 0, false
	}
	pid, err := strconv.Atoi(m[1])
	if err != nil || pid <= 0 {
		return 0, false
	}
	return pid, true
}

// processAlive reports whether pid exists (zombies count as alive; EPERM
// means it exists but belongs to someone else).
func processAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// Sweep removes lab namespaces left behind by lab processes that no longer
// exist (the pid is part of the name). It never touches other namespaces,
// named pairs (see Destroy) or namespaces of live processes, so it is safe
// to call at any time, also concurrently. A pid reused by an unrelated
// process protects the leftover until that process exits.
func Sweep() error {
	entries, err := os.ReadDir(netnsRunDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("netlab: sweep: list %s: %w", netnsRunDir, err)
	}
	var errs []error
	for _, e := range entries {
		pid, ok := ownerPID(e.Name())
		if !ok || processAlive(pid) {
			continue
		}
		if err := deleteNamedNS(e.Name()); err != nil {
			errs = append(errs, fmt.Errorf("netlab: sweep: %w", err))
		}
	}
	return errors.Join(errs...)
}

// Destroy deletes the namespaces of the pair created with Options.Name ==
// name (bdlab-<name>-a and -b), destroying its veth. Namespaces that do not
// exist are ignored, so it is safe in shell traps.
func Destroy(name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	return errors.Join(
		deleteNamedNS(Prefix+name+"-a"),
		deleteNamedNS(Prefix+name+"-b"),
	)
}
