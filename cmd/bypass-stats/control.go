package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/stats"
)

// daemonSocket finds the control socket: --socket, else the one the
// daemon's stats file names (the only live daemon in the directory when
// daemonPID is 0).
func daemonSocket(o *options, daemonPID int) (string, error) {
	if o.socket != "" {
		return o.socket, nil
	}
	if daemonPID == 0 {
		entries, err := stats.List(o.dir)
		if err != nil {
			return "", dirError(o.dir, errors.Unwrap(err))
		}
		for _, e := range daemonsOf(entries) {
			if !alive(e.PID) {
				continue
			}
			if daemonPID != 0 {
				return "", fmt.Errorf("several bypassd write to %s (pids %d and %d): name the control socket with --socket", o.dir, daemonPID, e.PID)
			}
			daemonPID = e.PID
		}
		if daemonPID == 0 {
			return "", fmt.Errorf("no running bypassd found in %s: start it, or give its --stats-dir with -S (or its socket with --socket)", o.dir)
		}
	}
	s, err := stats.ReadFile(stats.DaemonPath(o.dir, daemonPID))
	if err != nil {
		return "", fmt.Errorf("find bypassd's control socket (or give it with --socket): %w", err)
	}
	return s.Daemon.SocketPath, nil
}

// request sends one administrative request to the daemon and returns the
// reply body.
func request(path string, code ctlproto.Code, body ctlproto.Message) (ctlproto.Message, error) {
	a, err := ctlproto.DialAdmin(path, "bypass-stats")
	if err != nil {
		if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("%w (bypass-stats -z and -l talk to bypassd's control socket: run as root or as a member of its group)", err)
		}
		return nil, err
	}
	defer a.Close()
	m, _, err := a.Call(ctlproto.Header{Code: code}, body)
	return m, err
}

// setLogLevel serves -l.
func setLogLevel(o *options, w io.Writer) error {
	level, err := ctlproto.ParseLogLevel(o.logLevel)
	if err != nil {
		return err
	}
	daemonPID := 0
	if o.pid != 0 || o.name != "" {
		// The daemon of the named process (or the named daemon).
		t, err := findTarget(o)
		if err != nil {
			return err
		}
		daemonPID = t.r.Header().WriterPID
		t.close()
	}
	path, err := daemonSocket(o, daemonPID)
	if err != nil {
		return err
	}
	m, err := request(path, ctlproto.CodeSetLogLevel, ctlproto.LogLevel{Level: level})
	if err != nil {
		return ctlproto.AdminError("set bypassd's log level", err)
	}
	prev, ok := m.(*ctlproto.LogLevel)
	if !ok {
		return fmt.Errorf("set bypassd's log level: unexpected reply %T", m)
	}
	fmt.Fprintf(w, "bypassd log level: %s -> %s\n", ctlproto.LogLevelName(prev.Level), ctlproto.LogLevelName(level))
	return nil
}

// zeroStats serves -z: it asks the daemon that writes the target's file to
// zero it and waits until a publication shows the reset.
func zeroStats(o *options, t *target) error {
	h := t.r.Header()
	path, err := daemonSocket(o, h.WriterPID)
	if err != nil {
		return err
	}
	before, err := t.r.Read()
	if err != nil {
		return err
	}
	req := ctlproto.ZeroStats{PID: uint32(h.PID)}
	if t.isDaemon() {
		req = ctlproto.ZeroStats{Daemon: true}
	}
	if _, err := request(path, ctlproto.CodeZeroStats, req); err != nil {
		return ctlproto.AdminError(fmt.Sprintf("zero the counters of pid %d", h.PID), err)
	}
	wait := 10 * max(before.Header.Interval, 100*time.Millisecond)
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		s, err := t.r.Read()
		if err != nil {
			return err
		}
		if s.Header.Resets != before.Header.Resets {
			return nil
		}
	}
	return fmt.Errorf("zero the counters of pid %d: bypassd accepted but did not publish the reset within %v (is it overloaded?)", h.PID, wait)
}

// socketFilter selects socket ids (-s); empty selects all.
type socketFilter [][2]uint32

func parseSocketFilter(v string) (socketFilter, error) {
	var f socketFilter
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.ParseUint(lo, 10, 32)
		b := a
		if err == nil && isRange {
			b, err = strconv.ParseUint(hi, 10, 32)
		}
		if err != nil || b < a {
			return nil, fmt.Errorf("socket list %q: want ids and ranges such as 3,7-9", v)
		}
		f = append(f, [2]uint32{uint32(a), uint32(b)})
	}
	return f, nil
}

func (f socketFilter) match(id uint32) bool {
	if len(f) == 0 {
		return true
	}
	for _, r := range f {
		if id >= r[0] && id <= r[1] {
			return true
		}
	}
	return false
}
