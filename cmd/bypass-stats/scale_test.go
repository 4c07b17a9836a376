package main

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bypassd/bypassd/stats"
)

// manyFiles writes a stats directory as a daemon with 100,000 sockets
// leaves it: the daemon's file and this process's client file (both named
// after this process, which is alive), whose sockets fill all
// stats.MaxSocketSlots blocks, plus client files of 1,000 sockets each for
// made-up pids up to 100,000 sockets in all (tools read those without
// checking that the pid is alive). In our file, socket i (id i+1) has
// sent i datagrams.
func manyFiles(t *testing.T) (dir string, total int) {
	t.Helper()
	dir = t.TempDir()
	pid := os.Getpid()
	dw, err := stats.Create(stats.DaemonPath(dir, pid), stats.FileSpec{Kind: stats.KindDaemon, PID: pid, Program: "bypassd", Started: time.Now(), RingSlots: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dw.Close() })
	if err := dw.Publish(&stats.Snapshot{Daemon: &stats.Daemon{Version: "test", SocketPath: "/nonexistent"},
		Rings: []stats.Ring{{Index: 0, Interface: "eth9", Provider: "afxdp", Mode: "native/copy"}}}); err != nil {
		t.Fatal(err)
	}
	client := func(pid, n int, name string) {
		w, err := stats.Create(stats.ClientPath(dir, pid), stats.FileSpec{Kind: stats.KindClient, PID: pid, Command: name, Program: name,
			Started: time.Now(), SocketSlots: n})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Close() })
		socks := make([]stats.Socket, n)
		c := &stats.Client{Sockets: n, MaxSockets: n}
		for i := range socks {
			s := &socks[i]
			s.ID = uint32(pid%1000*100000 + i + 1)
			s.Flags = stats.SocketBound
			s.Family = 2
			s.Local = netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 9, byte(i >> 16), byte(i >> 8)}), uint16(i))
			s.QueueBytes = 4096
			s.Counters[stats.SockTXPackets] = uint64(i)
			c.Totals[stats.SockTXPackets] += uint64(i)
		}
		if pid == os.Getpid() {
			for i := range socks {
				socks[i].ID = uint32(i + 1)
			}
		}
		if err := w.Publish(&stats.Snapshot{Header: stats.Header{SocketsTotal: n}, Client: c, Sockets: socks}); err != nil {
			t.Fatal(err)
		}
		total += n
	}
	client(pid, stats.MaxSocketSlots, "many")
	for i := 0; total < 100_000; i++ {
		client(4_000_001+i, min(1000, 100_000-total), fmt.Sprintf("idle%d", i))
	}
	return dir, total
}

// timedRun runs bypass-stats with args and returns its output and the
// processor time it took (user and system: on a loaded machine the wall
// time says more about the other processes); it fails the test on a
// non-zero exit.
func timedRun(t *testing.T, args ...string) (string, time.Duration) {
	t.Helper()
	var out, errb bytes.Buffer
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	start := cpu()
	if rc := run(context.Background(), args, func(string) string { return "" }, &out, &errb); rc != 0 {
		t.Fatalf("bypass-stats %s: exit %d: %s", strings.Join(args, " "), rc, errb.String())
	}
	return out.String(), cpu() - start
}

// TestManySockets: with 100,000 sockets in the stats directory (65,536 in
// one process), bypass-stats answers in well under a second of processor
// time: by default a summary (the 20 most active sockets, the totals),
// pages of --limit sockets on request, and the daemon's view with a line
// per client read from the files' summary blocks. The bound asserted is
// generous (the race detector); the times are logged.
func TestManySockets(t *testing.T) {
	dir, total := manyFiles(t)
	pid := fmt.Sprint(os.Getpid())
	const bound = 10 * time.Second
	check := func(what string, d time.Duration) {
		t.Logf("%s: %v", what, d)
		if d > bound {
			t.Errorf("%s took %v (more than %v)", what, d, bound)
		}
	}

	out, d := timedRun(t, "-S", dir, "-p", pid, "-c", "1")
	check("summary of 65,536 sockets", d)
	ids := socketIDs(out)
	if len(ids) != autoTop || ids[0] != stats.MaxSocketSlots || ids[autoTop-1] != stats.MaxSocketSlots-autoTop+1 {
		t.Errorf("summary lists sockets %v, want the %d most active, %d down", ids, autoTop, stats.MaxSocketSlots)
	}
	if !strings.Contains(out, "Shown: the 20 most active of 65536 sockets") || !strings.Contains(out, "Totals (closed sockets included)") {
		t.Errorf("summary without its note or totals:\n%s", out)
	}

	out, d = timedRun(t, "-S", dir, "-p", pid, "-c", "1", "--limit", "10", "--page", "3")
	check("page 3 of 10 sockets", d)
	if ids := socketIDs(out); fmt.Sprint(ids) != "[21 22 23 24 25 26 27 28 29 30]" || !strings.Contains(out, "sockets 21-30 of 65536 (page 3 of 6554)") {
		t.Errorf("page 3 of 10: sockets %v:\n%s", ids, out)
	}
	out, _ = timedRun(t, "-S", dir, "-p", pid, "-c", "1", "--limit", "5", "--sort", "activity", "-v", "5")
	if n := strings.Count(out, "10.9."); n != 5 || !strings.Contains(out, "sockets 1-5 of 65536") {
		t.Errorf("view 5, 5 most active: %d lines:\n%s", n, out)
	}
	out, _ = timedRun(t, "-S", dir, "-p", pid, "-c", "1", "-s", "7,9")
	if ids := socketIDs(out); fmt.Sprint(ids) != "[7 9]" || strings.Contains(out, "Shown:") {
		t.Errorf("-s 7,9: sockets %v:\n%s", ids, out)
	}
	out, _ = timedRun(t, "-S", dir, "-p", pid, "-c", "1", "--limit", "10", "--page", "7000")
	if !strings.Contains(out, "page 7000 of 6554 is empty") {
		t.Errorf("a page past the end:\n%s", out)
	}

	out, d = timedRun(t, "-S", dir, "-n", "bypassd", "-c", "1")
	check(fmt.Sprintf("the daemon's view, %d sockets in %d clients", total, 1+(total-stats.MaxSocketSlots+999)/1000), d)
	if !strings.Contains(out, pid+" many") || !strings.Contains(out, "4000001 idle0") {
		t.Errorf("the daemon's view lacks its clients:\n%s", out)
	}
	out, d = timedRun(t, "-S", dir, "-n", "bypassd", "-c", "1", "-v", "5")
	check(fmt.Sprintf("netstat view over %d sockets", total), d)
	if n := strings.Count(out, "udp "); n != autoTop || !strings.Contains(out, fmt.Sprintf("the 20 most active of %d sockets", total)) {
		t.Errorf("netstat view over %d sockets: %d lines:\n%s", total, n, out)
	}
	out, d = timedRun(t, "-S", dir, "-n", "bypassd", "-c", "1", "-v", "5", "--all")
	t.Logf("netstat view of all %d sockets: %v", total, d)
	if n := strings.Count(out, "udp "); n != total {
		t.Errorf("--all: %d lines for %d sockets", n, total)
	}
}

// socketIDs returns the socket ids of view 1's "<id> Rx:" lines.
func socketIDs(out string) []int {
	var ids []int
	for _, line := range strings.Split(out, "\n") {
		var id int
		if _, err := fmt.Sscanf(line, "%d Rx:", &id); err == nil && strings.Contains(line, "Rx:") {
			ids = append(ids, id)
		}
	}
	return ids
}

// TestPagingOptions: the options that cut long lists are checked.
func TestPagingOptions(t *testing.T) {
	for _, args := range [][]string{
		{"--limit", "0"}, {"--page", "-1"}, {"--sort", "size"}, {"--all", "--limit", "5"},
	} {
		var out, errb bytes.Buffer
		if rc := run(context.Background(), args, func(string) string { return "" }, &out, &errb); rc != 2 {
			t.Errorf("%v: exit %d, want 2 (usage): %s", args, rc, errb.String())
		}
	}
}
