package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/stats"
)

// target is the process being watched: its stats file and, when needed,
// the daemon's (rings, control socket).
type target struct {
	dir    string
	entry  stats.Entry
	r      *stats.Reader
	daemon *stats.Reader // the writer's file; nil until needed
}

func (t *target) isDaemon() bool { return t.entry.Kind == stats.KindDaemon }

func (t *target) close() {
	if t.r != nil {
		_ = t.r.Close()
	}
	if t.daemon != nil && t.daemon != t.r {
		_ = t.daemon.Close()
	}
}

// errNoDir explains a missing stats directory.
func dirError(dir string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("stats directory %s does not exist: is bypassd running? (give its --stats-dir with -S or %s)", dir, EnvStatsDir)
	}
	if errors.Is(err, fs.ErrPermission) {
		return fmt.Errorf("stats directory %s: permission denied: run as root or as a member of bypassd's group", dir)
	}
	return err
}

// findTarget picks the process -p or -n names, or the first live client
// (else the daemon) when neither is given.
func findTarget(o *options) (*target, error) {
	entries, err := stats.List(o.dir)
	if err != nil {
		return nil, dirError(o.dir, errors.Unwrap(err))
	}
	t := &target{dir: o.dir}
	switch {
	case o.pid != 0:
		// A process that is both (a daemon serving itself in-process)
		// shows its client file; -n bypassd shows the daemon's.
		for _, e := range append(clientsOf(entries), daemonsOf(entries)...) {
			if e.PID == o.pid {
				t.entry = e
				break
			}
		}
		if t.entry.PID == 0 {
			return nil, unknownPID(o.pid, o.dir, entries)
		}
		if t.r, err = stats.Open(t.entry.Path); err != nil {
			return nil, err
		}
	case o.name != "":
		for _, e := range append(clientsOf(entries), daemonsOf(entries)...) {
			r, err := stats.Open(e.Path)
			if err != nil {
				continue
			}
			h := r.Header()
			if nameMatches(o.name, h) && alive(h.PID) && r.WriterAlive() {
				t.entry, t.r = e, r
				break
			}
			_ = r.Close()
		}
		if t.r == nil {
			return nil, fmt.Errorf("no live bypassd client or daemon named %q in %s (running: %s)", o.name, o.dir, describe(entries))
		}
	default:
		// Clients first (List puts the daemons first), then the daemon.
		ordered := append(clientsOf(entries), daemonsOf(entries)...)
		for _, e := range ordered {
			r, err := stats.Open(e.Path)
			if err != nil {
				if errors.Is(err, fs.ErrPermission) {
					return nil, err
				}
				continue
			}
			if alive(e.PID) && r.WriterAlive() {
				t.entry, t.r = e, r
				break
			}
			_ = r.Close()
		}
		if t.r == nil {
			return nil, fmt.Errorf("no running bypassd (nor client of it) found in %s: start bypassd, or give its --stats-dir with -S", o.dir)
		}
	}
	if err := t.check(); err != nil {
		t.close()
		return nil, err
	}
	return t, nil
}

func clientsOf(es []stats.Entry) (out []stats.Entry) {
	for _, e := range es {
		if e.Kind == stats.KindClient {
			out = append(out, e)
		}
	}
	return out
}

func daemonsOf(es []stats.Entry) (out []stats.Entry) {
	for _, e := range es {
		if e.Kind == stats.KindDaemon {
			out = append(out, e)
		}
	}
	return out
}

// nameMatches compares NAME with the process's command (which the kernel
// cuts to 15 bytes) and the program name it gave bypassd.
func nameMatches(name string, h stats.Header) bool {
	if name == h.Program || name == h.Command {
		return true
	}
	return len(name) > 15 && h.Command != "" && name[:15] == h.Command
}

// unknownPID explains a pid without a stats file and lists what there is.
func unknownPID(pid int, dir string, entries []stats.Entry) error {
	why := "it has not connected to bypassd"
	if !alive(pid) {
		why = "no such process"
	}
	return fmt.Errorf("no stats file for pid %d in %s (%s); processes with stats: %s", pid, dir, why, describe(entries))
}

// describe lists the processes that have stats files, for error messages.
func describe(entries []stats.Entry) string {
	var parts []string
	for _, e := range entries {
		name := ""
		if r, err := stats.Open(e.Path); err == nil {
			h := r.Header()
			name = h.Command
			if name == "" {
				name = h.Program
			}
			_ = r.Close()
		}
		if e.Kind == stats.KindDaemon {
			name = "bypassd"
		}
		parts = append(parts, strconv.Itoa(e.PID)+" ("+name+")")
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

func alive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// check refuses a stale file: its process or its writer is gone.
func (t *target) check() error {
	h := t.r.Header()
	if !t.r.WriterAlive() {
		return fmt.Errorf("the stats file of pid %d is stale: bypassd (pid %d), which wrote it, is not running (a new bypassd removes such files)", h.PID, h.WriterPID)
	}
	if !alive(h.PID) {
		return fmt.Errorf("pid %d has ended (its stats file is left over and will be removed)", h.PID)
	}
	return nil
}

// read returns the current snapshot, or why there is none any more.
func (t *target) read() (*stats.Snapshot, error) {
	if _, err := os.Stat(t.entry.Path); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("pid %d is no longer a client of bypassd (its stats file is gone)", t.entry.PID)
	}
	if err := t.check(); err != nil {
		return nil, err
	}
	return t.r.Read()
}

// daemonFile returns the reader of the daemon that writes the target's
// file.
func (t *target) daemonFile() (*stats.Reader, error) {
	if t.isDaemon() {
		return t.r, nil
	}
	if t.daemon != nil {
		return t.daemon, nil
	}
	w := t.r.Header().WriterPID
	r, err := stats.Open(stats.DaemonPath(t.dir, w))
	if err != nil {
		return nil, fmt.Errorf("the daemon's own stats file (bypassd pid %d): %w", w, err)
	}
	t.daemon = r
	return r, nil
}

// clients reads every client file the target daemon writes (for the
// daemon's views 4 and 5).
func (t *target) clients() ([]*stats.Snapshot, error) { return t.readClients(stats.ReadFile) }

// clientSummaries reads the header and client block of every client file
// the target daemon writes, not their socket blocks.
func (t *target) clientSummaries() ([]*stats.Snapshot, error) {
	return t.readClients(func(path string) (*stats.Snapshot, error) {
		r, err := stats.Open(path)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		return r.ReadSummary()
	})
}

func (t *target) readClients(read func(string) (*stats.Snapshot, error)) ([]*stats.Snapshot, error) {
	entries, err := stats.List(t.dir)
	if err != nil {
		return nil, err
	}
	var out []*stats.Snapshot
	for _, e := range clientsOf(entries) {
		s, err := read(e.Path)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				continue // the client left meanwhile
			}
			return nil, err
		}
		if s.Header.WriterPID == t.entry.PID {
			out = append(out, s)
		}
	}
	return out, nil
}
