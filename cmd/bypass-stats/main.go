// Command bypass-stats shows the counters bypassd publishes for its client
// processes and for itself, with vma_stats's habits: attach by pid or name,
// views 1 to 5, totals or per-second deltas, zeroing, a socket filter, and
// changing the daemon's log level at run time.
//
// It reads the memory-mapped stats files in the stats directory (package
// stats; layout in docs/stats-file.md) and never slows bypassd down: it
// only reads. Zeroing (-z) and the log level (-l) are requests to the
// daemon over its control socket (ZERO_STATS and SET_LOG_LEVEL in
// docs/protocol.md), which checks the caller's uid.
//
// This file owns the options and the main loop; find.go picks the process,
// view.go formats the views, control.go talks to the daemon.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/bypassd/bypassd/internal/buildinfo"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/stats"
)

// EnvStatsDir overrides the default stats directory.
const EnvStatsDir = "BYPASSD_STATS_DIR"

// defaultStatsDir is bypassd's default --stats-dir.
const defaultStatsDir = "/run/bypassd/stats"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// options are the parsed command line.
type options struct {
	pid      int
	name     string
	interval time.Duration
	cycles   int
	view     int
	details  int
	zero     bool
	sockets  socketFilter
	// sort, limit, page and all cut long socket lists (select.go).
	sort        string
	limit, page int
	all         bool
	logLevel    string
	version     bool
	dir         string
	socket      string
}

// usageError is a mistake on the command line (exit status 2).
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

func parseOptions(args []string, getenv func(string) string) (*options, error) {
	o := &options{view: 1, details: 1, dir: defaultStatsDir, interval: time.Second}
	if d := getenv(EnvStatsDir); d != "" {
		o.dir = d
	}
	fs := flag.NewFlagSet("bypass-stats", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	both := func(short, long string, f func(string) error) {
		fs.Func(short, "", f)
		fs.Func(long, "", f)
	}
	boolBoth := func(short, long string, p *bool) {
		fs.BoolVar(p, short, false, "")
		fs.BoolVar(p, long, false, "")
	}
	both("p", "pid", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			return fmt.Errorf("%q is not a process id", v)
		}
		o.pid = n
		return nil
	})
	both("n", "name", func(v string) error {
		if v == "" {
			return errors.New("empty name")
		}
		o.name = v
		return nil
	})
	both("i", "interval", func(v string) error {
		s, err := strconv.ParseFloat(v, 64)
		if err != nil || s <= 0 || s > 86400 || math.IsNaN(s) {
			return fmt.Errorf("%q: want seconds, e.g. 1 or 0.5", v)
		}
		o.interval = time.Duration(s * float64(time.Second))
		return nil
	})
	both("c", "cycles", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("%q: want a count (0: until interrupted)", v)
		}
		o.cycles = n
		return nil
	})
	both("v", "view", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 5 {
			return fmt.Errorf("%q: want 1 (basic), 2 (queues), 3 (full), 4 (multicast groups) or 5 (netstat-like)", v)
		}
		o.view = n
		return nil
	})
	both("d", "details", func(v string) error {
		if v != "1" && v != "2" {
			return fmt.Errorf("%q: want 1 (totals) or 2 (deltas per second)", v)
		}
		o.details = int(v[0] - '0')
		return nil
	})
	both("s", "sockets", func(v string) error {
		f, err := parseSocketFilter(v)
		o.sockets = f
		return err
	})
	fs.Func("sort", "", func(v string) error {
		if v != sortID && v != sortActivity {
			return fmt.Errorf("%q: want id or activity", v)
		}
		o.sort = v
		return nil
	})
	count := func(name string, p *int) {
		fs.Func(name, "", func(v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return fmt.Errorf("%q: want a positive number", v)
			}
			*p = n
			return nil
		})
	}
	count("limit", &o.limit)
	count("page", &o.page)
	fs.BoolVar(&o.all, "all", false, "")
	both("l", "log-level", func(v string) error {
		if _, err := ctlproto.ParseLogLevel(v); err != nil {
			return err
		}
		o.logLevel = v
		return nil
	})
	both("S", "stats-dir", func(v string) error { o.dir = v; return nil })
	fs.Func("socket", "", func(v string) error { o.socket = v; return nil })
	boolBoth("z", "zero", &o.zero)
	boolBoth("V", "version", &o.version)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		msg := err.Error()
		if name, ok := strings.CutPrefix(msg, "flag provided but not defined: "); ok {
			return nil, usagef("unknown option %s", name)
		}
		return nil, usageError{msg}
	}
	if fs.NArg() > 0 {
		return nil, usagef("unexpected argument %q (give the process with -p PID or -n NAME)", fs.Arg(0))
	}
	if o.all && (o.limit != 0 || o.page != 0) {
		return nil, usagef("--all shows every socket: it does not go with --limit or --page")
	}
	if o.pid != 0 && o.name != "" {
		return nil, usagef("-p and -n both given: choose the process one way")
	}
	return o, nil
}

// run is main with its inputs and outputs passed in; it returns the exit
// status: 0 done, 1 a failure (no such process, no permission, ...), 2 a
// usage error.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	o, err := parseOptions(args, getenv)
	if errors.Is(err, flag.ErrHelp) {
		printUsage(stdout)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "bypass-stats: %v\nRun `bypass-stats -h` for the options.\n", err)
		return 2
	}
	if o.version {
		fmt.Fprintln(stdout, versionString())
		return 0
	}
	if o.logLevel != "" {
		if err := setLogLevel(o, stdout); err != nil {
			fmt.Fprintf(stderr, "bypass-stats: %v\n", err)
			return 1
		}
		return 0
	}
	if err := watch(ctx, o, stdout); err != nil {
		fmt.Fprintf(stderr, "bypass-stats: %v\n", err)
		return 1
	}
	return 0
}

// watch prints the chosen view every interval for the given cycles.
func watch(ctx context.Context, o *options, w io.Writer) error {
	t, err := findTarget(o)
	if err != nil {
		return err
	}
	defer t.close()
	if o.zero {
		if err := zeroStats(o, t); err != nil {
			return err
		}
	}
	var prev *stats.Snapshot
	var prevAt time.Time
	for cycle := 0; o.cycles == 0 || cycle < o.cycles; {
		snap, err := t.read()
		if err != nil {
			return err
		}
		now := time.Now()
		if o.details == 2 && prev == nil {
			// Deltas need two readings.
			prev, prevAt = snap, now
			if !sleep(ctx, o.interval) {
				return nil
			}
			continue
		}
		v := &viewer{o: o, t: t, w: w, snap: snap}
		if o.details == 2 {
			if snap.Header.Resets != prev.Header.Resets {
				// Zeroed meanwhile: start the deltas over.
				prev, prevAt = snap, now
				continue
			}
			v.prev, v.elapsed = prev, now.Sub(prevAt)
		}
		if err := v.print(); err != nil {
			return err
		}
		prev, prevAt = snap, now
		cycle++
		if o.cycles != 0 && cycle >= o.cycles {
			break
		}
		if !sleep(ctx, o.interval) {
			return nil
		}
	}
	return nil
}

// sleep waits d; false means the context ended (interrupted).
func sleep(ctx context.Context, d time.Duration) bool {
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func versionString() string {
	return fmt.Sprintf("bypass-stats %s (stats file v%d, control protocol v%d, %s)", buildinfo.Version(), stats.Version, ctlproto.Version, runtime.Version())
}

func printUsage(w io.Writer) {
	fmt.Fprintf(w, `Usage: bypass-stats [-p PID | -n NAME] [-v 1..5] [-i SEC] [-c CYCLES] [-d 1|2] [-s LIST]
                    [--sort id|activity] [--limit N] [--page P | --all] [-z]
       bypass-stats -l LEVEL
       bypass-stats -V

Shows the counters bypassd publishes for a client process (its pid) or for
bypassd itself (the daemon's pid). Without -p or -n: the first live client,
else the daemon.

  -p, --pid PID          the process: a client of bypassd, or bypassd itself
  -n, --name NAME        the first process whose command or program name is NAME
  -v, --view N           1 basic (two lines per socket), 2 adds queues,
                         3 full socket and ring blocks, 4 multicast groups,
                         5 netstat-like table (default 1)
  -i, --interval SEC     seconds between updates (default 1)
  -c, --cycles N         print N times, then exit (default 0: until interrupted)
  -d, --details 1|2      1 totals (default), 2 deltas per second
  -s, --sockets LIST     only these socket ids, e.g. 3,7-9
      --sort id|activity socket order: by id (default) or most active first
                         (datagrams both ways and drops; with -d 2, per second)
      --limit N          show N sockets (a page); --page P picks the page
      --page P           page P of --limit sockets (default limit %d)
      --all              every socket, however many
                         Past %d sockets (or clients) and without these
                         options or -s, views show the %d most active and
                         the totals, and say how to see the rest
  -z, --zero             zero the process's counters first (asks bypassd)
  -l, --log-level LEVEL  set bypassd's log level (debug, info, warn, error) and exit
  -S, --stats-dir DIR    where the stats files are (default %s; env %s)
      --socket PATH      bypassd's control socket for -z and -l (default: the
                         one the daemon's stats file names)
  -V, --version          print the version and exit

Counters are 64-bit and never wrap; Kbyte is 1024 bytes. docs/operations.md
explains every column.
`, autoLimit, autoLimit, autoTop, defaultStatsDir, EnvStatsDir)
}
