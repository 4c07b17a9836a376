// Command bypassd is the bypassd daemon: it opens the AF_XDP rings of the
// configured interface queues and serves applications that use the socket
// package over its control socket, until SIGTERM or SIGINT. SIGHUP starts
// the binary installed at the same path to take over (live upgrade).
//
// This file wires flags, logging and signals to package daemon, which owns
// everything else; package daemon/config owns the flag, environment and
// config-file handling. docs/configuration.md lists every setting.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/bypassd/bypassd/daemon"
	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/internal/buildinfo"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/stats"
)

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// run is main with its inputs and outputs passed in; it returns the exit
// status: 0 after a clean stop, 1 when the daemon fails, 2 for a usage
// error.
func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	o, err := config.Parse(args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		config.PrintUsage(stdout)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "bypassd: %v\nRun `bypassd --help` for the options.\n", err)
		return 2
	}
	if o.ShowVersion {
		fmt.Fprintln(stdout, versionString())
		return 0
	}
	level := zap.NewAtomicLevelAt(o.LogLevel)
	o.Config.LogLevel = &level
	o.Config.Version = buildinfo.Version()
	log := newLogger(o.LogFormat, level, stderr)
	defer func() { _ = log.Sync() }()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	defer signal.Stop(sigs)
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	defer signal.Stop(hups)
	go func() {
		for range hups {
			exe, err := executable()
			if err != nil {
				log.Error("reload: cannot find the installed binary; serving on", zap.Error(err))
				continue
			}
			startSuccessor(exe, args, log)
		}
	}()
	go func() {
		s, ok := <-sigs
		if !ok {
			return
		}
		log.Info("signal received: shutting down (send it again to exit at once)", zap.Stringer("signal", s))
		cancel()
		if s, ok = <-sigs; ok {
			// Whatever is left is cleaned by the next start: the XDP
			// program goes with the process, the socket file is replaced
			// and the lock files re-taken.
			log.Warn("second signal: exiting at once", zap.Stringer("signal", s))
			_ = log.Sync()
			os.Exit(1)
		}
	}()

	log.Info("bypassd starting", zap.String("version", versionString()), zap.Int("pid", os.Getpid()))
	var d *daemon.Daemon
	if o.Takeover {
		d, err = daemon.Takeover(o.Config, daemon.TakeoverOptions{}, log)
	} else {
		d, err = daemon.New(o.Config, log)
	}
	if err != nil {
		log.Error("cannot start", zap.Error(err))
		return 1
	}
	// For a Type=notify unit: ready, and (after a takeover) the main
	// process now.
	if err := sdNotify(fmt.Sprintf("READY=1\nMAINPID=%d", os.Getpid())); err != nil {
		log.Warn("cannot notify systemd", zap.Error(err))
	}
	status := 0
	if err := d.Serve(ctx); err != nil {
		log.Error("serving failed", zap.Error(err))
		status = 1
	}
	if err := d.Close(); err != nil {
		log.Error("unclean shutdown", zap.Error(err))
		status = 1
	}
	return status
}

// newLogger builds the structured logger with a level changeable at run
// time.
func newLogger(format string, level zap.AtomicLevel, w io.Writer) *zap.Logger {
	ec := zap.NewProductionEncoderConfig()
	ec.TimeKey = "ts"
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	var enc zapcore.Encoder
	if format == "console" {
		ec.EncodeLevel = zapcore.CapitalLevelEncoder
		enc = zapcore.NewConsoleEncoder(ec)
	} else {
		enc = zapcore.NewJSONEncoder(ec)
	}
	return zap.New(zapcore.NewCore(enc, zapcore.Lock(zapcore.AddSync(w)), level))
}

func versionString() string {
	return fmt.Sprintf("bypassd %s (control protocol v%d, stats file v%d, %s)", buildinfo.Version(), ctlproto.Version, stats.Version, runtime.Version())
}
