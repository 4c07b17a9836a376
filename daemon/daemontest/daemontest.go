// Package daemontest runs an in-process bypassd on one end of a netlab pair
// for tests and benchmarks, as net/http/httptest runs a server: started in
// the pair's namespace, serving until the test ends, then stopped and
// checked to have left nothing behind.
//
// It owns only that life cycle; the lab itself is package internal/netlab's
// and the daemon's behaviour package daemon's.
package daemontest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/bypassd/bypassd/daemon"
	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/internal/netlab"
)

// Server is a running daemon.
type Server struct {
	*daemon.Daemon
	// Config is the configuration it was started with, defaults filled in.
	Config config.Config
	// Dir holds the control socket, the run files and the stats directory;
	// other users can traverse it (mode 0755) so that tests may run
	// clients under another uid.
	Dir string
}

// SocketPath is the control socket clients dial.
func (s *Server) SocketPath() string { return s.Config.SocketPath }

// Start starts bypassd on p.A with cfg and stops it when t ends, checking
// that it removed its control socket and stats files. Unset
// fields get test defaults: p.A as the only interface (every queue), a control socket
// (mode 0666), run directory and stats directory in Dir, 64 KiB queues and
// 1024 frames. A nil log logs warnings and errors to t.
func Start(t testing.TB, p *netlab.Pair, cfg config.Config, log *zap.Logger) *Server {
	t.Helper()
	// Not t.TempDir: its parent is 0700, so other uids could not reach
	// the socket.
	dir, err := os.MkdirTemp("", "bypassd-test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if cfg.Interfaces == nil {
		cfg.Interfaces = []config.Interface{{Name: p.A.Name, Count: config.AllQueues}}
	}
	if cfg.SocketPath == "" {
		cfg.SocketPath = filepath.Join(dir, "ctl.sock")
		if cfg.SocketMode == 0 {
			cfg.SocketMode = 0o666
		}
	}
	if cfg.RunDir == "" {
		cfg.RunDir = dir
	}
	if cfg.StatsDir == "" {
		cfg.StatsDir = filepath.Join(dir, "stats")
	}
	if cfg.QueueBytes == 0 {
		cfg.QueueBytes = 64 << 10
	}
	if cfg.Frames == 0 {
		cfg.Frames = 1024
	}
	if log == nil {
		log = zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	}
	s := &Server{Config: cfg, Dir: dir}
	if err := p.A.NS.Do(func() error {
		var err error
		s.Daemon, err = daemon.New(cfg, log)
		return err
	}); err != nil {
		t.Fatalf("start bypassd on %s: %v", p.A.Name, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("bypassd Serve: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("bypassd Close: %v", err)
		}
		if _, err := os.Stat(cfg.SocketPath); !os.IsNotExist(err) {
			t.Errorf("bypassd left its control socket behind: %v", err)
		}
		if left, _ := os.ReadDir(cfg.StatsDir); len(left) != 0 {
			t.Errorf("bypassd left stats files behind: %v", left)
		}
	})
	return s
}
