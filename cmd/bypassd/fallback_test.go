package main

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/socket"
	"github.com/bypassd/bypassd/tap"
)

// TestKill9With100Flows: bypassd with the default auto fallback (XDP fast
// path, TAP path standing by with a filter per flow) is killed with SIGKILL
// while 100 sockets are bound. The kernel takes the XDP program and the TAP
// with the process; the flow filters stay on the NIC until the next start,
// which removes them. That daemon's own exit leaves no qdisc, filter, TAP or
// XDP program.
func TestKill9With100Flows(t *testing.T) {
	netlab.RequirePriv(t)
	lab := netlab.NewPair(t, netlab.Options{})
	dir := t.TempDir()
	sock := filepath.Join(dir, "ctl.sock")
	args := []string{"-i", lab.A.Name, "--socket", sock, "--run-dir", dir, "--stats-dir", filepath.Join(dir, "stats"),
		"--frames", "256", "--queue-bytes", "64K", "--rx-poll", "5"}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sh := func(name string, args ...string) string {
		t.Helper()
		out, err := lab.A.NS.Command(ctx, name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v: %s", name, args, err, out)
		}
		return string(out)
	}
	tapName := tap.DeviceName(lab.A.Index, 0)
	redirects := func() int {
		return strings.Count(sh("tc", "filter", "show", "dev", lab.A.Name, "ingress"), "mirred")
	}
	tapExists := func() bool {
		return lab.A.NS.Command(ctx, "ip", "link", "show", tapName).Run() == nil
	}

	d := startDaemon(t, lab.A.NS, args...)
	d.waitReady(t)
	c, err := socket.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := 0; i < 100; i++ {
		if _, err := c.ListenUDP("udp4", netip.AddrPortFrom(lab.A.Addr4(), 0)); err != nil {
			t.Fatalf("socket %d: %v", i, err)
		}
	}
	if got := redirects(); got != 100 {
		t.Fatalf("%d standby redirects with 100 sockets, want 100 (no fragment filter while XDP works)", got)
	}
	if !xdpAttached(t, lab.A.NS, lab.A.Name) || !tapExists() {
		t.Fatal("XDP program or TAP missing while the daemon runs")
	}
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	d.wait(t)
	if xdpAttached(t, lab.A.NS, lab.A.Name) || tapExists() {
		t.Error("the XDP program or the TAP outlived the killed daemon")
	}
	stale := redirects()
	t.Logf("left by the killed daemon: %d flow filters", stale)

	d = startDaemon(t, lab.A.NS, args...)
	d.waitReady(t)
	if got := redirects(); got != 0 {
		t.Errorf("after the restart: %d filters, want the dead daemon's %d removed:\n%s", got, stale,
			sh("tc", "filter", "show", "dev", lab.A.Name, "ingress"))
	}
	if !strings.Contains(d.log(), "dead daemon") {
		t.Errorf("the restarted daemon did not say it removed leftovers:\n%s", d.log())
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	if rc := d.wait(t); rc != 0 {
		t.Errorf("exit status %d:\n%s", rc, d.log())
	}
	if out := sh("tc", "qdisc", "show", "dev", lab.A.Name, "ingress"); strings.TrimSpace(out) != "" {
		t.Errorf("ingress qdisc left after a clean exit:\n%s", out)
	}
	if out := sh("tc", "filter", "show", "dev", lab.A.Name, "ingress"); strings.TrimSpace(out) != "" {
		t.Errorf("filters left after a clean exit:\n%s", out)
	}
	if xdpAttached(t, lab.A.NS, lab.A.Name) || tapExists() {
		t.Error("XDP program or TAP left after a clean exit")
	}
}
