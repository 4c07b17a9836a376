package daemon

import (
	"fmt"
	"os"

	"go.uber.org/zap"

	"github.com/bypassd/bypassd/stats"
)

// prepareStatsDir creates dir and removes what dead processes left in it:
// files named after a pid that no longer exists, stats files a crashed
// daemon wrote, half-created files (stats.Clean). Anything else in it is
// left alone.
func prepareStatsDir(dir string, log *zap.Logger) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("stats directory %s: %w (choose another with --stats-dir)", dir, err)
	}
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("stats directory %s: not a directory (choose another with --stats-dir)", dir)
	}
	removed, err := stats.Clean(dir)
	for _, r := range removed {
		log.Info("removed stale stats file", zap.String("path", r.Path), zap.String("why", r.Why))
	}
	if err != nil {
		log.Warn("cannot remove some stale stats files", zap.Error(err))
	}
	return nil
}
