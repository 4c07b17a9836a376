package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
)

// On veth the receiving side's kernel work runs on the sending CPU unless
// the receiver's NAPI is threaded: then it runs in a kthread we can pin. The
// "split" placement pins senders to one CPU and the receiving side (its NAPI
// thread and application) to the other, as with two hosts joined by a wire.

// threadedNAPI turns on GRO (so veth has a NAPI instance even without XDP)
// and threaded NAPI on l's interface.
func threadedNAPI(l *netlab.Link) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	script := fmt.Sprintf("ethtool -K %[1]s gro on >/dev/null && echo 1 > /sys/class/net/%[1]s/threaded", l.Name)
	if out, err := l.NS.Command(ctx, "sh", "-c", script).CombinedOutput(); err != nil {
		return fmt.Errorf("threaded NAPI on %s: %v: %s", l.Name, err, out)
	}
	return nil
}

// pinNAPI pins the NAPI kthreads of l's interface to cpu.
func pinNAPI(l *netlab.Link, cpu int) error {
	comms, _ := filepath.Glob("/proc/[0-9]*/comm")
	found := false
	for _, c := range comms {
		b, err := os.ReadFile(c)
		if err != nil || !strings.HasPrefix(string(b), "napi/"+l.Name+"-") {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(c)))
		var set unix.CPUSet
		set.Set(cpu)
		if err := unix.SchedSetaffinity(pid, &set); err != nil {
			return fmt.Errorf("pin %s: %w", strings.TrimSpace(string(b)), err)
		}
		found = true
		if os.Getenv("RB_DEBUG") != "" {
			fmt.Fprintf(os.Stderr, "pinned %s (pid %d) to CPU %d\n", strings.TrimSpace(string(b)), pid, cpu)
		}
	}
	if !found {
		return fmt.Errorf("no NAPI thread for %s", l.Name)
	}
	return nil
}

// pinSelf pins the calling OS thread (locked by the caller) to cpu; a
// negative cpu leaves it alone.
func pinSelf(cpu int) error {
	if cpu < 0 {
		return nil
	}
	var set unix.CPUSet
	set.Set(cpu)
	return unix.SchedSetaffinity(0, &set)
}
