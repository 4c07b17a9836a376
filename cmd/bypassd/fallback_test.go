package main

import (
	"context"
	"fmt"
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
// XDP program. With 4 queues the daemon runs 4 rings, each with its TAP,
// and the 100 sockets spread over them: the same holds for every ring.
func TestKill9With100Flows(t *testing.T) {
	for _, queues := range []int{1, 4} {
		t.Run(fmt.Sprintf("%d queues", queues), func(t *testing.T) { kill9With100Flows(t, queues) })
	}
}

func kill9With100Flows(t *testing.T, queues int) {
	netlab.RequirePriv(t)
	lab := netlab.NewPair(t, netlab.Options{RxQueues: queues, TxQueues: queues})
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
	redirects := func() int {
		return strings.Count(sh("tc", "filter", "show", "dev", lab.A.Name, "ingress"), "mirred")
	}
	// taps counts the rings' TAP devices.
	taps := func() int {
		n := 0
		for q := range queues {
			if lab.A.NS.Command(ctx, "ip", "link", "show", tap.DeviceName(lab.A.Index, q)).Run() == nil {
				n++
			}
		}
		return n
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
	if !xdpAttached(t, lab.A.NS, lab.A.Name) || taps() != queues {
		t.Fatalf("XDP program or TAPs missing while the daemon runs (%d TAPs, want one per queue: %d)", taps(), queues)
	}
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	d.wait(t)
	if xdpAttached(t, lab.A.NS, lab.A.Name) || taps() != 0 {
		t.Error("the XDP program or a TAP outlived the killed daemon")
	}
	stale := redirects()
	t.Logf("left by the killed daemon: %d flow filters", stale)

	d = startDaemon(t, lab.A.NS, args...)
	d.waitReady(t)
	if got := redirects(); got != 0 {
		t.Errorf("after the restart: %d filters, want the dead daemon's %d removed:\n%s", got, stale,
			sh("tc", "filter", "show", "dev", lab.A.Name, "ingress"))
	}
	if !d.logged("dead daemon", 10*time.Second) {
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
	if xdpAttached(t, lab.A.NS, lab.A.Name) || taps() != 0 {
		t.Error("XDP program or TAP left after a clean exit")
	}
}
