package stats

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DaemonPrefix starts the name of the daemon's own stats file
// ("bypassd.<pid>"); a client's file is named after its pid alone.
const DaemonPrefix = "bypassd."

// ClientPath is the stats file of client pid in dir.
func ClientPath(dir string, pid int) string { return filepath.Join(dir, strconv.Itoa(pid)) }

// DaemonPath is the stats file of the daemon with pid in dir.
func DaemonPath(dir string, pid int) string {
	return filepath.Join(dir, DaemonPrefix+strconv.Itoa(pid))
}

// Entry is a stats file found in a directory.
type Entry struct {
	Path string
	PID  int
	Kind Kind
}

// parseName recognizes "<pid>" and "bypassd.<pid>".
func parseName(name string) (pid int, kind Kind, ok bool) {
	kind = KindClient
	if rest, found := strings.CutPrefix(name, DaemonPrefix); found {
		name, kind = rest, KindDaemon
	}
	if name == "" || name[0] == '0' || name[0] == '+' || name[0] == '-' {
		return 0, 0, false
	}
	n, err := strconv.Atoi(name)
	if err != nil || n <= 0 {
		return 0, 0, false
	}
	return n, kind, true
}

// List returns the stats files in dir by name (daemon files first, then
// clients, each by pid). It does not open them.
func List(dir string) ([]Entry, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("stats: list %s: %w", dir, err)
	}
	var out []Entry
	for _, de := range des {
		if de.IsDir() {
			continue
		}
		if pid, kind, ok := parseName(de.Name()); ok {
			out = append(out, Entry{Path: filepath.Join(dir, de.Name()), PID: pid, Kind: kind})
		}
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if a.Kind != b.Kind {
			return int(b.Kind) - int(a.Kind)
		}
		return a.PID - b.PID
	})
	return out, nil
}

// Removed is a file Clean removed and why.
type Removed struct {
	Path, Why string
}

// staleTmpAge is how old a half-created file must be before Clean removes
// it (a younger one may be another writer's, being created right now).
const staleTmpAge = time.Minute

// Clean removes what dead processes left in dir: stats files named after
// a pid that no longer exists, stats files whose writer (a crashed daemon)
// no longer exists, and half-created files older than a minute. Anything
// else is left alone, including files that are not stats files unless
// their name is a dead pid. It returns what it removed, and the files it
// could not remove as an error.
func Clean(dir string) ([]Removed, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("stats: clean %s: %w", dir, err)
	}
	var removed []Removed
	var errs []error
	remove := func(name, why string) {
		p := filepath.Join(dir, name)
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			return
		}
		removed = append(removed, Removed{Path: p, Why: why})
	}
	for _, de := range des {
		name := de.Name()
		if de.IsDir() {
			continue
		}
		if strings.HasPrefix(name, ".") && strings.Contains(name, tmpSuffix) {
			if info, err := de.Info(); err == nil && time.Since(info.ModTime()) > staleTmpAge {
				remove(name, "half-created")
			}
			continue
		}
		pid, _, ok := parseName(name)
		if !ok {
			continue
		}
		if !processAlive(pid) {
			remove(name, fmt.Sprintf("process %d is gone", pid))
			continue
		}
		if w, ok := writerOf(filepath.Join(dir, name)); ok && w != os.Getpid() && !processAlive(w) {
			remove(name, fmt.Sprintf("its writer, bypassd %d, is gone", w))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return removed, fmt.Errorf("stats: clean %s: %w", dir, err)
	}
	return removed, nil
}

// writerOf returns the writer pid of a stats file of this version.
func writerOf(path string) (int, bool) {
	r, err := Open(path)
	if err != nil {
		return 0, false
	}
	defer r.Close()
	return r.hdr.WriterPID, true
}

// processAlive reports whether pid exists (EPERM: it exists but is not
// ours to signal).
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}
