package daemon

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/stats"
	"github.com/bypassd/bypassd/tap"
)

// TestTAPFiltersFollowSockets: with the TAP path forced, `tc filter show`
// on the interface lists one redirect per bound socket plus one fragment
// filter per address while the sockets are open, and nothing once their
// client is gone; the daemon's exit removes the qdisc and the TAP.
func TestTAPFiltersFollowSockets(t *testing.T) {
	t.Parallel()
	l := newLab(t, config.Config{Fallback: "tap"})
	tcShow := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := l.p.A.NS.Command(ctx, "tc", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("tc %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	tapName := tap.DeviceName(l.p.A.Index, 0)
	redirects := func() int {
		return strings.Count(tcShow("filter", "show", "dev", l.p.A.Name, "ingress"), "Egress Redirect to device "+tapName)
	}
	c := helloClient(t, l)
	want := map[string]bool{}
	for i := 0; i < 3; i++ {
		s := openSocket(t, c, unix.AF_INET)
		local, err := c.bind(s, netip.AddrPortFrom(l.p.A.Addr4(), 0), false)
		if err != nil {
			t.Fatal(err)
		}
		want[local.String()] = true
	}
	s6 := openSocket(t, c, unix.AF_INET6)
	local6, err := c.bind(s6, netip.AddrPortFrom(l.p.A.Addr6(), 0), false)
	if err != nil {
		t.Fatal(err)
	}
	want[local6.String()] = true
	if got := l.flows(t); len(got) != len(want) {
		t.Errorf("ring flows %v, want %v", got, want)
	} else {
		for k := range want {
			if !got[k] {
				t.Errorf("flow %s missing from %v", k, got)
			}
		}
	}
	if got := redirects(); got != len(want)+2 {
		t.Errorf("%d redirects to %s, want %d (one per socket, one fragment filter per address):\n%s",
			got, tapName, len(want)+2, tcShow("filter", "show", "dev", l.p.A.Name, "ingress"))
	}
	var c3 stats.RingCounters
	fallbackCounters(l.d.Rings()[0], &c3)
	if c3[stats.RingTAPFallback] != 2 || c3[stats.RingTAPActive] != 1 || c3[stats.RingTAPFD] == 0 ||
		c3[stats.RingTAPIfindex] == 0 || c3[stats.RingVFPlugouts] != 0 {
		t.Errorf("TAP counters of a forced TAP ring: %v", c3[stats.RingTAPFallback:stats.RingTAPTXDropped+1])
	}
	// The client goes away: its sockets' filters go with it.
	_ = c.c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for strings.TrimSpace(tcShow("filter", "show", "dev", l.p.A.Name, "ingress")) != "" {
		if time.Now().After(deadline) {
			t.Fatalf("filters left 5 s after the client left:\n%s", tcShow("filter", "show", "dev", l.p.A.Name, "ingress"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := l.stop(); err != nil {
		t.Fatal(err)
	}
	if err := l.d.Close(); err != nil {
		t.Fatal(err)
	}
	if out := tcShow("qdisc", "show", "dev", l.p.A.Name, "ingress"); strings.TrimSpace(out) != "" {
		t.Errorf("ingress qdisc left after the daemon stopped:\n%s", out)
	}
	if out, err := l.p.A.NS.Command(context.Background(), "ip", "link", "show", tapName).CombinedOutput(); err == nil {
		t.Errorf("TAP %s left after the daemon stopped:\n%s", tapName, out)
	}
}
