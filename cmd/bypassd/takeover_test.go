package main

import (
	"encoding/json"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/socket"
)

// TestTakeoverProcesses: bypassd --takeover replaces a running bypassd
// process whose client keeps its socket; then SIGHUP makes that daemon
// start the binary at its path, which takes over in turn. After each, the
// old process exits 0 and the client's socket sends and receives.
func TestTakeoverProcesses(t *testing.T) {
	netlab.RequirePriv(t)
	lab := netlab.NewPair(t, netlab.Options{})
	dir := t.TempDir()
	sock := filepath.Join(dir, "ctl.sock")
	args := []string{"-i", lab.A.Name, "--socket", sock, "--run-dir", dir, "--stats-dir", filepath.Join(dir, "stats"),
		"--frames", "256", "--queue-bytes", "64K", "--rx-poll", "5"}
	old := startDaemon(t, lab.A.NS, args...)
	old.waitReady(t)
	c, err := socket.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	u, err := c.ListenUDP("udp4", netip.AddrPortFrom(lab.A.Addr4(), 0))
	if err != nil {
		t.Fatal(err)
	}
	local := u.LocalAddr().(*net.UDPAddr).AddrPort()
	peer := lab.B.NS.ListenUDP(t, netip.AddrPortFrom(lab.B.Addr4(), 0))
	peerAddr := peer.LocalAddr().(*net.UDPAddr).AddrPort()
	// exchange checks both directions through the accelerated socket.
	exchange := func(what string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		if _, err := peer.WriteToUDPAddrPort([]byte(what), local); err != nil {
			t.Fatal(err)
		}
		_ = u.SetReadDeadline(deadline)
		b := make([]byte, 64)
		n, _, err := u.ReadFromUDPAddrPort(b)
		if err != nil || string(b[:n]) != what {
			t.Fatalf("%s: client received %q, %v", what, b[:n], err)
		}
		if _, err := u.WriteToUDPAddrPort([]byte(what+" back"), peerAddr); err != nil {
			t.Fatalf("%s: client send: %v", what, err)
		}
		_ = peer.SetReadDeadline(deadline)
		if n, _, err = peer.ReadFromUDPAddrPort(b); err != nil || string(b[:n]) != what+" back" {
			t.Fatalf("%s: peer received %q, %v", what, b[:n], err)
		}
	}
	exchange("before")

	next := startDaemon(t, lab.A.NS, append(args, "--takeover")...)
	next.waitReady(t)
	if rc := old.wait(t); rc != 0 {
		t.Fatalf("the old daemon exited %d:\n%s", rc, old.log())
	}
	if !old.logged("handed over to the new daemon", 10*time.Second) || !next.logged(`"took over"`, 10*time.Second) {
		t.Errorf("handover not logged:\nold:\n%s\nnew:\n%s", old.log(), next.log())
	}
	exchange("after --takeover")

	// SIGHUP: the daemon starts its own successor (the test binary, which
	// runs bypassd's main), which takes over; the daemon exits 0.
	if err := next.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if rc := next.wait(t); rc != 0 {
		t.Fatalf("the reloaded daemon exited %d:\n%s", rc, next.log())
	}
	succ := successorPID(t, next.log())
	t.Cleanup(func() { _ = syscall.Kill(succ, syscall.SIGTERM) })
	if !next.logged("handed over to the new daemon", 10*time.Second) {
		t.Fatalf("SIGHUP did not hand over:\n%s", next.log())
	}
	exchange("after SIGHUP")
	if u2, err := c.ListenUDP("udp4", netip.AddrPortFrom(lab.A.Addr4(), 0)); err != nil {
		t.Errorf("a new socket after two upgrades: %v", err)
	} else {
		_ = u2.Close()
	}
	// The successor stops like any daemon: XDP detached, socket removed.
	if err := syscall.Kill(succ, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(20 * time.Second); syscall.Kill(succ, 0) == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the successor (pid %d) did not exit on SIGTERM", succ)
		}
	}
	if xdpAttached(t, lab.A.NS, lab.A.Name) {
		t.Error("XDP program attached after the successor stopped")
	}
}

// successorPID finds the pid the reload log line names.
func successorPID(t *testing.T, log string) int {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		var e struct {
			Msg    string
			NewPID int `json:"new_pid"`
		}
		if json.Unmarshal([]byte(line), &e) == nil && strings.HasPrefix(e.Msg, "reload: started") {
			return e.NewPID
		}
	}
	t.Fatalf("no successor in the log:\n%s", log)
	return 0
}
