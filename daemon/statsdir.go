package daemon

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// prepareStatsDir creates dir and removes the entries a crashed daemon left
// for clients that are gone: files whose name is the pid of a process that
// no longer exists. Anything else in it is left alone.
func prepareStatsDir(dir string, log *zap.Logger) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("stats directory %s: %w (choose another with --stats-dir)", dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("stats directory %s: %w", dir, err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid <= 0 || e.IsDir() || processAlive(pid) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("cannot remove stale stats file", zap.String("path", p), zap.Error(err))
			continue
		}
		log.Info("removed stale stats file", zap.String("path", p), zap.Int("pid", pid))
	}
	return nil
}

// processAlive reports whether pid exists (EPERM: it exists but is not
// ours to signal).
func processAlive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}
